// The vault_proxy bench's parts (vault_proxy.cpp runs them): the load generator and its percentiles
// (proxy_load.cpp), the child processes and the CPU time read from /proc (proxy_process.cpp), and the
// --trace-burst report (burst_trace.cpp).
#pragma once

#include <sys/types.h>

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "http/client.hpp"
#include "net/offload.hpp"

namespace vault_bench {

using clock_type = std::chrono::steady_clock;

// The whole file at `path` ("" when it cannot be read).
std::string slurp(const std::string& path);
// CPU seconds (user + system) of a process or of one thread, from /proc (0 when it is gone).
double cpu_seconds(const std::string& stat_path);
double pid_cpu(long pid);
// The PostgreSQL backends serving database `db` (their pids, via pg_stat_activity; measurement only, off
// any loop).
std::vector<long> backends_of(const std::string& db);

// A child process with stdout/stderr in files.
struct child {
    pid_t pid = -1;
    std::string out, err;
    child(const std::vector<std::string>& args, const std::string& tag);
    int wait();
    ~child();
    long vm_hwm_kib() const;
};

struct run_result {
    double rps = 0;
    double p50_ms = 0, p99_ms = 0;
    double elapsed = 0;
    std::vector<double> lat_ms;
    std::size_t ok = 0, failed = 0;
};

// The p-quantile of `v` (reorders it).
double pct(std::vector<double>& v, double p);
// `concurrency` workers POST /v1/charges through `clients` for `seconds`, each with its own Idempotency-Key.
run_result run_load(asio::io_context& io, std::vector<cg::http::client*> clients, std::string auth,
                    std::string prefix, int concurrency, double seconds);
// Adds one slice's requests to a run's totals; finish() computes the rate and percentiles over all slices.
void add_slice(run_result& total, run_result slice);
void finish(run_result& r);
std::vector<std::unique_ptr<cg::http::client>> clients_for(cg::net::offload_pool& pool,
                                                           const std::string& base,
                                                           std::shared_ptr<asio::ssl::context> tls,
                                                           int concurrency);
std::vector<cg::http::client*> raw(const std::vector<std::unique_ptr<cg::http::client>>& v);

// --trace-burst: the proxy's per-request stage lines of the measured run (see burst_trace.cpp).
void print_burst_trace(const std::string& log, clock_type::time_point from);

}  // namespace vault_bench
