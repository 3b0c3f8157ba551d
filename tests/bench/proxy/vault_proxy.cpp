// Benchmark: requests/s and added latency of `chargeguard proxy` (the real binary, a child process) against
// calling fake-stripe directly, in the same run, at 1, 32 and 256 concurrent clients; plus the proxy's peak
// RSS (VmHWM of the child).
//
//   direct:  load generator --HTTPS--> fake-stripe
//   proxy:   load generator --HTTP (loopback sidecar)--> chargeguard proxy --HTTPS--> fake-stripe
//
// Every request is a POST /v1/charges with its own Idempotency-Key, so every proxied one is authenticated,
// reserved in PostgreSQL (cg_vault_step), forwarded, settled (after the answer) and audited. Added latency =
// proxy − direct at each percentile, same load generator, same fake-stripe, same concurrency; the two paths
// alternate in three slices of SECONDS/3 each so both see the same background load of a shared machine. For
// every run it also prints the CPU time per request of each party (load generator, fake-stripe's thread, the
// proxy process, the PostgreSQL backends of the scratch database), read from /proc: on a small machine they
// share the cores, and that decides the ratio. With --latency-ms N it repeats the 32 and 256 client runs with
// fake-stripe answering after N ms (what a real Stripe does), where the proxy's added latency is what a
// caller would notice. Needs PGHOST (a scratch database is created and dropped). With --trace-burst it runs
// only 32 clients at --latency-ms (default 50) with the proxy logging at debug, and prints where the time of
// a burst goes, per stage, from the proxy's "vault request stages" lines: when fake-stripe answers a constant
// latency, the 32 clients are synchronised and reach the proxy together. Usage: vault_proxy CHARGEGUARD_EXE
// [CERT_DIR] [SECONDS] [--latency-ms N] [--trace-burst] [PROXY_FLAG…]
//        (CERT_DIR defaults to $CG_TEST_CERTS; PROXY_FLAGs, e.g. --upstream-on-main, go to `chargeguard
//        proxy`)

#include "tests/bench/proxy/vault_proxy.hpp"

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "http/client.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "support/fake_stripe_thread.hpp"
#include "support/process_usage.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"
#include "tests/integration/pg/support.hpp"

using namespace cg;
using namespace vault_bench;

namespace {

// The fake on its own thread, with its thread's CPU time and a latency set from outside.
struct fake_thread : test::fake_stripe_thread {
    using fake_stripe_thread::fake_stripe_thread;
    double cpu() const { return cpu_seconds("/proc/self/task/" + std::to_string(tid.load()) + "/stat"); }
    void set_latency(int ms) {
        on_fake([this, ms] { fake->faults().latency_ms = ms; });
    }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: vault_proxy CHARGEGUARD_EXE [CERT_DIR] [SECONDS]\n");
        return 2;
    }
    if (!std::getenv("PGHOST")) {
        std::fprintf(stderr, "vault_proxy: PGHOST is not set (the proxy needs PostgreSQL)\n");
        return 2;
    }
    std::string exe = argv[1];
    const char* env_certs = std::getenv("CG_TEST_CERTS");
    std::string certs = argc > 2 ? argv[2] : env_certs ? env_certs : "";
    double seconds = argc > 3 ? std::atof(argv[3]) : 3.0;
    int latency_ms = 0;
    bool trace_burst = false;
    int only_conc = 0;
    std::vector<std::string> extra;
    std::string proxy_flags;
    for (int i = 4; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--latency-ms" && i + 1 < argc) {
            latency_ms = std::atoi(argv[++i]);
        } else if (a == "--trace-burst") {
            trace_burst = true;
        } else if (a == "--only-conc" && i + 1 < argc) {
            only_conc = std::atoi(argv[++i]);
        } else {
            extra.push_back(a);
            proxy_flags += ", " + a;
        }
    }
    if (certs.empty()) {
        std::fprintf(stderr, "vault_proxy: no cert dir (argument or CG_TEST_CERTS)\n");
        return 2;
    }

    test::scratch_db db("vault_bench");
    ::setenv("PGDATABASE", db.name.c_str(), 1);
    ::setenv("STRIPE_API_KEY", "sk_test_bench_real_key", 1);
    {
        child m({exe, "migrate"}, "migrate");
        if (m.wait() != 0) throw std::runtime_error("chargeguard migrate failed: " + slurp(m.err));
    }
    std::string secret;
    {
        child k({exe, "vault", "issue", "--name", "bench", "--period", "2026-11", "--currency", "usd",
                 "--expected-total-cents", "900000000000000"},
                "issue");
        if (k.wait() != 0) throw std::runtime_error("vault issue failed: " + slurp(k.err));
        secret = slurp(k.out);
        while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) secret.pop_back();
    }

    fake_thread fake(certs);
    std::string upstream = "https://127.0.0.1:" + std::to_string(fake.port);
    if (trace_burst && latency_ms == 0) latency_ms = 50;
    std::vector<std::string> proxy_args{exe,
                                        "--log-level",
                                        trace_burst ? "debug" : "info",
                                        "proxy",
                                        "--listen",
                                        "127.0.0.1:0",
                                        "--upstream",
                                        upstream,
                                        "--stripe-ca-file",
                                        certs + "/ca.pem",
                                        "--health-listen",
                                        "127.0.0.1:0",
                                        "--pg-pool-size",
                                        "8",
                                        "--upstream-max-connections",
                                        "256",
                                        "--max-connections",
                                        "4096",
                                        "--offload-threads",
                                        "2"};
    proxy_args.insert(proxy_args.end(), extra.begin(), extra.end());
    child proxy(proxy_args, "proxy");
    std::map<long, double> pg_seen;
    // The proxy logs its port once it listens (it logs nothing per request at info).
    std::uint16_t proxy_port = 0;
    std::regex listening(R"re("msg":"vault proxy listening".*"port":(\d+))re");
    for (int i = 0; i < 400 && proxy_port == 0; ++i) {
        std::smatch m;
        std::string log = slurp(proxy.err);
        if (std::regex_search(log, m, listening))
            proxy_port = static_cast<std::uint16_t>(std::stoi(m[1]));
        else
            std::this_thread::sleep_for(
                std::chrono::milliseconds(25));  // polling a child's startup, not a test
    }
    if (proxy_port == 0) throw std::runtime_error("the proxy did not start: " + slurp(proxy.err));

    asio::io_context io{1};
    net::offload_pool pool{4};
    auto tls = net::make_tls_client_context({certs + "/ca.pem"});
    if (!tls) throw std::runtime_error(tls.err().describe());

    std::printf(
        "vault_proxy: POST /v1/charges, %.1f s per run; proxy = chargeguard proxy (child, 2 offload threads, "
        "8 PostgreSQL connections%s), upstream fake-stripe over TLS\n",
        seconds, proxy_flags.c_str());
    struct cpu_snapshot {
        double self = 0, fake = 0, proxy = 0, pg = 0;
    };
    auto snapshot = [&] {
        cpu_snapshot c;
        c.self = cpu_seconds("/proc/self/stat");
        c.fake = fake.cpu();
        c.proxy = pid_cpu(proxy.pid);
        for (long b : backends_of(db.name)) {
            double v = pid_cpu(b);
            c.pg += v;
            pg_seen[b] = std::max(pg_seen[b], v);
        }
        return c;
    };
    struct row {
        int conc = 0, latency = 0;
        run_result d, p;
        cpu_snapshot dcpu, pcpu;  // per request, µs
    };
    std::vector<row> rows;
    auto measure = [&](int conc, int latency_ms) {
        fake.set_latency(latency_ms);
        auto direct_clients = clients_for(pool, upstream, *tls, conc);
        auto proxy_clients =
            clients_for(pool, "http://127.0.0.1:" + std::to_string(proxy_port), nullptr, conc);
        std::string tag = std::to_string(conc) + "-" + std::to_string(latency_ms) + "-";
        // Warm both paths (connections, TLS, prepared statements), then measure.
        run_load(io, raw(direct_clients), "Bearer sk_test_bench_real_key", "w-d-" + tag, conc, 0.3);
        run_load(io, raw(proxy_clients), "Bearer " + secret, "w-p-" + tag, conc, 0.3);
        row r;
        r.conc = conc;
        r.latency = latency_ms;
        auto per_request = [](cpu_snapshot a, cpu_snapshot b, std::size_t n) {
            double k = 1e6 / static_cast<double>(std::max<std::size_t>(1, n));
            cpu_snapshot out;
            out.fake = (b.fake - a.fake) * k;
            out.self = ((b.self - a.self) - (b.fake - a.fake)) * k;  // the load generator
            out.proxy = (b.proxy - a.proxy) * k;
            out.pg = (b.pg - a.pg) * k;
            return out;
        };
        // Direct and proxied alternate in `slices` slices, so both see the same share of a machine whose
        // other load comes and goes (one direct run followed by one proxied run compared two different
        // moments).
        constexpr int slices = 3;
        cpu_snapshot dsum, psum;
        for (int i = 0; i < slices; ++i) {
            auto c0 = snapshot();
            add_slice(r.d, run_load(io, raw(direct_clients), "Bearer sk_test_bench_real_key",
                                    "d-" + tag + std::to_string(i) + "-", conc, seconds / slices));
            auto c1 = snapshot();
            add_slice(r.p, run_load(io, raw(proxy_clients), "Bearer " + secret,
                                    "p-" + tag + std::to_string(i) + "-", conc, seconds / slices));
            auto c2 = snapshot();
            auto acc = [](cpu_snapshot& sum, cpu_snapshot a, cpu_snapshot b) {
                sum.self += b.self - a.self;
                sum.fake += b.fake - a.fake;
                sum.proxy += b.proxy - a.proxy;
                sum.pg += b.pg - a.pg;
            };
            acc(dsum, c0, c1);
            acc(psum, c1, c2);
        }
        finish(r.d);
        finish(r.p);
        cpu_snapshot zero;
        r.dcpu = per_request(zero, dsum, r.d.ok + r.d.failed);
        r.pcpu = per_request(zero, psum, r.p.ok + r.p.failed);
        std::printf("%-6d %5dms %10.0f %10.0f %6.0f%% %8.2fms %8.2fms %8.2fms %8.2fms %8.2fms %8.2fms%s\n",
                    conc, latency_ms, r.d.rps, r.p.rps, 100.0 * r.p.rps / std::max(1.0, r.d.rps), r.d.p50_ms,
                    r.p.p50_ms, r.d.p99_ms, r.p.p99_ms, r.p.p50_ms - r.d.p50_ms, r.p.p99_ms - r.d.p99_ms,
                    (r.d.failed + r.p.failed) ? "  (failures!)" : "");
        std::fflush(stdout);
        rows.push_back(r);
    };
    std::printf("%-6s %7s %10s %10s %7s %10s %10s %10s %10s %10s %10s\n", "conc", "stripe", "direct r/s",
                "proxy r/s", "ratio", "direct p50", "proxy p50", "direct p99", "proxy p99", "added p50",
                "added p99");
    if (trace_burst) {
        auto from = clock_type::now();
        measure(32, latency_ms);
        print_burst_trace(slurp(proxy.err), from);
        return 0;
    }
    if (only_conc > 0) {
        measure(only_conc, latency_ms);
        return 0;
    }
    for (int conc : {1, 32, 256}) measure(conc, 0);
    if (latency_ms > 0)
        for (int conc : {32, 256}) measure(conc, latency_ms);
    std::printf(
        "CPU per request (µs, user+system, from /proc): direct = load generator + fake-stripe; proxied = "
        "load generator + proxy + PostgreSQL backends + fake-stripe\n");
    std::printf("%-6s %7s %8s %8s %8s | %8s %8s %8s %8s %8s\n", "conc", "stripe", "d:load", "d:fake",
                "d:total", "p:load", "p:proxy", "p:pg", "p:fake", "p:total");
    for (const auto& r : rows)
        std::printf("%-6d %5dms %8.0f %8.0f %8.0f | %8.0f %8.0f %8.0f %8.0f %8.0f\n", r.conc, r.latency,
                    r.dcpu.self, r.dcpu.fake, r.dcpu.self + r.dcpu.fake, r.pcpu.self, r.pcpu.proxy, r.pcpu.pg,
                    r.pcpu.fake, r.pcpu.self + r.pcpu.proxy + r.pcpu.pg + r.pcpu.fake);
    // The proxy's own view: time spent waiting for Stripe vs time it added, and PostgreSQL statement time.
    std::smatch hm;
    std::string log = slurp(proxy.err);
    if (std::regex_search(log, hm, std::regex(R"re("msg":"health server listening".*"port":(\d+))re"))) {
        http::client_options o;
        auto mc = http::client::create(pool.get_executor(), "http://127.0.0.1:" + hm[1].str(), o, logger());
        if (mc) {
            http::request q;
            q.target = "/metrics";
            std::optional<http::client_result> got;
            asio::co_spawn(
                io,
                [](http::client* c, http::request r) -> net::awaitable<http::client_result> {
                    co_return co_await c->request(std::move(r));
                }((*mc).get(), q),
                [&got](std::exception_ptr, http::client_result r) { got = std::move(r); });
            io.restart();
            while (!got) io.run_one();
            std::istringstream in(got->resp.body);
            std::string line;
            std::map<std::string, double> m;
            while (std::getline(in, line)) {
                auto sp = line.rfind(' ');
                if (line.starts_with("chargeguard_vault_") || line.starts_with("chargeguard_pg_"))
                    if (line.find("_sum") != std::string::npos || line.find("_count") != std::string::npos)
                        m[line.substr(0, sp)] += std::atof(line.c_str() + sp + 1);
            }
            auto mean_ms = [&](const std::string& name) {
                double n = m[name + "_count"];
                return n > 0 ? 1000.0 * m[name + "_sum"] / n : 0.0;
            };
            std::printf("proxy's own means over all runs: upstream %.3f ms, added %.3f ms\n",
                        mean_ms("chargeguard_vault_upstream_latency_seconds"),
                        mean_ms("chargeguard_vault_added_latency_seconds"));
            for (const auto& [k, v] : m)
                if (k.starts_with("chargeguard_pg_") && k.find("_count") != std::string::npos) {
                    auto base = k.substr(0, k.find("_count"));
                    auto labels = k.substr(k.find("_count") + 6);
                    double sum = m[base + "_sum" + labels];
                    std::printf("  %s%s: %.0f, mean %.3f ms\n", base.c_str(), labels.c_str(), v,
                                v > 0 ? 1000.0 * sum / v : 0.0);
                }
        }
    }
    std::printf("proxy peak RSS (VmHWM): %ld KiB; load generator + fake-stripe process peak RSS: %ld KiB\n",
                proxy.vm_hwm_kib(), test::peak_rss_kib());
    return 0;
}
