// fake-nsqd's private state (fake_nsqd.hpp is the double's interface): topics, channels, clients and the
// server behind fake_nsqd, whose member functions live in nsqd_queue.cpp (delivery, timeouts, RDY
// assertions), nsqd_conn.cpp (a client's connection: reading, writing, heartbeats), nsqd_commands.cpp (the
// TCP protocol's commands) and fake_nsqd.cpp (the HTTP API and /stats).
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/log.hpp"
#include "fake_nsqd.hpp"
#include "http/proto/message.hpp"
#include "http/server.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"

namespace cg::test::nsq {
namespace nsqd_detail {

using sclock = std::chrono::steady_clock;
inline constexpr auto forever = sclock::time_point::max();

struct msg {
    std::string id;
    std::string body;
    std::int64_t ts = 0;
    std::uint16_t attempts = 0;
};

struct client;
struct chan_t;

struct in_flight_entry {
    msg m;
    client* owner = nullptr;
    sclock::time_point deadline, delivered;
};

struct chan_t {
    std::string name;
    std::deque<msg> queue;
    std::unordered_map<std::string, in_flight_entry> in_flight;
    std::multimap<sclock::time_point, msg> deferred;
    std::vector<client*> clients;
    std::size_t rr = 0;
    bool paused = false;
    std::uint64_t message_count = 0, requeue_count = 0, timeout_count = 0, finish_count = 0;
    bool ephemeral() const { return name.size() > 10 && name.ends_with("#ephemeral"); }
};

struct topic {
    std::string name;
    std::map<std::string, std::unique_ptr<chan_t>> channels;
    std::deque<msg> backlog;  // published while the topic had no channel (or was paused)
    std::uint64_t message_count = 0, message_bytes = 0;
    bool paused = false;
};

enum class cstate { init, subscribed, closing };

struct client_error {
    std::string text;  // "E_CODE description"
    bool fatal = true;
};

struct client : std::enable_shared_from_this<client> {
    client(asio::any_io_executor ex, fake_nsqd::impl* s, std::uint64_t i)
        : srv(s), id(i), sock(ex), wake(ex, forever), hb_timer(ex) {}
    fake_nsqd::impl* srv;
    std::uint64_t id;
    net::tcp_socket sock;
    std::string rbuf;
    std::size_t rpos = 0;
    cstate state = cstate::init;
    milliseconds hb{0}, msg_timeout{0};
    std::int64_t output_buffer_size = 16384, output_buffer_timeout = 250, sample_rate = 0;
    std::string client_id, hostname, user_agent, remote;
    const fake_auth_identity* auth = nullptr;  // after a successful AUTH
    topic* tp = nullptr;
    chan_t* ch = nullptr;
    std::int64_t rdy = 0, in_flight = 0;
    std::uint64_t message_count = 0, finish_count = 0, requeue_count = 0;
    std::string out, sending;
    net::steady_timer wake, hb_timer;
    bool writer_waiting = false, closed = false, close_after_flush = false;
    std::int64_t connect_ts = 0;

    bool ready() const { return state == cstate::subscribed && !closed && rdy > 0 && in_flight < rdy; }
    void notify() {
        if (writer_waiting) wake.cancel();
    }
};

inline std::string json_escape(std::string_view s) {
    std::string out;
    append_json_string(out, s);
    return out;
}

inline std::int64_t unix_now() {
    using namespace std::chrono;
    return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}
inline std::int64_t unix_now_ns() {
    using namespace std::chrono;
    return duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
}

// nsqd's and nsqlookupd's HTTP error body and their plain OK.
inline http::response json_error(int status, std::string_view message) {
    auto r = http::make_response(status, "{\"message\":\"" + std::string(message) + "\"}",
                                 "application/json; charset=utf-8");
    r.headers.add("X-Nsq-Content-Type", "nsq; version=1.0");
    return r;
}

inline http::response ok_text() {
    return http::make_response(200, "OK");
}

using exec_result = std::optional<client_error>;

}  // namespace nsqd_detail

struct fake_nsqd::impl : std::enable_shared_from_this<fake_nsqd::impl> {
    using msg = nsqd_detail::msg;
    using client = nsqd_detail::client;
    using chan_t = nsqd_detail::chan_t;
    using topic = nsqd_detail::topic;
    using in_flight_entry = nsqd_detail::in_flight_entry;
    using client_error = nsqd_detail::client_error;
    using exec_result = nsqd_detail::exec_result;
    using sclock = nsqd_detail::sclock;

    impl(asio::any_io_executor e, fake_nsqd_options o, logger l)
        : ex(e), opts(std::move(o)), log(std::move(l)), acceptor(e), scan_timer(e) {}

    asio::any_io_executor ex;
    fake_nsqd_options opts;
    logger log;
    net::tcp_acceptor acceptor;
    std::unique_ptr<http::server> http;
    net::steady_timer scan_timer;
    bool stopped = false, frozen = false, record = false;
    milliseconds latency{0};
    std::map<std::string, std::unique_ptr<topic>> topics;
    std::set<std::shared_ptr<client>> clients;
    std::uint64_t next_client_id = 1, next_msg_id = 1, total_connections = 0, heartbeat_disconnects = 0;
    std::vector<std::string> fatal_log, commands;
    std::uint64_t violations = 0;
    std::int64_t peak_rdy = 0;
    std::int64_t start_time = nsqd_detail::unix_now();

    // --- topics and channels ------------------------------------------------------------------------
    topic& get_topic(const std::string& name);
    chan_t& get_channel(topic& t, const std::string& name);
    std::string new_id();
    void put(topic& t, std::string body, milliseconds defer = milliseconds(0));
    void flush_backlog(topic& t);
    // Sends queued messages to clients that can take them, round-robin.
    void pump(chan_t& c);
    void deliver(chan_t& c, client& cl, msg m);
    void requeue_now(chan_t& c, msg m) { c.queue.push_back(std::move(m)); }

    // Timeouts and deferred messages (nsqd's queueScanLoop).
    void scan();
    static asio::awaitable<void> scan_loop(std::shared_ptr<impl> self);

    // --- RDY assertions ------------------------------------------------------------------------------
    void check_rdy(client& cl);

    // --- client lifecycle ---------------------------------------------------------------------------
    void remove_client(client& cl);
    void close_client(client& cl);

    // --- reading ------------------------------------------------------------------------------------
    // Fills the buffer until `n` bytes are available past rpos; false on EOF/error/deadline.
    static asio::awaitable<int> fill(client& cl, std::size_t n, sclock::time_point deadline);
    // Reads one command line (ReadSlice('\n') on a 16 KiB buffer). 0 ok, 1 deadline, 2 closed/too long.
    static asio::awaitable<int> read_line(client& cl, std::string& line, sclock::time_point deadline);
    static asio::awaitable<std::optional<std::string>> read_exact(client& cl, std::size_t n,
                                                                  sclock::time_point deadline);
    static asio::awaitable<std::optional<std::int32_t>> read_len(client& cl, sclock::time_point deadline);

    // --- the client coroutines ----------------------------------------------------------------------
    static asio::awaitable<void> writer(std::shared_ptr<impl> self, std::shared_ptr<client> cl);
    // nsqd's messagePump heartbeat ticker: every interval, whatever else is sent.
    static asio::awaitable<void> heartbeats(std::shared_ptr<impl> self, std::shared_ptr<client> cl);
    void send_response(client& cl, std::string_view data);
    static asio::awaitable<void> serve(std::shared_ptr<impl> self, std::shared_ptr<client> cl);

    static client_error fatal(std::string code, std::string text) { return {code + " " + text, true}; }
    static client_error nonfatal(std::string code, std::string text) { return {code + " " + text, false}; }

    asio::awaitable<exec_result> exec(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl);
    asio::awaitable<exec_result> identify(client& cl, const std::vector<std::string_view>&,
                                          sclock::time_point dl);
    exec_result sub(client& cl, const std::vector<std::string_view>& p);
    exec_result rdy(client& cl, const std::vector<std::string_view>& p);
    // Validates state and id for FIN/REQ/TOUCH; returns the entry or an error.
    std::variant<in_flight_entry*, client_error> in_flight_for(client& cl,
                                                               const std::vector<std::string_view>& p,
                                                               std::string_view cmd, std::size_t nparams,
                                                               std::string_view failed_code);
    exec_result fin(client& cl, const std::vector<std::string_view>& p);
    exec_result req(client& cl, const std::vector<std::string_view>& p);
    exec_result touch(client& cl, const std::vector<std::string_view>& p);
    exec_result cls(client& cl);
    // Reads [size][body] for PUB/DPUB with nsqd's checks and wording.
    asio::awaitable<std::variant<std::string, client_error>> read_msg_body(client& cl, std::string_view cmd,
                                                                           sclock::time_point dl);
    asio::awaitable<exec_result> pub(client& cl, const std::vector<std::string_view>& p,
                                     sclock::time_point dl);
    asio::awaitable<exec_result> dpub(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl);
    asio::awaitable<exec_result> mpub(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl);
    asio::awaitable<exec_result> auth(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl);
    // nsqd's CheckAuth, without the authorizations themselves (see fake_nsqd_options::auth_secrets).
    exec_result check_auth(const client& cl, std::string_view cmd) const;
    static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self);
    std::string stats(const std::string& tf, const std::string& cf) const;
};

}  // namespace cg::test::nsq
