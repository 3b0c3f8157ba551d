#include "app/consume_validate.hpp"

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "app/cli.hpp"
#include "http/client.hpp"
#include "net/address.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "pg/pool.hpp"

namespace cg::app {
namespace {

// --validate: one TCP connection to nsqd, "" when it connected, else why not (within 5 s).
net::awaitable<std::string> tcp_reach(std::string address) {
    auto hp = net::parse_host_port(address);
    if (!hp) co_return hp.err().describe();
    auto ex = co_await asio::this_coro::executor;
    asio::ip::tcp::resolver resolver(ex);
    std::error_code ec;
    auto endpoints = co_await resolver.async_resolve(hp->host, std::to_string(hp->port),
                                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return "resolving " + hp->host + ": " + ec.message();
    asio::ip::tcp::socket socket(ex);
    co_await asio::async_connect(socket, endpoints, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return "connecting: " + ec.message();
    co_return std::string();
}

// --validate: nsqlookupd's GET /ping, "" on 200.
net::awaitable<std::string> lookupd_reach(std::string address) {
    std::string origin = address.rfind("http", 0) == 0 ? address : "http://" + address;
    http::client_options o;
    o.connect_timeout = std::chrono::seconds(5);
    o.request_timeout = std::chrono::seconds(5);
    o.max_connections = 1;
    auto cl = http::client::create(co_await asio::this_coro::executor, origin, o, logger());
    if (!cl) co_return cl.err().describe();
    http::request req;
    req.target = "/ping";
    auto r = co_await (*cl)->request(std::move(req));
    if (!r.ok()) co_return r.err.describe();
    if (r.resp.status != 200) co_return "answered " + std::to_string(r.resp.status);
    co_return std::string();
}

void validation_line(int& failed, const std::string& what, const std::string& why) {
    std::printf("%s %s%s%s\n", why.empty() ? "ok  " : "FAIL", what.c_str(), why.empty() ? "" : ": ",
                why.c_str());
    std::fflush(stdout);
    if (!why.empty()) ++failed;
}

// Every dependency reached once: a PostgreSQL connection, each nsqd (TCP) or nsqlookupd (/ping), and Stripe
// with the key (GET /v1/charges?limit=1: read-only, answered 401 for a bad key). Exit 0 when all answered,
// 78 otherwise: this configuration does not work from here.
net::awaitable<int> validate_dependencies(const nsq::consumer_config* n, std::shared_ptr<pg::pool> pool,
                                          stripe::client* stripe) {
    int failed = 0;
    auto c = co_await pool->acquire();
    validation_line(failed, "postgres", c ? std::string() : c.err().describe());
    if (c) c->release();
    for (const auto& a : n->nsqd_tcp_addresses) {
        auto r = co_await net::with_timeout(tcp_reach(a), std::chrono::seconds(5));
        validation_line(failed, "nsqd " + a, r ? *r : "no connection within 5 s");
    }
    for (const auto& a : n->lookupd_http_addresses)
        validation_line(failed, "nsqlookupd " + a, co_await lookupd_reach(a));
    auto s = co_await stripe->call("GET", "/v1/charges?limit=1", "", "");
    validation_line(failed, "stripe", s.cls == stripe::outcome_class::succeeded ? std::string() : s.message);
    co_return failed == 0 ? exit_ok : exit_config;
}

}  // namespace

int validate_consume(const pg_flags& pg, const nsq::consumer_config& ncfg, stripe::client_config scfg,
                     const logger& log) {
    asio::io_context io{1};
    net::offload_pool off{1};
    auto client = stripe::client::create(off.get_executor(), std::move(scfg), log);
    if (!client) {
        std::printf("FAIL stripe: %s\n", client.err().describe().c_str());
        return exit_config;
    }
    auto opts = to_pool_options(pg);
    opts.size = 1;
    auto pool = pg::pool::create(io.get_executor(), off.get_executor(), std::move(opts), log);
    int rc = run_then_close_pool(io, pool, validate_dependencies(&ncfg, pool, client->get()),
                                 "consume --validate");
    client->reset();
    off.drain();
    return rc == exit_failure ? exit_config : rc;
}

}  // namespace cg::app
