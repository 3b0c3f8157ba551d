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
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
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

extern char** environ;

using namespace cg;
using clock_type = std::chrono::steady_clock;

namespace {

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// CPU seconds (user + system) of a process or of one thread, from /proc (0 when it is gone).
double cpu_seconds(const std::string& stat_path) {
    std::ifstream in(stat_path);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto rp = s.rfind(')');
    if (rp == std::string::npos) return 0;
    std::istringstream rest(s.substr(rp + 2));
    std::string field;
    long ut = 0, st = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) ut = std::atol(field.c_str());
        if (i == 15) st = std::atol(field.c_str());
    }
    return static_cast<double>(ut + st) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}
double pid_cpu(long pid) {
    return cpu_seconds("/proc/" + std::to_string(pid) + "/stat");
}

// The PostgreSQL backends serving database `db` (their pids, via pg_stat_activity; measurement only, off
// any loop).
std::vector<long> backends_of(const std::string& db) {
    std::vector<long> out;
    PGconn* c = PQconnectdb("");
    if (PQstatus(c) == CONNECTION_OK) {
        std::string sql =
            "SELECT pid FROM pg_stat_activity WHERE datname = '" + db + "' AND pid <> pg_backend_pid()";
        PGresult* r = PQexec(c, sql.c_str());
        if (PQresultStatus(r) == PGRES_TUPLES_OK)
            for (int i = 0; i < PQntuples(r); ++i) out.push_back(std::atol(PQgetvalue(r, i, 0)));
        PQclear(r);
    }
    PQfinish(c);
    return out;
}

// The fake on its own thread, with its thread's CPU time and a latency set from outside.
struct fake_thread : test::fake_stripe_thread {
    using fake_stripe_thread::fake_stripe_thread;
    double cpu() const { return cpu_seconds("/proc/self/task/" + std::to_string(tid.load()) + "/stat"); }
    void set_latency(int ms) {
        on_fake([this, ms] { fake->faults().latency_ms = ms; });
    }
};

// A child process with stdout/stderr in files.
struct child {
    pid_t pid = -1;
    std::string out, err;
    child(const std::vector<std::string>& args, const std::string& tag) {
        out = "/tmp/cg-bench-" + tag + "-" + std::to_string(::getpid()) + ".out";
        err = out.substr(0, out.size() - 4) + ".err";
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0)
            throw std::runtime_error("spawn " + args[0]);
        posix_spawn_file_actions_destroy(&fa);
    }
    int wait() {
        int st = 0;
        ::waitpid(pid, &st, 0);
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    ~child() {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            ::waitpid(pid, nullptr, 0);
        }
        ::unlink(out.c_str());
        ::unlink(err.c_str());
    }
    long vm_hwm_kib() const {
        std::ifstream in("/proc/" + std::to_string(pid) + "/status");
        std::string line;
        while (std::getline(in, line))
            if (line.starts_with("VmHWM:")) return std::atol(line.c_str() + 6);
        return -1;
    }
};

struct run_result {
    double rps = 0;
    double p50_ms = 0, p99_ms = 0;
    double elapsed = 0;
    std::vector<double> lat_ms;
    std::size_t ok = 0, failed = 0;
};

double pct(std::vector<double>& v, double p) {
    if (v.empty()) return 0;
    std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
}

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

// Adds one slice's requests to a run's totals; finish() computes the rate and percentiles over all slices.
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

// --trace-burst: the proxy's per-request stage lines (debug) of the measured run, grouped into bursts (a gap
// of more than 5 ms between two arrivals starts a new one); prints each stage's p50 / p99 over every request
// and the timeline of the largest burst of the run's second half.
void print_burst_trace(const std::string& log, clock_type::time_point from) {
    struct rec {
        std::map<std::string, double> v;
    };
    std::vector<rec> recs;
    auto since = static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(from.time_since_epoch()).count());
    std::istringstream in(log);
    std::string line;
    std::regex field(R"re("([a-z_]+)":(-?[0-9.]+))re");
    while (std::getline(in, line)) {
        if (line.find("vault request stages") == std::string::npos) continue;
        rec r;
        for (std::sregex_iterator it(line.begin(), line.end(), field), end; it != end; ++it)
            r.v[(*it)[1].str()] = std::atof((*it)[2].str().c_str());
        if (r.v["t_us"] >= since) recs.push_back(std::move(r));
    }
    if (recs.empty()) {
        std::printf("trace: no stage lines in the proxy's log\n");
        return;
    }
    std::sort(recs.begin(), recs.end(),
              [](const rec& a, const rec& b) { return a.v.at("t_us") < b.v.at("t_us"); });
    const char* stages[] = {"auth_us",     "parse_us",  "wait_us",  "stmt_us", "to_upstream_us",
                            "upstream_us", "answer_us", "total_us", "batch",   "settlements"};
    std::printf("trace: %zu forwarded creates; per stage p50 / p99 (µs), from the proxy's own clock:\n",
                recs.size());
    for (const char* s : stages) {
        std::vector<double> v;
        for (auto& r : recs) v.push_back(r.v[s]);
        std::printf("  %-15s %8.0f %8.0f\n", s, pct(v, 0.5), pct(v, 0.99));
    }
    std::vector<std::pair<std::size_t, std::size_t>> bursts;  // [begin, end)
    std::size_t b = 0;
    for (std::size_t i = 1; i <= recs.size(); ++i)
        if (i == recs.size() || recs[i].v["t_us"] - recs[i - 1].v["t_us"] > 5000) {
            bursts.emplace_back(b, i);
            b = i;
        }
    std::vector<double> spans, sizes;
    for (auto [lo, hi] : bursts) {
        sizes.push_back(static_cast<double>(hi - lo));
        spans.push_back(recs[hi - 1].v["t_us"] - recs[lo].v["t_us"]);
    }
    std::printf(
        "trace: %zu bursts; requests per burst p50 %.0f; arrival spread within a burst p50 %.0f µs, p99 %.0f "
        "µs\n",
        bursts.size(), pct(sizes, 0.5), pct(spans, 0.5), pct(spans, 0.99));
    // The largest burst of the second half of the run (the first half has the warm-up and the direct runs'
    // neighbours): where a synchronised burst's time goes.
    std::size_t pick = bursts.size() / 2;
    for (std::size_t i = bursts.size() / 2; i < bursts.size(); ++i)
        if (bursts[i].second - bursts[i].first > bursts[pick].second - bursts[pick].first) pick = i;
    auto [lo, hi] = bursts[pick];
    double t0 = recs[lo].v["t_us"];
    std::printf(
        "trace: one burst (the largest of the run's second half), µs; arrival = offset from its first "
        "request\n");
    std::printf("  %8s %6s %6s %6s %6s %5s %5s %7s %8s %6s %7s\n", "arrival", "auth", "parse", "wait", "stmt",
                "batch", "settl", "to_up", "upstream", "answer", "total");
    for (std::size_t i = lo; i < hi; ++i) {
        auto& v = recs[i].v;
        std::printf("  %8.0f %6.0f %6.0f %6.0f %6.0f %5.0f %5.0f %7.0f %8.0f %6.0f %7.0f\n", v["t_us"] - t0,
                    v["auth_us"], v["parse_us"], v["wait_us"], v["stmt_us"], v["batch"], v["settlements"],
                    v["to_upstream_us"], v["upstream_us"], v["answer_us"], v["total_us"]);
    }
}

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
