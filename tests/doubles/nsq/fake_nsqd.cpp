// fake-nsqd's interface (fake_nsqd.hpp): start and stop, the HTTP API with /stats in nsqd 1.3.0's JSON, and
// the test controls; the server's state is in nsqd_state.hpp.
#include "fake_nsqd.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>

#include "core/bytes.hpp"
#include "http/server.hpp"
#include "net/tokens.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/server_codec.hpp"
#include "nsqd_state.hpp"

namespace cg::test::nsq {

namespace proto = cg::nsq::proto;
using namespace std::chrono;
using namespace nsqd_detail;

void rdy_ledger::set(const void* client, std::int64_t rdy) {
    auto& cur = per_client[client];
    total += rdy - cur;
    cur = rdy;
    peak = std::max(peak, total);
    if (limit > 0 && total > limit) ++violations;
}

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

}  // namespace cg::test::nsq
