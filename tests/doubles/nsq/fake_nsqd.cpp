#include "fake_nsqd.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <deque>
#include <set>
#include <unordered_map>

#include "core/bytes.hpp"
#include "http/server.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/proto/message.hpp"
#include "nsq/proto/server_codec.hpp"

namespace cg::test::nsq {

namespace proto = cg::nsq::proto;
using namespace std::chrono;
using sclock = steady_clock;
constexpr auto forever = sclock::time_point::max();

void rdy_ledger::set(const void* client, std::int64_t rdy) {
    auto& cur = per_client[client];
    total += rdy - cur;
    cur = rdy;
    peak = std::max(peak, total);
    if (limit > 0 && total > limit) ++violations;
}

namespace {

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

std::string json_escape(std::string_view s) {
    std::string out;
    append_json_string(out, s);
    return out;
}

std::int64_t unix_now() {
    return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}
std::int64_t unix_now_ns() {
    return duration_cast<nanoseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct fake_nsqd::impl : std::enable_shared_from_this<fake_nsqd::impl> {
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
    std::int64_t start_time = unix_now();

    // --- topics and channels ------------------------------------------------------------------------
    topic& get_topic(const std::string& name) {
        auto& t = topics[name];
        if (!t) {
            t = std::make_unique<topic>();
            t->name = name;
        }
        return *t;
    }

    chan_t& get_channel(topic& t, const std::string& name) {
        auto& c = t.channels[name];
        if (!c) {
            c = std::make_unique<chan_t>();
            c->name = name;
            flush_backlog(t);
        }
        return *c;
    }

    std::string new_id() {
        // nsqd's ids are 16 hex characters.
        char buf[17];
        std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(next_msg_id++));
        return buf;
    }

    void put(topic& t, std::string body, milliseconds defer = milliseconds(0)) {
        msg m{new_id(), std::move(body), unix_now_ns(), 0};
        ++t.message_count;
        t.message_bytes += m.body.size();
        if (t.channels.empty() || t.paused) {
            t.backlog.push_back(std::move(m));
            return;
        }
        for (auto& [n, c] : t.channels) {
            ++c->message_count;
            if (defer > milliseconds(0)) {
                c->deferred.emplace(sclock::now() + defer, m);
            } else {
                c->queue.push_back(m);
                pump(*c);
            }
        }
    }

    void flush_backlog(topic& t) {
        if (t.channels.empty() || t.paused) return;
        while (!t.backlog.empty()) {
            for (auto& [n, c] : t.channels) {
                ++c->message_count;
                c->queue.push_back(t.backlog.front());
            }
            t.backlog.pop_front();
        }
        for (auto& [n, c] : t.channels) pump(*c);
    }

    // Sends queued messages to clients that can take them, round-robin.
    void pump(chan_t& c) {
        if (c.paused || c.clients.empty()) return;
        while (!c.queue.empty()) {
            client* target = nullptr;
            for (std::size_t step = 0; step < c.clients.size(); ++step) {
                auto* cl = c.clients[(c.rr + step) % c.clients.size()];
                if (cl->ready()) {
                    target = cl;
                    c.rr = (c.rr + step + 1) % c.clients.size();
                    break;
                }
            }
            if (!target) return;
            deliver(c, *target, std::move(c.queue.front()));
            c.queue.pop_front();
        }
    }

    void deliver(chan_t& c, client& cl, msg m) {
        ++m.attempts;
        auto now = sclock::now();
        proto::append_message_frame(cl.out, m.ts, m.attempts, m.id, m.body);
        ++cl.in_flight;
        ++cl.message_count;
        auto id = m.id;
        c.in_flight[id] = in_flight_entry{std::move(m), &cl, now + cl.msg_timeout, now};
        cl.notify();
    }

    void requeue_now(chan_t& c, msg m) { c.queue.push_back(std::move(m)); }

    // Timeouts and deferred messages (nsqd's queueScanLoop).
    void scan() {
        auto now = sclock::now();
        for (auto& [tn, t] : topics) {
            for (auto& [cn, c] : t->channels) {
                for (auto it = c->in_flight.begin(); it != c->in_flight.end();) {
                    if (it->second.deadline <= now) {
                        if (it->second.owner) --it->second.owner->in_flight;
                        ++c->timeout_count;
                        requeue_now(*c, std::move(it->second.m));
                        it = c->in_flight.erase(it);
                    } else {
                        ++it;
                    }
                }
                while (!c->deferred.empty() && c->deferred.begin()->first <= now) {
                    requeue_now(*c, std::move(c->deferred.begin()->second));
                    c->deferred.erase(c->deferred.begin());
                }
                pump(*c);
            }
        }
    }

    static asio::awaitable<void> scan_loop(std::shared_ptr<impl> self) {
        while (!self->stopped) {
            self->scan_timer.expires_after(self->opts.queue_scan_interval);
            auto [ec] = co_await self->scan_timer.async_wait();
            if (ec || self->stopped) co_return;
            self->scan();
        }
    }

    // --- RDY assertions ------------------------------------------------------------------------------
    void check_rdy(client& cl) {
        if (opts.ledger) opts.ledger->set(&cl, cl.state == cstate::subscribed ? cl.rdy : 0);
        if (!cl.ch) return;
        std::int64_t sum = 0;
        for (auto* o : cl.ch->clients) sum += o->state == cstate::subscribed ? o->rdy : 0;
        peak_rdy = std::max(peak_rdy, sum);
        if (opts.max_channel_rdy > 0 && sum > opts.max_channel_rdy) {
            ++violations;
            log.error("fake-nsqd: sum of RDY over the channel exceeds the limit",
                      {{"sum", sum}, {"limit", opts.max_channel_rdy}});
        }
    }

    // --- client lifecycle ---------------------------------------------------------------------------
    void remove_client(client& cl) {
        if (opts.ledger) opts.ledger->remove(&cl);
        if (!cl.ch) return;
        auto& c = *cl.ch;
        std::erase(c.clients, &cl);
        for (auto it = c.in_flight.begin(); it != c.in_flight.end();) {
            if (it->second.owner != &cl) {
                ++it;
                continue;
            }
            if (opts.requeue_on_disconnect) {
                requeue_now(c, std::move(it->second.m));
                it = c.in_flight.erase(it);
            } else {
                it->second.owner = nullptr;  // times out later, as in nsqd
                ++it;
            }
        }
        cl.ch = nullptr;
        if (c.ephemeral() && c.clients.empty() && cl.tp) {
            cl.tp->channels.erase(c.name);
        } else {
            pump(c);
        }
    }

    void close_client(client& cl) {
        if (cl.closed) return;
        cl.closed = true;
        std::error_code ignored;
        cl.sock.shutdown(net::tcp::socket::shutdown_both, ignored);
        cl.sock.close(ignored);
        cl.wake.cancel();
        cl.hb_timer.cancel();
    }

    // --- reading ------------------------------------------------------------------------------------
    // Fills the buffer until `n` bytes are available past rpos; false on EOF/error/deadline.
    static asio::awaitable<int> fill(client& cl, std::size_t n, sclock::time_point deadline) {
        while (cl.rbuf.size() - cl.rpos < n) {
            if (cl.rpos > 0 && cl.rpos == cl.rbuf.size()) {
                cl.rbuf.clear();
                cl.rpos = 0;
            }
            char chunk[16384];
            auto left = deadline == forever ? hours(24 * 365) : deadline - sclock::now();
            if (left <= sclock::duration::zero()) co_return 1;  // deadline
            auto r = co_await net::with_timeout(cl.sock.async_read_some(asio::buffer(chunk)), left);
            if (!r) co_return 1;
            auto [ec, got] = *r;
            if (ec) co_return 2;
            cl.rbuf.append(chunk, got);
        }
        co_return 0;
    }

    // Reads one command line (ReadSlice('\n') on a 16 KiB buffer). 0 ok, 1 deadline, 2 closed/too long.
    static asio::awaitable<int> read_line(client& cl, std::string& line, sclock::time_point deadline) {
        for (;;) {
            auto nl = cl.rbuf.find('\n', cl.rpos);
            if (nl != std::string::npos) {
                if (nl - cl.rpos + 1 > proto::max_command_line) co_return 2;
                line.assign(cl.rbuf, cl.rpos, nl - cl.rpos + 1);
                cl.rpos = nl + 1;
                co_return 0;
            }
            if (cl.rbuf.size() - cl.rpos >= proto::max_command_line) co_return 2;
            int r = co_await fill(cl, cl.rbuf.size() - cl.rpos + 1, deadline);
            if (r) co_return r;
        }
    }

    static asio::awaitable<std::optional<std::string>> read_exact(client& cl, std::size_t n,
                                                                  sclock::time_point deadline) {
        if (co_await fill(cl, n, deadline)) co_return std::nullopt;
        std::string out = cl.rbuf.substr(cl.rpos, n);
        cl.rpos += n;
        co_return out;
    }

    static asio::awaitable<std::optional<std::int32_t>> read_len(client& cl, sclock::time_point deadline) {
        auto b = co_await read_exact(cl, 4, deadline);
        if (!b) co_return std::nullopt;
        co_return static_cast<std::int32_t>(load_be32(reinterpret_cast<const std::uint8_t*>(b->data())));
    }

    // --- the client coroutines ----------------------------------------------------------------------
    static asio::awaitable<void> writer(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
        for (;;) {
            while ((cl->out.empty() || self->frozen) && !cl->closed) {
                if (self->frozen) {
                    co_await net::sleep_for(milliseconds(10));
                    continue;
                }
                if (cl->close_after_flush) {
                    self->close_client(*cl);
                    break;
                }
                cl->writer_waiting = true;
                co_await cl->wake.async_wait();
                cl->writer_waiting = false;
            }
            if (cl->closed) co_return;
            if (self->latency > milliseconds(0)) co_await net::sleep_for(self->latency);
            std::swap(cl->out, cl->sending);
            auto [ec, n] = co_await asio::async_write(cl->sock, asio::buffer(cl->sending), net::nothrow);
            cl->sending.clear();
            if (ec) {
                self->close_client(*cl);
                co_return;
            }
        }
    }

    // nsqd's messagePump heartbeat ticker: every interval, whatever else is sent.
    static asio::awaitable<void> heartbeats(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
        cl->hb_timer.expires_after(cl->hb);
        while (!cl->closed) {
            auto [ec] = co_await cl->hb_timer.async_wait();
            if (cl->closed) co_return;
            if (ec) continue;  // IDENTIFY re-armed the ticker
            if (!self->frozen) {
                proto::append_frame(cl->out, proto::frame_type::response, "_heartbeat_");
                cl->notify();
            }
            cl->hb_timer.expires_at(cl->hb_timer.expiry() + cl->hb);
        }
    }

    void send_response(client& cl, std::string_view data) {
        proto::append_frame(cl.out, proto::frame_type::response, data);
        cl.notify();
    }

    static asio::awaitable<void> serve(std::shared_ptr<impl> self, std::shared_ptr<client> cl) {
        cl->hb = self->opts.heartbeat_interval;
        cl->msg_timeout = self->opts.msg_timeout;
        asio::co_spawn(self->ex, writer(self, cl), asio::detached);
        asio::co_spawn(self->ex, heartbeats(self, cl), asio::detached);
        auto magic = co_await read_exact(*cl, 4, sclock::now() + 2 * cl->hb);
        if (!magic || *magic != proto::magic_v2) {
            if (magic) {
                proto::append_frame(cl->out, proto::frame_type::error, "E_BAD_PROTOCOL");
                cl->close_after_flush = true;
                cl->notify();
            } else {
                self->close_client(*cl);
            }
            co_return;
        }
        std::string line;
        while (!cl->closed && !cl->close_after_flush) {
            auto deadline = cl->hb > milliseconds(0) ? sclock::now() + 2 * cl->hb : forever;
            int r = co_await read_line(*cl, line, deadline);
            if (cl->closed) break;
            if (r == 1) ++self->heartbeat_disconnects;
            if (r) break;
            auto params = proto::split_command(line);
            if (self->record) self->commands.emplace_back(line.substr(0, line.find_last_not_of("\r\n") + 1));
            auto err = co_await self->exec(*cl, params, deadline);
            if (cl->closed) break;
            if (err) {
                proto::append_frame(cl->out, proto::frame_type::error, err->text);
                cl->notify();
                if (err->fatal) {
                    self->fatal_log.push_back(err->text);
                    cl->close_after_flush = true;
                    break;
                }
            }
        }
        self->remove_client(*cl);
        if (!cl->close_after_flush) self->close_client(*cl);
        cl->notify();
        self->clients.erase(cl);
    }

    using exec_result = std::optional<client_error>;
    static client_error fatal(std::string code, std::string text) { return {code + " " + text, true}; }
    static client_error nonfatal(std::string code, std::string text) { return {code + " " + text, false}; }

    asio::awaitable<exec_result> exec(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl) {
        auto cmd = p[0];
        if (cmd == "IDENTIFY") co_return co_await identify(cl, p, dl);
        if (cmd == "FIN") co_return fin(cl, p);
        if (cmd == "RDY") co_return rdy(cl, p);
        if (cmd == "REQ") co_return req(cl, p);
        if (cmd == "PUB") co_return co_await pub(cl, p, dl);
        if (cmd == "MPUB") co_return co_await mpub(cl, p, dl);
        if (cmd == "DPUB") co_return co_await dpub(cl, p, dl);
        if (cmd == "NOP") co_return std::nullopt;
        if (cmd == "TOUCH") co_return touch(cl, p);
        if (cmd == "SUB") co_return sub(cl, p);
        if (cmd == "CLS") co_return cls(cl);
        if (cmd == "AUTH") co_return co_await auth(cl, p, dl);
        co_return fatal("E_INVALID", "invalid command " + std::string(cmd));
    }

    asio::awaitable<exec_result> identify(client& cl, const std::vector<std::string_view>&,
                                          sclock::time_point dl) {
        if (cl.state != cstate::init) co_return fatal("E_INVALID", "cannot IDENTIFY in current state");
        auto len = co_await read_len(cl, dl);
        if (!len) co_return fatal("E_BAD_BODY", "IDENTIFY failed to read body size");
        if (*len > opts.max_body_size)
            co_return fatal("E_BAD_BODY", "IDENTIFY body too big " + std::to_string(*len) + " > " +
                                              std::to_string(opts.max_body_size));
        if (*len <= 0) co_return fatal("E_BAD_BODY", "IDENTIFY invalid body size " + std::to_string(*len));
        auto body = co_await read_exact(cl, static_cast<std::size_t>(*len), dl);
        if (!body) co_return fatal("E_BAD_BODY", "IDENTIFY failed to read body");
        auto req = proto::parse_identify_request(*body);
        if (!req) co_return fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body");
        if (auto r = proto::check_heartbeat_interval(req->heartbeat_interval_ms,
                                                     opts.max_heartbeat_interval.count());
            !r)
            co_return fatal("E_BAD_BODY", "IDENTIFY " + r.err().message);
        auto obs = req->output_buffer_size, obt = req->output_buffer_timeout;
        if (!(obs == -1 || obs == 0 || (obs >= 64 && obs <= 64 * 1024)))
            co_return fatal("E_BAD_BODY",
                            "IDENTIFY output buffer size (" + std::to_string(obs) + ") is invalid");
        if (!(obt == -1 || obt == 0 || (obt >= 25 && obt <= 30000)))
            co_return fatal("E_BAD_BODY",
                            "IDENTIFY output buffer timeout (" + std::to_string(obt) + ") is invalid");
        if (req->sample_rate < 0 || req->sample_rate > 99)
            co_return fatal("E_BAD_BODY",
                            "IDENTIFY sample rate (" + std::to_string(req->sample_rate) + ") is invalid");
        if (auto r = proto::check_msg_timeout(req->msg_timeout_ms, opts.max_msg_timeout.count()); !r)
            co_return fatal("E_BAD_BODY", "IDENTIFY " + r.err().message);
        cl.client_id = req->client_id;
        cl.hostname = req->hostname;
        cl.user_agent = req->user_agent;
        if (req->heartbeat_interval_ms == -1)
            cl.hb = milliseconds(0);
        else if (req->heartbeat_interval_ms > 0)
            cl.hb = milliseconds(req->heartbeat_interval_ms);
        // Restart the ticker now, before the next read deadline is set (as nsqd's IDENTIFY event does).
        if (cl.hb > milliseconds(0)) {
            cl.hb_timer.expires_after(cl.hb);
        } else {
            cl.hb_timer.expires_at(forever);
        }
        if (req->msg_timeout_ms > 0) cl.msg_timeout = milliseconds(req->msg_timeout_ms);
        if (obs == -1)
            cl.output_buffer_size = 0;
        else if (obs > 0)
            cl.output_buffer_size = obs;
        if (obt == -1)
            cl.output_buffer_timeout = 0;
        else if (obt > 0)
            cl.output_buffer_timeout = obt;
        cl.sample_rate = req->sample_rate;
        if (!req->feature_negotiation) {
            send_response(cl, "OK");
            co_return std::nullopt;
        }
        proto::identify_response resp;
        resp.max_rdy_count = opts.max_rdy_count;
        resp.version = opts.version;
        resp.max_msg_timeout = opts.max_msg_timeout.count();
        resp.msg_timeout = cl.msg_timeout.count();
        resp.sample_rate = cl.sample_rate;
        resp.output_buffer_size = cl.output_buffer_size;
        resp.output_buffer_timeout = cl.output_buffer_timeout;
        resp.auth_required = !opts.auth_secrets.empty();
        send_response(cl, proto::to_json(resp));
        co_return std::nullopt;
    }

    exec_result sub(client& cl, const std::vector<std::string_view>& p) {
        if (cl.state != cstate::init) return fatal("E_INVALID", "cannot SUB in current state");
        if (cl.hb <= milliseconds(0)) return fatal("E_INVALID", "cannot SUB with heartbeats disabled");
        if (p.size() < 3) return fatal("E_INVALID", "SUB insufficient number of parameters");
        std::string tn(p[1]), cn(p[2]);
        if (!proto::valid_topic_name(tn))
            return fatal("E_BAD_TOPIC", "SUB topic name " + json_escape(tn) + " is not valid");
        if (!proto::valid_channel_name(cn))
            return fatal("E_BAD_CHANNEL", "SUB channel name " + json_escape(cn) + " is not valid");
        if (auto e = check_auth(cl, "SUB")) return e;
        auto& t = get_topic(tn);
        auto& c = get_channel(t, cn);
        cl.state = cstate::subscribed;
        cl.tp = &t;
        cl.ch = &c;
        c.clients.push_back(&cl);
        send_response(cl, "OK");
        check_rdy(cl);
        return std::nullopt;
    }

    exec_result rdy(client& cl, const std::vector<std::string_view>& p) {
        if (cl.state == cstate::closing) return std::nullopt;  // ignored after CLS, as nsqd does
        if (cl.state != cstate::subscribed) return fatal("E_INVALID", "cannot RDY in current state");
        std::int64_t count = 1;
        if (p.size() > 1) {
            auto v = proto::parse_base10(p[1]);
            if (!v) return fatal("E_INVALID", "RDY could not parse count " + std::string(p[1]));
            count = static_cast<std::int64_t>(*v);
        }
        if (count < 0 || count > opts.max_rdy_count)
            return fatal("E_INVALID", "RDY count " + std::to_string(count) + " out of range 0-" +
                                          std::to_string(opts.max_rdy_count));
        cl.rdy = count;
        check_rdy(cl);
        pump(*cl.ch);
        return std::nullopt;
    }

    // Validates state and id for FIN/REQ/TOUCH; returns the entry or an error.
    std::variant<in_flight_entry*, client_error> in_flight_for(client& cl,
                                                               const std::vector<std::string_view>& p,
                                                               std::string_view cmd, std::size_t nparams,
                                                               std::string_view failed_code) {
        if (cl.state != cstate::subscribed && cl.state != cstate::closing)
            return fatal("E_INVALID", "cannot " + std::string(cmd) + " in current state");
        if (p.size() < nparams)
            return fatal("E_INVALID", std::string(cmd) + " insufficient number of params");
        if (p[1].size() != proto::message_id_size) return fatal("E_INVALID", "Invalid Message ID");
        auto it = cl.ch->in_flight.find(std::string(p[1]));
        std::string why;
        if (it == cl.ch->in_flight.end())
            why = "ID not in flight";
        else if (it->second.owner != &cl)
            why = "client does not own message";
        if (!why.empty())
            return nonfatal(std::string(failed_code),
                            std::string(cmd) + " " + std::string(p[1]) + " failed " + why);
        return &it->second;
    }

    exec_result fin(client& cl, const std::vector<std::string_view>& p) {
        auto r = in_flight_for(cl, p, "FIN", 2, "E_FIN_FAILED");
        if (auto* e = std::get_if<client_error>(&r)) return *e;
        cl.ch->in_flight.erase(std::get<in_flight_entry*>(r)->m.id);
        --cl.in_flight;
        ++cl.finish_count;
        ++cl.ch->finish_count;
        pump(*cl.ch);
        return std::nullopt;
    }

    exec_result req(client& cl, const std::vector<std::string_view>& p) {
        if (cl.state != cstate::subscribed && cl.state != cstate::closing)
            return fatal("E_INVALID", "cannot REQ in current state");
        if (p.size() < 3) return fatal("E_INVALID", "REQ insufficient number of params");
        if (p[1].size() != proto::message_id_size) return fatal("E_INVALID", "Invalid Message ID");
        auto ms = proto::parse_base10(p[2]);
        if (!ms) return fatal("E_INVALID", "REQ could not parse timeout " + std::string(p[2]));
        auto r = in_flight_for(cl, p, "REQ", 3, "E_REQ_FAILED");
        if (auto* e = std::get_if<client_error>(&r)) return *e;
        auto delay = std::min<std::int64_t>(static_cast<std::int64_t>(*ms), opts.max_req_timeout.count());
        auto* entry = std::get<in_flight_entry*>(r);
        msg m = std::move(entry->m);
        cl.ch->in_flight.erase(m.id);
        --cl.in_flight;
        ++cl.requeue_count;
        ++cl.ch->requeue_count;
        if (delay <= 0) {
            requeue_now(*cl.ch, std::move(m));
        } else {
            cl.ch->deferred.emplace(sclock::now() + milliseconds(delay), std::move(m));
        }
        pump(*cl.ch);
        return std::nullopt;
    }

    exec_result touch(client& cl, const std::vector<std::string_view>& p) {
        auto r = in_flight_for(cl, p, "TOUCH", 2, "E_TOUCH_FAILED");
        if (auto* e = std::get_if<client_error>(&r)) return *e;
        auto* entry = std::get<in_flight_entry*>(r);
        auto deadline = sclock::now() + cl.msg_timeout;
        if (deadline - entry->delivered >= opts.max_msg_timeout)
            deadline = entry->delivered + opts.max_msg_timeout;
        entry->deadline = deadline;
        return std::nullopt;
    }

    exec_result cls(client& cl) {
        if (cl.state != cstate::subscribed) return fatal("E_INVALID", "cannot CLS in current state");
        cl.state = cstate::closing;
        cl.rdy = 0;
        check_rdy(cl);
        send_response(cl, "CLOSE_WAIT");
        return std::nullopt;
    }

    // Reads [size][body] for PUB/DPUB with nsqd's checks and wording.
    asio::awaitable<std::variant<std::string, client_error>> read_msg_body(client& cl, std::string_view cmd,
                                                                           sclock::time_point dl) {
        auto len = co_await read_len(cl, dl);
        if (!len) co_return fatal("E_BAD_MESSAGE", std::string(cmd) + " failed to read message body size");
        if (*len <= 0)
            co_return fatal("E_BAD_MESSAGE",
                            std::string(cmd) + " invalid message body size " + std::to_string(*len));
        if (*len > opts.max_msg_size)
            co_return fatal("E_BAD_MESSAGE", std::string(cmd) + " message too big " + std::to_string(*len) +
                                                 " > " + std::to_string(opts.max_msg_size));
        auto body = co_await read_exact(cl, static_cast<std::size_t>(*len), dl);
        if (!body) co_return fatal("E_BAD_MESSAGE", std::string(cmd) + " failed to read message body");
        co_return std::move(*body);
    }

    asio::awaitable<exec_result> pub(client& cl, const std::vector<std::string_view>& p,
                                     sclock::time_point dl) {
        if (p.size() < 2) co_return fatal("E_INVALID", "PUB insufficient number of parameters");
        std::string tn(p[1]);
        if (!proto::valid_topic_name(tn))
            co_return fatal("E_BAD_TOPIC", "PUB topic name " + json_escape(tn) + " is not valid");
        auto body = co_await read_msg_body(cl, "PUB", dl);
        if (auto* e = std::get_if<client_error>(&body)) co_return *e;
        if (auto e = check_auth(cl, "PUB")) co_return e;
        put(get_topic(tn), std::move(std::get<std::string>(body)));
        send_response(cl, "OK");
        co_return std::nullopt;
    }

    asio::awaitable<exec_result> dpub(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl) {
        if (p.size() < 3) co_return fatal("E_INVALID", "DPUB insufficient number of parameters");
        std::string tn(p[1]);
        if (!proto::valid_topic_name(tn))
            co_return fatal("E_BAD_TOPIC", "DPUB topic name " + json_escape(tn) + " is not valid");
        auto ms = proto::parse_base10(p[2]);
        if (!ms) co_return fatal("E_INVALID", "DPUB could not parse timeout " + std::string(p[2]));
        auto v = static_cast<std::int64_t>(*ms);
        if (v < 0 || v > opts.max_req_timeout.count())
            co_return fatal("E_INVALID", "DPUB timeout " + std::to_string(v) + " out of range 0-" +
                                             std::to_string(opts.max_req_timeout.count()));
        auto body = co_await read_msg_body(cl, "DPUB", dl);
        if (auto* e = std::get_if<client_error>(&body)) co_return *e;
        if (auto e = check_auth(cl, "DPUB")) co_return e;
        put(get_topic(tn), std::move(std::get<std::string>(body)), milliseconds(v));
        send_response(cl, "OK");
        co_return std::nullopt;
    }

    asio::awaitable<exec_result> mpub(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl) {
        if (p.size() < 2) co_return fatal("E_INVALID", "MPUB insufficient number of parameters");
        std::string tn(p[1]);
        if (!proto::valid_topic_name(tn))
            co_return fatal("E_BAD_TOPIC",
                            "E_BAD_TOPIC MPUB topic name " + json_escape(tn) + " is not valid");
        if (auto e = check_auth(cl, "MPUB")) co_return e;  // before the body, as nsqd
        auto len = co_await read_len(cl, dl);
        if (!len) co_return fatal("E_BAD_BODY", "MPUB failed to read body size");
        if (*len <= 0) co_return fatal("E_BAD_BODY", "MPUB invalid body size " + std::to_string(*len));
        if (*len > opts.max_body_size)
            co_return fatal("E_BAD_BODY", "MPUB body too big " + std::to_string(*len) + " > " +
                                              std::to_string(opts.max_body_size));
        auto num = co_await read_len(cl, dl);
        if (!num) co_return fatal("E_BAD_BODY", "MPUB failed to read message count");
        // 4 == total num, 5 == length + min 1 (nsqd's readMPUB)
        if (*num <= 0 || *num > (opts.max_body_size - 4) / 5)
            co_return fatal("E_BAD_BODY", "MPUB invalid message count " + std::to_string(*num));
        std::vector<std::string> bodies;
        for (std::int32_t i = 0; i < *num; ++i) {
            auto sz = co_await read_len(cl, dl);
            if (!sz)
                co_return fatal("E_BAD_MESSAGE",
                                "MPUB failed to read message(" + std::to_string(i) + ") body size");
            if (*sz <= 0)
                co_return fatal("E_BAD_MESSAGE", "MPUB invalid message(" + std::to_string(i) +
                                                     ") body size " + std::to_string(*sz));
            if (*sz > opts.max_msg_size)
                co_return fatal("E_BAD_MESSAGE", "MPUB message too big " + std::to_string(*sz) + " > " +
                                                     std::to_string(opts.max_msg_size));
            auto b = co_await read_exact(cl, static_cast<std::size_t>(*sz), dl);
            if (!b) co_return fatal("E_BAD_MESSAGE", "MPUB failed to read message body");
            bodies.push_back(std::move(*b));
        }
        auto& t = get_topic(tn);
        for (auto& b : bodies) put(t, std::move(b));
        send_response(cl, "OK");
        co_return std::nullopt;
    }

    asio::awaitable<exec_result> auth(client& cl, const std::vector<std::string_view>& p,
                                      sclock::time_point dl) {
        if (cl.state != cstate::init) co_return fatal("E_INVALID", "cannot AUTH in current state");
        if (p.size() != 1) co_return fatal("E_INVALID", "AUTH invalid number of parameters");
        auto len = co_await read_len(cl, dl);
        if (!len) co_return fatal("E_BAD_BODY", "AUTH failed to read body size");
        if (*len <= 0) co_return fatal("E_BAD_BODY", "AUTH invalid body size " + std::to_string(*len));
        if (*len > opts.max_body_size)
            co_return fatal("E_BAD_BODY", "AUTH body too big " + std::to_string(*len) + " > " +
                                              std::to_string(opts.max_body_size));
        auto secret = co_await read_exact(cl, static_cast<std::size_t>(*len), dl);
        if (!secret) co_return fatal("E_BAD_BODY", "AUTH failed to read body");
        if (cl.auth) co_return fatal("E_INVALID", "AUTH already set");
        if (opts.auth_secrets.empty()) co_return fatal("E_AUTH_DISABLED", "AUTH disabled");
        // nsqd asks its auth server now, an HTTP request of its own; its heartbeat ticker goes on.
        if (opts.auth_delay > milliseconds(0)) co_await net::sleep_for(opts.auth_delay);
        if (cl.closed) co_return std::nullopt;
        auto it = opts.auth_secrets.find(*secret);
        if (it == opts.auth_secrets.end()) co_return fatal("E_AUTH_FAILED", "AUTH failed");
        if (it->second.permission_count <= 0)
            co_return fatal("E_UNAUTHORIZED", "AUTH no authorizations found");
        cl.auth = &it->second;
        proto::auth_response r;
        r.identity = it->second.identity;
        r.identity_url = it->second.identity_url;
        r.permission_count = it->second.permission_count;
        send_response(cl, proto::to_json(r));
        co_return std::nullopt;
    }

    // nsqd's CheckAuth, without the authorizations themselves (see fake_nsqd_options::auth_secrets).
    exec_result check_auth(const client& cl, std::string_view cmd) const {
        if (opts.auth_secrets.empty() || cl.auth) return std::nullopt;
        return fatal("E_AUTH_FIRST", "AUTH required before " + std::string(cmd));
    }

    static asio::awaitable<void> accept_loop(std::shared_ptr<impl> self) {
        while (!self->stopped) {
            auto cl = std::make_shared<client>(self->ex, self.get(), self->next_client_id++);
            auto [ec] = co_await self->acceptor.async_accept(cl->sock);
            if (self->stopped) co_return;
            if (ec) continue;
            std::error_code ignored;
            cl->sock.set_option(net::tcp::no_delay(true), ignored);
            auto rep = cl->sock.remote_endpoint(ignored);
            cl->remote = rep.address().to_string() + ":" + std::to_string(rep.port());
            cl->connect_ts = unix_now();
            ++self->total_connections;
            self->clients.insert(cl);
            asio::co_spawn(self->ex, serve(self, cl), asio::detached);
        }
    }

    std::string stats(const std::string& tf, const std::string& cf) const;
};

// --- /stats?format=json with nsqd 1.3.0's field names and order ---------------------------------------
std::string fake_nsqd::impl::stats(const std::string& tf, const std::string& cf) const {
    std::string o = "{\"version\":" + json_escape(opts.version) +
                    ",\"health\":\"OK\",\"start_time\":" + std::to_string(start_time) + ",\"topics\":[";
    bool first_t = true;
    for (const auto& [tn, t] : topics) {
        if (!tf.empty() && tn != tf) continue;
        if (!first_t) o += ',';
        first_t = false;
        o += "{\"topic_name\":" + json_escape(tn) + ",\"channels\":[";
        bool first_c = true;
        for (const auto& [cn, c] : t->channels) {
            if (!cf.empty() && cn != cf) continue;
            if (!first_c) o += ',';
            first_c = false;
            o += "{\"channel_name\":" + json_escape(cn) + ",\"depth\":" + std::to_string(c->queue.size()) +
                 ",\"backend_depth\":0,\"in_flight_count\":" + std::to_string(c->in_flight.size()) +
                 ",\"deferred_count\":" + std::to_string(c->deferred.size()) +
                 ",\"message_count\":" + std::to_string(c->message_count) +
                 ",\"requeue_count\":" + std::to_string(c->requeue_count) +
                 ",\"timeout_count\":" + std::to_string(c->timeout_count) +
                 ",\"client_count\":" + std::to_string(c->clients.size()) + ",\"clients\":[";
            for (std::size_t i = 0; i < c->clients.size(); ++i) {
                const auto* cl = c->clients[i];
                if (i) o += ',';
                o += "{\"client_id\":" + json_escape(cl->client_id) +
                     ",\"hostname\":" + json_escape(cl->hostname) +
                     ",\"version\":\"V2\",\"remote_address\":" + json_escape(cl->remote) +
                     ",\"state\":" + std::to_string(cl->state == cstate::subscribed ? 3 : 4) +
                     ",\"ready_count\":" + std::to_string(cl->rdy) +
                     ",\"in_flight_count\":" + std::to_string(cl->in_flight) +
                     ",\"message_count\":" + std::to_string(cl->message_count) +
                     ",\"finish_count\":" + std::to_string(cl->finish_count) +
                     ",\"requeue_count\":" + std::to_string(cl->requeue_count) +
                     ",\"connect_ts\":" + std::to_string(cl->connect_ts) +
                     ",\"sample_rate\":" + std::to_string(cl->sample_rate) +
                     ",\"deflate\":false,\"snappy\":false,\"user_agent\":" + json_escape(cl->user_agent) +
                     (cl->auth ? ",\"authed\":true,\"auth_identity\":" + json_escape(cl->auth->identity) +
                                     (cl->auth->identity_url.empty()
                                          ? std::string()
                                          : ",\"auth_identity_url\":" + json_escape(cl->auth->identity_url))
                               : std::string()) +
                     ",\"tls\":false,\"tls_cipher_suite\":\"\",\"tls_version\":\"\",\"tls_negotiated_"
                     "protocol\":\"\","
                     "\"tls_negotiated_protocol_is_mutual\":false}";
            }
            o += "],\"paused\":" + std::string(c->paused ? "true" : "false") +
                 ",\"e2e_processing_latency\":{\"count\":0,\"percentiles\":null}}";
        }
        o += "],\"depth\":" + std::to_string(t->backlog.size()) +
             ",\"backend_depth\":0,\"message_count\":" + std::to_string(t->message_count) +
             ",\"message_bytes\":" + std::to_string(t->message_bytes) +
             ",\"paused\":" + (t->paused ? "true" : "false") +
             ",\"e2e_processing_latency\":{\"count\":0,\"percentiles\":null}}";
    }
    o += "],\"memory\":{\"heap_objects\":0,\"heap_idle_bytes\":0,\"heap_in_use_bytes\":0,\"heap_released_"
         "bytes\":0,"
         "\"gc_pause_usec_100\":0,\"gc_pause_usec_99\":0,\"gc_pause_usec_95\":0,\"next_gc_bytes\":0,"
         "\"gc_total_runs\":0},\"producers\":null}";
    return o;
}

// --- HTTP API --------------------------------------------------------------------------------------------
namespace {

http::response json_error(int status, std::string_view message) {
    auto r = http::make_response(status, "{\"message\":\"" + std::string(message) + "\"}",
                                 "application/json; charset=utf-8");
    r.headers.add("X-Nsq-Content-Type", "nsq; version=1.0");
    return r;
}

http::response ok_text() {
    return http::make_response(200, "OK");
}

// Splits an /mpub body: newline-separated, or [num][size][body]… with binary=true.
std::optional<std::vector<std::string>> split_mpub(const std::string& body, bool binary) {
    std::vector<std::string> out;
    if (!binary) {
        std::size_t pos = 0;
        while (pos <= body.size()) {
            auto nl = body.find('\n', pos);
            auto part = body.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
            if (!part.empty()) out.push_back(std::move(part));
            if (nl == std::string::npos) break;
            pos = nl + 1;
        }
        return out;
    }
    if (body.size() < 4) return std::nullopt;
    auto* p = reinterpret_cast<const std::uint8_t*>(body.data());
    std::uint32_t n = load_be32(p);
    std::size_t pos = 4;
    for (std::uint32_t i = 0; i < n; ++i) {
        if (pos + 4 > body.size()) return std::nullopt;
        std::uint32_t sz = load_be32(p + pos);
        pos += 4;
        if (pos + sz > body.size()) return std::nullopt;
        out.push_back(body.substr(pos, sz));
        pos += sz;
    }
    return out;
}

}  // namespace

fake_nsqd::fake_nsqd(asio::any_io_executor ex, fake_nsqd_options opts, logger log)
    : impl_(std::make_shared<impl>(ex, std::move(opts), std::move(log))) {}

fake_nsqd::~fake_nsqd() {
    stop();
}

result<void> fake_nsqd::start(const net::host_port& tcp, const net::host_port& http_addr) {
    auto& s = *impl_;
    std::error_code ec;
    auto ep = net::tcp::endpoint(asio::ip::make_address(tcp.host, ec), tcp.port);
    if (ec) return error(ec, "tcp address");
    s.acceptor.open(ep.protocol(), ec);
    if (!ec) s.acceptor.set_option(net::tcp::acceptor::reuse_address(true), ec);
    if (!ec) s.acceptor.bind(ep, ec);
    if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return error(ec, "listen " + tcp.to_string());

    std::weak_ptr<impl> w = impl_;
    http::router r;
    r.add("GET", "/ping", [](http::request&) -> asio::awaitable<http::response> { co_return ok_text(); });
    auto need_topic = [](http::request& req, std::string& out) -> std::optional<http::response> {
        auto t = http::query_param(req.query(), "topic");
        if (!t) return json_error(400, "MISSING_ARG_TOPIC");
        if (!proto::valid_topic_name(*t)) return json_error(400, "INVALID_TOPIC");
        out = *t;
        return std::nullopt;
    };
    r.add("POST", "/pub", [w, need_topic](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        std::string t;
        if (auto e = need_topic(req, t)) co_return *e;
        if (req.body.empty()) co_return json_error(400, "MSG_EMPTY");
        if (static_cast<std::int64_t>(req.body.size()) > s->opts.max_msg_size)
            co_return json_error(413, "MSG_TOO_BIG");
        milliseconds defer{0};
        if (auto d = http::query_param(req.query(), "defer")) {
            auto v = proto::parse_base10(*d);
            if (!v || static_cast<std::int64_t>(*v) > s->opts.max_req_timeout.count())
                co_return json_error(400, "INVALID_DEFER");
            defer = milliseconds(*v);
        }
        s->put(s->get_topic(t), std::move(req.body), defer);
        co_return ok_text();
    });
    r.add("POST", "/mpub", [w, need_topic](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        std::string t;
        if (auto e = need_topic(req, t)) co_return *e;
        auto bin = http::query_param(req.query(), "binary");
        auto parts = split_mpub(req.body, bin && (*bin == "true" || *bin == "1"));
        if (!parts) co_return json_error(400, "BAD_BODY");
        for (auto& p : *parts)
            if (static_cast<std::int64_t>(p.size()) > s->opts.max_msg_size)
                co_return json_error(413, "MSG_TOO_BIG");
        auto& tp = s->get_topic(t);
        for (auto& p : *parts) s->put(tp, std::move(p));
        co_return ok_text();
    });
    r.add("GET", "/stats", [w](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        auto t = http::query_param(req.query(), "topic").value_or("");
        auto c = http::query_param(req.query(), "channel").value_or("");
        co_return http::make_response(200, s->stats(t, c), "application/json; charset=utf-8");
    });
    r.add_prefix("POST", "/topic/", [w, need_topic](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        std::string t;
        if (auto e = need_topic(req, t)) co_return *e;
        auto op = req.path().substr(7);
        if (op == "create") {
            s->get_topic(t);
        } else if (op == "pause" || op == "unpause") {
            if (!s->topics.contains(t)) co_return json_error(404, "TOPIC_NOT_FOUND");
            s->topics[t]->paused = op == "pause";
            s->flush_backlog(*s->topics[t]);
        } else if (op == "delete") {
            if (!s->topics.contains(t)) co_return json_error(404, "TOPIC_NOT_FOUND");
            s->topics.erase(t);
        } else if (op == "empty") {
            if (!s->topics.contains(t)) co_return json_error(404, "TOPIC_NOT_FOUND");
            s->topics[t]->backlog.clear();
        } else {
            co_return json_error(404, "NOT_FOUND");
        }
        co_return http::make_response(200, "");
    });
    r.add_prefix("POST", "/channel/", [w, need_topic](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        std::string t;
        if (auto e = need_topic(req, t)) co_return *e;
        auto cn = http::query_param(req.query(), "channel");
        if (!cn) co_return json_error(400, "MISSING_ARG_CHANNEL");
        if (!proto::valid_channel_name(*cn)) co_return json_error(400, "INVALID_CHANNEL");
        auto op = req.path().substr(9);
        if (op == "create") {
            s->get_channel(s->get_topic(t), *cn);
            co_return http::make_response(200, "");
        }
        if (!s->topics.contains(t)) co_return json_error(404, "TOPIC_NOT_FOUND");
        auto& tp = *s->topics[t];
        if (!tp.channels.contains(*cn)) co_return json_error(404, "CHANNEL_NOT_FOUND");
        auto& ch = *tp.channels[*cn];
        if (op == "pause" || op == "unpause") {
            ch.paused = op == "pause";
            s->pump(ch);
        } else if (op == "empty") {
            ch.queue.clear();
        } else if (op == "delete") {
            for (auto* cl : ch.clients) s->close_client(*cl);
            // clients are detached when their read loops end; the channel goes once they have.
            if (ch.clients.empty()) tp.channels.erase(*cn);
        } else {
            co_return json_error(404, "NOT_FOUND");
        }
        co_return http::make_response(200, "");
    });
    http::server_options so;
    so.server_name = "fake-nsqd";
    s.http = std::make_unique<http::server>(s.ex, std::move(r), so, s.log);
    auto hep = s.http->listen(http_addr);
    if (!hep) return hep.err();
    s.http->start();
    asio::co_spawn(s.ex, impl::accept_loop(impl_), asio::detached);
    asio::co_spawn(s.ex, impl::scan_loop(impl_), asio::detached);
    return {};
}

void fake_nsqd::stop() {
    auto& s = *impl_;
    if (s.stopped) return;
    s.stopped = true;
    std::error_code ignored;
    s.acceptor.close(ignored);
    s.scan_timer.cancel();
    if (s.http) s.http->stop();
    for (auto& c : std::set<std::shared_ptr<client>>(s.clients)) s.close_client(*c);
}

std::uint16_t fake_nsqd::tcp_port() const {
    std::error_code ec;
    return impl_->acceptor.local_endpoint(ec).port();
}
std::uint16_t fake_nsqd::http_port() const {
    return impl_->http ? impl_->http->local_endpoint().port() : 0;
}

cg::nsq::proto::producer_info fake_nsqd::producer() const {
    cg::nsq::proto::producer_info p;
    p.broadcast_address = impl_->opts.broadcast_address;
    p.hostname = impl_->opts.hostname;
    p.remote_address = "127.0.0.1:1";
    p.tcp_port = tcp_port();
    p.http_port = http_port();
    p.version = impl_->opts.version;
    return p;
}

void fake_nsqd::publish(const std::string& topic, std::string body) {
    impl_->put(impl_->get_topic(topic), std::move(body));
}

void fake_nsqd::create_channel(const std::string& topic, const std::string& channel) {
    impl_->get_channel(impl_->get_topic(topic), channel);
}

void fake_nsqd::pause_channel(const std::string& topic, const std::string& channel, bool paused) {
    auto& c = impl_->get_channel(impl_->get_topic(topic), channel);
    c.paused = paused;
    impl_->pump(c);
}

void fake_nsqd::pause_topic(const std::string& topic, bool paused) {
    auto& t = impl_->get_topic(topic);
    t.paused = paused;
    impl_->flush_backlog(t);
}

void fake_nsqd::drop_all_connections() {
    for (auto& c : std::set<std::shared_ptr<client>>(impl_->clients)) impl_->close_client(*c);
}

void fake_nsqd::restart() {
    auto& s = *impl_;
    drop_all_connections();
    for (auto& [tn, t] : s.topics)
        for (auto& [cn, c] : t->channels) {
            for (auto& [id, e] : c->in_flight) {
                if (e.owner) --e.owner->in_flight;
                c->queue.push_back(std::move(e.m));
            }
            c->in_flight.clear();
        }
}

void fake_nsqd::set_latency(milliseconds d) {
    impl_->latency = d;
}
void fake_nsqd::freeze(bool frozen) {
    impl_->frozen = frozen;
}

channel_counts fake_nsqd::channel(const std::string& topic, const std::string& channel) const {
    channel_counts out;
    auto t = impl_->topics.find(topic);
    if (t == impl_->topics.end()) return out;
    auto c = t->second->channels.find(channel);
    if (c == t->second->channels.end()) return out;
    const auto& ch = *c->second;
    out.depth = static_cast<std::int64_t>(ch.queue.size());
    out.in_flight = static_cast<std::int64_t>(ch.in_flight.size());
    out.deferred = static_cast<std::int64_t>(ch.deferred.size());
    out.message_count = ch.message_count;
    out.requeue_count = ch.requeue_count;
    out.timeout_count = ch.timeout_count;
    out.finish_count = ch.finish_count;
    out.client_count = static_cast<std::int64_t>(ch.clients.size());
    out.paused = ch.paused;
    return out;
}

std::uint64_t fake_nsqd::topic_message_count(const std::string& topic) const {
    auto t = impl_->topics.find(topic);
    return t == impl_->topics.end() ? 0 : t->second->message_count;
}
std::size_t fake_nsqd::client_count() const {
    return impl_->clients.size();
}
std::uint64_t fake_nsqd::total_connections() const {
    return impl_->total_connections;
}
std::uint64_t fake_nsqd::heartbeat_disconnects() const {
    return impl_->heartbeat_disconnects;
}
std::vector<std::string> fake_nsqd::fatal_errors() const {
    return impl_->fatal_log;
}
std::uint64_t fake_nsqd::rdy_violations() const {
    return impl_->violations;
}
std::int64_t fake_nsqd::peak_channel_rdy() const {
    return impl_->peak_rdy;
}
std::vector<std::string> fake_nsqd::command_log() const {
    return impl_->commands;
}
void fake_nsqd::record_commands(bool on) {
    impl_->record = on;
}
std::string fake_nsqd::stats_json(const std::string& topic, const std::string& channel) const {
    return impl_->stats(topic, channel);
}

// --- fake-nsqlookupd ----------------------------------------------------------------------------------
struct fake_nsqlookupd::impl {
    asio::any_io_executor ex;
    logger log;
    std::unique_ptr<http::server> http;
    std::map<std::string, std::vector<cg::nsq::proto::producer_info>> producers;
    std::uint64_t lookups = 0;
};

fake_nsqlookupd::fake_nsqlookupd(asio::any_io_executor ex, logger log)
    : impl_(std::make_shared<impl>(impl{ex, std::move(log), nullptr, {}, 0})) {}

fake_nsqlookupd::~fake_nsqlookupd() {
    stop();
}

result<void> fake_nsqlookupd::start(const net::host_port& addr) {
    std::weak_ptr<impl> w = impl_;
    http::router r;
    r.add("GET", "/ping", [](http::request&) -> asio::awaitable<http::response> { co_return ok_text(); });
    r.add("GET", "/lookup", [w](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        ++s->lookups;
        auto t = http::query_param(req.query(), "topic");
        if (!t) co_return json_error(400, "MISSING_ARG_TOPIC");
        auto it = s->producers.find(*t);
        if (it == s->producers.end()) co_return json_error(404, "TOPIC_NOT_FOUND");
        auto resp = http::make_response(200, cg::nsq::proto::to_lookup_json({}, it->second),
                                        "application/json; charset=utf-8");
        resp.headers.add("X-Nsq-Content-Type", "nsq; version=1.0");
        co_return resp;
    });
    http::server_options so;
    so.server_name = "fake-nsqlookupd";
    impl_->http = std::make_unique<http::server>(impl_->ex, std::move(r), so, impl_->log);
    auto ep = impl_->http->listen(addr);
    if (!ep) return ep.err();
    impl_->http->start();
    return {};
}

void fake_nsqlookupd::stop() {
    if (impl_->http) impl_->http->stop();
}

std::uint16_t fake_nsqlookupd::http_port() const {
    return impl_->http ? impl_->http->local_endpoint().port() : 0;
}

void fake_nsqlookupd::add_producer(const std::string& topic, cg::nsq::proto::producer_info p) {
    auto& v = impl_->producers[topic];
    std::erase_if(v, [&](const auto& o) { return o.key() == p.key(); });
    v.push_back(std::move(p));
}

void fake_nsqlookupd::remove_producer(const std::string& topic, const std::string& key) {
    auto it = impl_->producers.find(topic);
    if (it == impl_->producers.end()) return;
    std::erase_if(it->second, [&](const auto& o) { return o.key() == key; });
    if (it->second.empty()) impl_->producers.erase(it);
}

std::uint64_t fake_nsqlookupd::lookups() const {
    return impl_->lookups;
}

}  // namespace cg::test::nsq
