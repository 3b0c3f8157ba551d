// The HTTP face of nsqd, real or fake, for tests (harness.hpp includes it): one HTTP/1.1 exchange with a
// loopback port, /stats parsed for one channel and its clients, and the API calls scenarios make (/mpub,
// channel create, pause …).
#pragma once

#include <simdjson.h>

#include <asio/ip/tcp.hpp>
#include <asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"
#include "net/timeout.hpp"
#include "net/tokens.hpp"

namespace nsqreal {

using namespace std::chrono;

struct http_reply {
    int status = 0;
    std::string body;
};

// One HTTP/1.1 exchange with 127.0.0.1:port (Connection: close). Throws on I/O failure or timeout.
inline asio::awaitable<http_reply> http_call(std::uint16_t port, std::string method, std::string target,
                                             std::string body = {}, milliseconds limit = seconds(5)) {
    struct outcome {
        std::string err;
        http_reply r;
    };
    auto exchange = [](std::uint16_t port, std::string method, std::string target,
                       std::string body) -> asio::awaitable<outcome> {
        cg::net::tcp_socket sock(co_await asio::this_coro::executor);
        auto [cec] = co_await sock.async_connect({asio::ip::make_address("127.0.0.1"), port});
        if (cec) co_return outcome{"connect: " + cec.message(), {}};
        cg::http::request req;
        req.method = method;
        req.target = target;
        req.headers.add("Host", "127.0.0.1:" + std::to_string(port));
        req.headers.add("Connection", "close");
        req.body = std::move(body);
        std::string out;
        cg::http::serialize(req, out);
        auto [wec, wn] = co_await asio::async_write(sock, asio::buffer(out), cg::net::nothrow);
        if (wec) co_return outcome{"write: " + wec.message(), {}};
        cg::http::response_parser parser;
        char buf[16384];
        for (;;) {
            auto [ec, n] = co_await sock.async_read_some(asio::buffer(buf));
            if (ec) {
                parser.feed_eof();
            } else {
                parser.feed(std::string_view(buf, n));
            }
            if (parser.state() == cg::http::parse_state::done)
                co_return outcome{{}, {parser.message().status, parser.message().body}};
            if (parser.state() == cg::http::parse_state::failed || ec) co_return outcome{"bad response", {}};
        }
    };
    auto r = co_await cg::net::with_timeout(
        exchange(port, std::move(method), std::move(target), std::move(body)), limit);
    if (!r) throw std::runtime_error("HTTP " + target + " timed out");
    if (!r->err.empty()) throw std::runtime_error("HTTP " + target + ": " + r->err);
    co_return r->r;
}

// What /stats says about one channel and its clients.
struct client_stats {
    std::string client_id;
    std::int64_t ready_count = 0, in_flight_count = 0;
    std::uint64_t message_count = 0, finish_count = 0, requeue_count = 0;
    bool tls = false, snappy = false, deflate = false, authed = false;
    std::string auth_identity;
};
struct channel_stats {
    bool found = false;
    std::int64_t depth = 0, in_flight_count = 0, deferred_count = 0, client_count = 0;
    std::uint64_t message_count = 0, requeue_count = 0, timeout_count = 0;
    bool paused = false;
    std::vector<client_stats> clients;
    std::int64_t ready_sum() const {
        std::int64_t s = 0;
        for (const auto& c : clients) s += c.ready_count;
        return s;
    }
};

inline std::int64_t int_field(simdjson::dom::object o, const char* k) {
    simdjson::dom::element v;
    if (o.at_key(k).get(v) != simdjson::SUCCESS) return 0;
    std::int64_t i = 0;
    if (v.get_int64().get(i) == simdjson::SUCCESS) return i;
    std::uint64_t u = 0;
    if (v.get_uint64().get(u) == simdjson::SUCCESS) return static_cast<std::int64_t>(u);
    return 0;
}
inline bool bool_field(simdjson::dom::object o, const char* k) {
    bool b = false;
    simdjson::dom::element v;
    if (o.at_key(k).get(v) == simdjson::SUCCESS && v.get_bool().get(b) != simdjson::SUCCESS) b = false;
    return b;
}
inline std::string string_field(simdjson::dom::object o, const char* k) {
    std::string_view s;
    simdjson::dom::element v;
    if (o.at_key(k).get(v) == simdjson::SUCCESS && v.get_string().get(s) != simdjson::SUCCESS) s = {};
    return std::string(s);
}

inline channel_stats parse_channel_stats(const std::string& json, const std::string& topic,
                                         const std::string& channel) {
    channel_stats out;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(json).get(doc) != simdjson::SUCCESS) throw std::runtime_error("bad /stats JSON: " + json);
    simdjson::dom::array topics;
    if (doc["topics"].get_array().get(topics) != simdjson::SUCCESS) return out;
    for (auto t : topics) {
        simdjson::dom::object to;
        if (t.get_object().get(to) != simdjson::SUCCESS || string_field(to, "topic_name") != topic) continue;
        simdjson::dom::array chans;
        if (to["channels"].get_array().get(chans) != simdjson::SUCCESS) continue;
        for (auto c : chans) {
            simdjson::dom::object co;
            if (c.get_object().get(co) != simdjson::SUCCESS || string_field(co, "channel_name") != channel)
                continue;
            out.found = true;
            out.depth = int_field(co, "depth");
            out.in_flight_count = int_field(co, "in_flight_count");
            out.deferred_count = int_field(co, "deferred_count");
            out.client_count = int_field(co, "client_count");
            out.message_count = static_cast<std::uint64_t>(int_field(co, "message_count"));
            out.requeue_count = static_cast<std::uint64_t>(int_field(co, "requeue_count"));
            out.timeout_count = static_cast<std::uint64_t>(int_field(co, "timeout_count"));
            out.paused = bool_field(co, "paused");
            simdjson::dom::array clients;
            if (co["clients"].get_array().get(clients) == simdjson::SUCCESS) {
                for (auto cl : clients) {
                    simdjson::dom::object o;
                    if (cl.get_object().get(o) != simdjson::SUCCESS) continue;
                    client_stats s;
                    s.client_id = string_field(o, "client_id");
                    s.ready_count = int_field(o, "ready_count");
                    s.in_flight_count = int_field(o, "in_flight_count");
                    s.message_count = static_cast<std::uint64_t>(int_field(o, "message_count"));
                    s.finish_count = static_cast<std::uint64_t>(int_field(o, "finish_count"));
                    s.requeue_count = static_cast<std::uint64_t>(int_field(o, "requeue_count"));
                    s.tls = bool_field(o, "tls");
                    s.snappy = bool_field(o, "snappy");
                    s.deflate = bool_field(o, "deflate");
                    s.authed = bool_field(o, "authed");
                    s.auth_identity = string_field(o, "auth_identity");
                    out.clients.push_back(s);
                }
            }
        }
    }
    return out;
}

// The HTTP face shared by real nsqd and fake-nsqd.
struct nsqd_http {
    std::uint16_t port = 0;

    asio::awaitable<channel_stats> stats(std::string topic, std::string channel) {
        auto r = co_await http_call(port, "GET", "/stats?format=json&topic=" + topic + "&channel=" + channel);
        if (r.status != 200) throw std::runtime_error("/stats answered " + std::to_string(r.status));
        co_return parse_channel_stats(r.body, topic, channel);
    }
    // Newline-separated bodies (no newline inside one).
    asio::awaitable<void> mpub(std::string topic, std::vector<std::string> bodies) {
        std::string b;
        for (const auto& x : bodies) b += x + "\n";
        auto r = co_await http_call(port, "POST", "/mpub?topic=" + topic, b);
        if (r.status != 200)
            throw std::runtime_error("/mpub answered " + std::to_string(r.status) + " " + r.body);
    }
    asio::awaitable<void> post(std::string target) {
        auto r = co_await http_call(port, "POST", target);
        if (r.status != 200)
            throw std::runtime_error(target + " answered " + std::to_string(r.status) + " " + r.body);
    }
    asio::awaitable<void> create_channel(std::string topic, std::string channel) {
        co_await post("/topic/create?topic=" + topic);
        co_await post("/channel/create?topic=" + topic + "&channel=" + channel);
    }
    asio::awaitable<void> pause_channel(std::string topic, std::string channel, bool paused) {
        co_await post(std::string(paused ? "/channel/pause" : "/channel/unpause") + "?topic=" + topic +
                      "&channel=" + channel);
    }
};

}  // namespace nsqreal
