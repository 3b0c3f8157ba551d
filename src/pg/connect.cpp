// pg::connection: connect planning (Asio resolves, libpq gets hostaddr) and the PQconnectPoll driver.
#include <asio/ip/address.hpp>
#include <asio/this_coro.hpp>

#include "net/resolve.hpp"
#include "pg/connection_impl.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

namespace {

bool looks_like_auth_failure(PGconn* c, std::string_view msg) {
    if (PQconnectionNeedsPassword(c)) return true;
    for (auto needle : {"password authentication failed", "authentication failed", "no password supplied",
                        "no pg_hba.conf entry", "SCRAM"})
        if (msg.find(needle) != std::string_view::npos) return true;
    return false;
}

}  // namespace

net::awaitable<result<std::vector<connection::attempt>>> connection::plan_attempts(const config& cfg) {
    std::vector<attempt> out;
    std::string last_error;
    for (const auto& ep : cfg.endpoints) {
        if (!ep.hostaddr.empty() || ep.is_unix_socket() || ep.host.empty()) {
            out.push_back({ep.host, ep.hostaddr, ep.port});
            continue;
        }
        std::error_code parse_ec;
        asio::ip::make_address(ep.host, parse_ec);
        if (!parse_ec) {  // already numeric
            out.push_back({ep.host, ep.host, ep.port});
            continue;
        }
        auto results = co_await net::resolve(ep.host, ep.port, cfg.connect_timeout);
        if (!results) {
            last_error = results.err().message;  // "resolve <host>: <why>"
            continue;
        }
        for (const auto& r : *results) out.push_back({ep.host, r.endpoint().address().to_string(), ep.port});
    }
    if (out.empty())
        co_return error(errc::connection_failed, last_error.empty() ? "no server to connect to" : last_error);
    co_return out;
}

net::awaitable<result<std::unique_ptr<connection>>> connection::connect(const config& cfg,
                                                                        asio::any_io_executor offload,
                                                                        connection_options opts, logger log,
                                                                        std::shared_ptr<stats> st) {
    auto ex = co_await asio::this_coro::executor;
    auto plan = co_await plan_attempts(cfg);
    if (!plan) {
        if (st) st->connect_done(false);
        co_return plan.err();
    }
    error last;
    for (const auto& a : *plan) {
        std::unique_ptr<connection> c(new connection(ex, offload, opts, log, st));
        auto r = co_await c->start(cfg, a);
        if (st) st->connect_done(static_cast<bool>(r));
        if (r) {
            c->log_ = log.with({{"backend_pid", c->backend_pid()}});
            co_return c;
        }
        last = r.err();
        // Wrong credentials or a cancelled caller will not get better on the next address.
        if (last.code == errc::auth_failed || last.code == errc::canceled) break;
    }
    co_return last;
}

net::awaitable<result<void>> connection::start(const config& cfg, const attempt& a) {
    std::vector<const char*> keys, vals;
    for (const auto& [k, v] : cfg.keywords) {
        if (k == "options") continue;
        keys.push_back(k.c_str());
        vals.push_back(v.c_str());
    }
    // Results are decoded from text: pin the formats the decoders expect (types.hpp).
    std::string options(cfg.get("options"));
    options += " -c DateStyle=ISO,YMD -c TimeZone=UTC -c bytea_output=hex";
    keys.push_back("options");
    vals.push_back(options.c_str());
    if (!a.host.empty()) keys.push_back("host"), vals.push_back(a.host.c_str());
    if (!a.hostaddr.empty()) keys.push_back("hostaddr"), vals.push_back(a.hostaddr.c_str());
    keys.push_back("port"), vals.push_back(a.port.c_str());
    keys.push_back(nullptr), vals.push_back(nullptr);

    conn_ = PQconnectStartParams(keys.data(), vals.data(), 0);
    if (!conn_) co_return error(errc::connection_failed, "libpq: out of memory");
    PQsetNoticeReceiver(conn_, &connection::on_notice, this);
    if (PQstatus(conn_) == CONNECTION_BAD) co_return error(errc::connection_failed, conn_message());

    op o{deadline_after(cfg.connect_timeout)};
    auto st = PGRES_POLLING_WRITING;  // libpq: behave as if PQconnectPoll had asked for writability
    for (;;) {
        reassign_socket();  // libpq may have opened a new socket (next address, SSL retry, …)
        if (st == PGRES_POLLING_OK) break;
        if (st == PGRES_POLLING_FAILED) {
            auto msg = conn_message();
            co_return error(looks_like_auth_failure(conn_, msg) ? errc::auth_failed : errc::connection_failed,
                            msg);
        }
        auto w = co_await wait_io(st == PGRES_POLLING_READING ? want::read : want::write, o.deadline);
        if (w.ec == errc::timeout)
            co_return error(
                errc::connection_failed,
                "connection to " + (a.host.empty() ? std::string("the default socket") : a.host) + " port " +
                    a.port + " timed out after " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::milliseconds>(cfg.connect_timeout).count()) +
                    " ms");
        if (w.ec == errc::canceled) co_return error(errc::canceled, "connect cancelled");
        st = PQconnectPoll(conn_);
    }
    if (PQsetnonblocking(conn_, 1) != 0) co_return error(errc::connection_failed, conn_message());
    last_used_ = clock::now();
    co_return result<void>{};
}

void connection::reassign_socket() {
    // Release (never close) and re-register every time: libpq can close a socket and get the same fd number
    // for the next one, which a "did the number change?" test would miss.
    sd_.release();
    int fd = PQsocket(conn_);
    if (fd >= 0) {
        std::error_code ec;
        sd_.assign(fd, ec);
        if (ec) log_.warn("could not register the PostgreSQL socket", {{"error", ec.message()}});
    }
}

}  // namespace cg::pg
