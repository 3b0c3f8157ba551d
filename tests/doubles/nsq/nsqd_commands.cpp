// fake-nsqd's TCP protocol commands (IDENTIFY, AUTH, SUB, RDY, FIN, REQ, TOUCH, CLS, PUB, DPUB, MPUB) with
// nsqd's checks, error frames and wording.

#include "nsq/proto/commands.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/proto/message.hpp"
#include "nsq/proto/server_codec.hpp"
#include "nsqd_state.hpp"

namespace cg::test::nsq {

namespace proto = cg::nsq::proto;
using namespace std::chrono;
using namespace nsqd_detail;

asio::awaitable<exec_result> fake_nsqd::impl::exec(client& cl, const std::vector<std::string_view>& p,
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

asio::awaitable<exec_result> fake_nsqd::impl::identify(client& cl, const std::vector<std::string_view>&,
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
    if (auto r =
            proto::check_heartbeat_interval(req->heartbeat_interval_ms, opts.max_heartbeat_interval.count());
        !r)
        co_return fatal("E_BAD_BODY", "IDENTIFY " + r.err().message);
    auto obs = req->output_buffer_size, obt = req->output_buffer_timeout;
    if (!(obs == -1 || obs == 0 || (obs >= 64 && obs <= 64 * 1024)))
        co_return fatal("E_BAD_BODY", "IDENTIFY output buffer size (" + std::to_string(obs) + ") is invalid");
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

exec_result fake_nsqd::impl::sub(client& cl, const std::vector<std::string_view>& p) {
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

exec_result fake_nsqd::impl::rdy(client& cl, const std::vector<std::string_view>& p) {
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

std::variant<in_flight_entry*, client_error> fake_nsqd::impl::in_flight_for(
    client& cl, const std::vector<std::string_view>& p, std::string_view cmd, std::size_t nparams,
    std::string_view failed_code) {
    if (cl.state != cstate::subscribed && cl.state != cstate::closing)
        return fatal("E_INVALID", "cannot " + std::string(cmd) + " in current state");
    if (p.size() < nparams) return fatal("E_INVALID", std::string(cmd) + " insufficient number of params");
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

exec_result fake_nsqd::impl::fin(client& cl, const std::vector<std::string_view>& p) {
    auto r = in_flight_for(cl, p, "FIN", 2, "E_FIN_FAILED");
    if (auto* e = std::get_if<client_error>(&r)) return *e;
    cl.ch->in_flight.erase(std::get<in_flight_entry*>(r)->m.id);
    --cl.in_flight;
    ++cl.finish_count;
    ++cl.ch->finish_count;
    pump(*cl.ch);
    return std::nullopt;
}

exec_result fake_nsqd::impl::req(client& cl, const std::vector<std::string_view>& p) {
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

exec_result fake_nsqd::impl::touch(client& cl, const std::vector<std::string_view>& p) {
    auto r = in_flight_for(cl, p, "TOUCH", 2, "E_TOUCH_FAILED");
    if (auto* e = std::get_if<client_error>(&r)) return *e;
    auto* entry = std::get<in_flight_entry*>(r);
    auto deadline = sclock::now() + cl.msg_timeout;
    if (deadline - entry->delivered >= opts.max_msg_timeout)
        deadline = entry->delivered + opts.max_msg_timeout;
    entry->deadline = deadline;
    return std::nullopt;
}

exec_result fake_nsqd::impl::cls(client& cl) {
    if (cl.state != cstate::subscribed) return fatal("E_INVALID", "cannot CLS in current state");
    cl.state = cstate::closing;
    cl.rdy = 0;
    check_rdy(cl);
    send_response(cl, "CLOSE_WAIT");
    return std::nullopt;
}

asio::awaitable<std::variant<std::string, client_error>> fake_nsqd::impl::read_msg_body(
    client& cl, std::string_view cmd, sclock::time_point dl) {
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

asio::awaitable<exec_result> fake_nsqd::impl::pub(client& cl, const std::vector<std::string_view>& p,
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

asio::awaitable<exec_result> fake_nsqd::impl::dpub(client& cl, const std::vector<std::string_view>& p,
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

asio::awaitable<exec_result> fake_nsqd::impl::mpub(client& cl, const std::vector<std::string_view>& p,
                                                   sclock::time_point dl) {
    if (p.size() < 2) co_return fatal("E_INVALID", "MPUB insufficient number of parameters");
    std::string tn(p[1]);
    if (!proto::valid_topic_name(tn))
        co_return fatal("E_BAD_TOPIC", "E_BAD_TOPIC MPUB topic name " + json_escape(tn) + " is not valid");
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
            co_return fatal("E_BAD_MESSAGE", "MPUB invalid message(" + std::to_string(i) + ") body size " +
                                                 std::to_string(*sz));
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

asio::awaitable<exec_result> fake_nsqd::impl::auth(client& cl, const std::vector<std::string_view>& p,
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
    if (it->second.permission_count <= 0) co_return fatal("E_UNAUTHORIZED", "AUTH no authorizations found");
    cl.auth = &it->second;
    proto::auth_response r;
    r.identity = it->second.identity;
    r.identity_url = it->second.identity_url;
    r.permission_count = it->second.permission_count;
    send_response(cl, proto::to_json(r));
    co_return std::nullopt;
}

exec_result fake_nsqd::impl::check_auth(const client& cl, std::string_view cmd) const {
    if (opts.auth_secrets.empty() || cl.auth) return std::nullopt;
    return fatal("E_AUTH_FIRST", "AUTH required before " + std::string(cmd));
}

}  // namespace cg::test::nsq
