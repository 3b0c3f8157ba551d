// vault_proxy bench: the load generator (workers POSTing charges, each with its own idempotency key), its
// HTTP clients and the latency percentiles.
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <exception>
#include <stdexcept>

#include "tests/bench/proxy/vault_proxy.hpp"

namespace vault_bench {

using namespace cg;

namespace {

struct load {
    std::vector<http::client*> clients;
    std::string auth;
    std::string prefix;
    clock_type::time_point until;
    std::vector<double> lat_ms;
    std::size_t ok = 0, failed = 0;
    std::uint64_t seq = 0;
};

net::awaitable<void> worker(load* l, std::size_t index) {
    http::client* c = l->clients[index % l->clients.size()];
    while (clock_type::now() < l->until) {
        http::request q;
        q.method = "POST";
        q.target = "/v1/charges";
        q.body = "amount=1999&currency=usd&customer=cus_bench&description=bench&metadata[billing_key]=bk";
        q.headers.add("Authorization", l->auth);
        q.headers.add("Content-Type", "application/x-www-form-urlencoded");
        q.headers.add("Idempotency-Key", l->prefix + std::to_string(++l->seq));
        auto t0 = clock_type::now();
        auto r = co_await c->request(std::move(q));
        double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        if (r.ok() && r.resp.status == 200) {
            ++l->ok;
            l->lat_ms.push_back(ms);
        } else {
            ++l->failed;
        }
    }
}

}  // namespace

double pct(std::vector<double>& v, double p) {
    if (v.empty()) return 0;
    std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
}

run_result run_load(asio::io_context& io, std::vector<http::client*> clients, std::string auth,
                    std::string prefix, int concurrency, double seconds) {
    load l;
    l.clients = std::move(clients);
    l.auth = std::move(auth);
    l.prefix = std::move(prefix);
    auto start = clock_type::now();
    l.until =
        start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
    int left = concurrency;
    for (int i = 0; i < concurrency; ++i)
        asio::co_spawn(io, worker(&l, static_cast<std::size_t>(i)), [&left](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
            --left;
        });
    io.restart();
    while (left > 0) io.run_one();
    double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
    run_result out;
    out.ok = l.ok;
    out.failed = l.failed;
    out.rps = static_cast<double>(l.ok) / elapsed;
    out.p50_ms = pct(l.lat_ms, 0.50);
    out.p99_ms = pct(l.lat_ms, 0.99);
    out.elapsed = elapsed;
    out.lat_ms = std::move(l.lat_ms);
    return out;
}

void add_slice(run_result& total, run_result slice) {
    total.ok += slice.ok;
    total.failed += slice.failed;
    total.elapsed += slice.elapsed;
    total.lat_ms.insert(total.lat_ms.end(), slice.lat_ms.begin(), slice.lat_ms.end());
}
void finish(run_result& r) {
    r.rps = static_cast<double>(r.ok) / std::max(1e-9, r.elapsed);
    r.p50_ms = pct(r.lat_ms, 0.50);
    r.p99_ms = pct(r.lat_ms, 0.99);
}

std::vector<std::unique_ptr<http::client>> clients_for(net::offload_pool& pool, const std::string& base,
                                                       std::shared_ptr<asio::ssl::context> tls,
                                                       int concurrency) {
    std::vector<std::unique_ptr<http::client>> out;
    int n = std::min(4, std::max(1, concurrency / 8));  // one strand per client: spread the TLS work
    for (int i = 0; i < n; ++i) {
        http::client_options o;
        o.tls = tls;
        o.max_connections = static_cast<std::size_t>((concurrency + n - 1) / n);
        o.request_timeout = std::chrono::seconds(30);
        auto c = http::client::create(pool.get_executor(), base, o, logger());
        if (!c) throw std::runtime_error(c.err().describe());
        out.push_back(std::move(*c));
    }
    return out;
}

std::vector<http::client*> raw(const std::vector<std::unique_ptr<http::client>>& v) {
    std::vector<http::client*> out;
    for (const auto& c : v) out.push_back(c.get());
    return out;
}

}  // namespace vault_bench
