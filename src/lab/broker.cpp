#include <signal.h>
#include <simdjson.h>

#include <cstdio>
#include <filesystem>

#include "lab/run_state.hpp"
#include "net/offload.hpp"

namespace cg::lab {

// Blocking work for the offload pool.
net::awaitable<std::optional<child>> spawn_and_wait_line(std::vector<std::string> argv, std::string err_path,
                                                         std::string* line) {
    auto c = child::spawn(argv, err_path);
    if (!c) co_return std::nullopt;
    if (line) {
        auto l = c->read_line(10s);
        if (!l) co_return std::nullopt;
        *line = *l;
    }
    co_return std::move(*c);
}

net::awaitable<int> stop_child(child c, int sig) {
    co_return c.stop(sig, 10s);
}

// The body of a 200 answer from nsqd's or fake-stripe's HTTP API; anything else is an error.
result<std::string> body_of(http::client_result res) {
    if (!res.ok()) return res.err;
    if (res.resp.status != 200)
        return error(std::make_error_code(std::errc::protocol_error),
                     "HTTP " + std::to_string(res.resp.status) + ": " + res.resp.body);
    return std::move(res.resp.body);
}

net::awaitable<result<std::string>> http_call(http::client& c, std::string method, std::string target,
                                              std::string body) {
    http::request r;
    r.method = std::move(method);
    r.target = std::move(target);
    r.body = std::move(body);
    co_return body_of(co_await c.request(std::move(r)));
}

net::awaitable<channel_stats> stats_of(lab::broker& b, const std::string& topic) {
    channel_stats out;
    auto body = co_await http_call(*b.http, "GET",
                                   "/stats?format=json&topic=" + topic + "&channel=" + channel_name, "");
    if (!body) co_return out;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(*body).get(doc)) co_return out;
    simdjson::dom::array topics;
    if (doc["topics"].get(topics)) co_return out;
    for (auto t : topics) {
        std::string_view name;
        if (t["topic_name"].get(name) || name != topic) continue;
        std::int64_t d = 0;
        if (!t["depth"].get(d)) out.topic_depth = d;
        simdjson::dom::array chans;
        if (t["channels"].get(chans)) continue;
        for (auto c : chans) {
            std::string_view cn;
            if (c["channel_name"].get(cn) || cn != channel_name) continue;
            out.found = true;
            std::int64_t v = 0;
            if (!c["depth"].get(v)) out.depth = v;
            if (!c["in_flight_count"].get(v)) out.in_flight = v;
            if (!c["deferred_count"].get(v)) out.deferred = v;
            if (!c["timeout_count"].get(v)) out.timeouts = v;
        }
    }
    co_return out;
}

// nsqd's timeout counts for the run's topic, added up before a broker goes away.
net::awaitable<void> add_timeouts(run_t& v) {
    for (auto& b : v.brokers)
        v.timeouts += static_cast<std::uint64_t>((co_await stats_of(*b, v.topic)).timeouts);
}

net::awaitable<result<std::unique_ptr<lab::broker>>> lab::start_broker(bool real, std::string data_dir) {
    // A real nsqd is given ports that were free a moment ago; another process on the machine may take one
    // first. nsqd then exits, or a /ping is answered by someone else's server: start again on new ports.
    for (int attempt = 1;; ++attempt) {
        auto b = co_await start_broker_once(real, data_dir);
        if (b || !real || attempt == 5) co_return b;
        log_.warn("nsqd did not start; again on new ports", {{"reason", b.err().describe()}});
    }
}

net::awaitable<result<std::unique_ptr<lab::broker>>> lab::start_broker_once(bool real, std::string data_dir) {
    auto b = std::make_unique<broker>();
    b->real = real;
    b->data_dir = data_dir;
    std::string line;
    std::vector<std::string> argv;
    std::string err_log = opts_.work_dir + (real ? "/nsqd.log" : "/fake-nsqd.log");
    unsigned tcp = 0, http = 0;
    if (real) {
        auto tp = free_port();
        auto hp = free_port();
        if (!tp || !hp) co_return error(std::make_error_code(std::errc::address_in_use), "no free port");
        tcp = *tp;
        http = *hp;
        std::filesystem::create_directories(data_dir);
        argv = {opts_.nsqd_bin,
                "--tcp-address=127.0.0.1:" + std::to_string(tcp),
                "--http-address=127.0.0.1:" + std::to_string(http),
                "--data-path=" + data_dir,
                "--msg-timeout=" + std::to_string(opts_.msg_timeout.count()) + "ms",
                "--broadcast-address=127.0.0.1",
                "--log-level=warn"};
    } else {
        // fake-nsqd picks its ports and says which on its first line.
        argv = {opts_.fake_nsqd_bin, "--msg-timeout-ms", std::to_string(opts_.msg_timeout.count())};
    }
    auto p = co_await net::offload(offload_.get_executor(),
                                   spawn_and_wait_line(argv, err_log, real ? nullptr : &line));
    if (!p) co_return error(std::make_error_code(std::errc::no_such_process), "did not start: " + argv[0]);
    b->proc = std::move(*p);
    if (!real && std::sscanf(line.c_str(), "tcp=%u http=%u", &tcp, &http) != 2)
        co_return error(std::make_error_code(std::errc::protocol_error), "fake-nsqd said: " + line);
    b->tcp_address = "127.0.0.1:" + std::to_string(tcp);
    b->http_address = "127.0.0.1:" + std::to_string(http);
    b->started = sclock::now();
    http::client_options ho;
    ho.request_timeout = 5s;
    ho.connect_timeout = 2s;
    auto hc = http::client::create(offload_.get_executor(), "http://" + b->http_address, ho, log_);
    if (!hc) co_return hc.err();
    b->http = std::move(*hc);
    // Up when /ping answers (a real nsqd: /info, with our ports, while our process still runs).
    auto deadline = sclock::now() + 10s;
    for (;;) {
        if (b->proc.exited())
            co_return error(std::make_error_code(std::errc::address_in_use), argv[0] + " exited at start");
        if (auto r = co_await http_call(*b->http, "GET", real ? "/info" : "/ping", ""); r) {
            if (!real) break;  // fake-nsqd bound its own ports before it said which
            simdjson::dom::parser parser;
            simdjson::dom::element info;
            std::int64_t port = 0;
            if (parser.parse(*r).get(info) || info["tcp_port"].get(port) ||
                port != static_cast<std::int64_t>(tcp))
                co_return error(std::make_error_code(std::errc::address_in_use),
                                b->http_address + " is another server's: " + *r);
            if (b->proc.exited())
                co_return error(std::make_error_code(std::errc::address_in_use),
                                argv[0] + " exited at start");
            break;
        }
        if (sclock::now() > deadline)
            co_return error(std::make_error_code(std::errc::timed_out), "nsqd /info");
        co_await net::sleep_for(50ms);
    }
    co_return std::move(b);
}

net::awaitable<void> lab::stop_broker(std::unique_ptr<broker> b) {
    b->http.reset();
    // SIGTERM: a real nsqd writes its in-flight and queued messages to --data-path before it exits.
    co_await net::offload(offload_.get_executor(), stop_child(std::move(b->proc), SIGTERM));
}

net::awaitable<void> lab::channel_op(variant_run& v, std::string op) {
    auto r = co_await http_call(*v.brokers[0]->http, "POST",
                                "/channel/" + op + "?topic=" + v.topic + "&channel=" + channel_name, "");
    if (!r) throw std::runtime_error("channel/" + op + ": " + r.err().describe());
}

}  // namespace cg::lab
