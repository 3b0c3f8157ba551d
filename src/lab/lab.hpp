// The lab's runner: for one scenario, the unsafe consumer and then the real pipeline, each against a fresh
// broker (fake-nsqd or the real nsqd, a child process), the shared fake-stripe process (reset between runs)
// and the lab's PostgreSQL database (truncated between runs). Counts come from the parts themselves:
// deliveries and E_FIN_FAILED from the consumers, timeouts from nsqd's /stats, POSTs and charges from
// fake-stripe's admin endpoints.
//
// The spend-cap scenario adds a run through the vault proxy: `chargeguard proxy`'s engine (vault::proxy
// behind an http::server on loopback, its own PostgreSQL pool, fake-stripe as its upstream) with a vault key
// issued for the period at expected × 1.10, as `chargeguard vault issue --expected-file` would.
//
// Everything runs on the main io_context given to the constructor, except what blocks (spawning and
// reaping processes), which goes to the offload pool, and the Stripe clients, which live there.
#pragma once

#include <asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "lab/process.hpp"
#include "lab/report.hpp"
#include "lab/scenario.hpp"
#include "net/offload.hpp"
#include "net/tokens.hpp"
#include "pg/config.hpp"
#include "pg/params.hpp"
#include "pg/rows.hpp"

namespace cg::stripe {
class client;
}
namespace cg::pg {
class pool;
}
namespace cg::billing {
class ledger;
}

namespace cg::lab {

struct lab_options {
    std::string fake_nsqd_bin;
    std::string fake_stripe_bin;
    std::string nsqd_bin;   // the real nsqd; empty: fake-nsqd everywhere
    std::string certs_dir;  // ca.pem, server.pem, server.key (tests/doubles/stripe/gen-test-certs.sh)
    std::string work_dir;   // child logs and nsqd data paths
    pg::config pg;          // the lab's database (created by main)
    std::chrono::milliseconds msg_timeout{1000};
};

class lab {
  public:
    lab(asio::io_context& io, net::offload_pool& offload, lab_options opts, logger log);
    ~lab();
    lab(const lab&) = delete;
    lab& operator=(const lab&) = delete;

    // Starts fake-stripe, the Stripe clients and the PostgreSQL pool, and applies the migrations. Call on
    // the main loop once.
    net::awaitable<result<void>> start();
    // Runs `s`'s variants (variants_of: unsafe, [unsafe through the vault proxy,] safe); one row each. Call
    // on the main loop after start().
    net::awaitable<std::vector<row>> run(const scenario& s);
    // Stops fake-stripe and closes the pool.
    net::awaitable<void> stop();

    // True when `s` runs against the real nsqd in this lab.
    bool real_broker_for(const scenario& s) const { return s.real_broker && !opts_.nsqd_bin.empty(); }

    struct broker;
    struct variant_run;
    // The settle-later row (settle_later.cpp): its own consumer and broker, the lab's Stripe and database.
    friend net::awaitable<row> run_settle_later(lab& L, const scenario& s, variant which);
    struct vault_run;

    // For the consumers' handlers (main loop).
    billing::ledger& ledger() { return *ledger_; }
    net::offload_pool& offload() { return offload_; }
    const logger& log() const { return log_; }
    asio::any_io_executor io_executor();
    net::awaitable<void> advance_stripe_clock(std::chrono::seconds by);

  private:
    net::awaitable<row> run_variant(const scenario& s, variant which);
    net::awaitable<void> prepare(variant_run& v);
    net::awaitable<void> start_vault(variant_run& v);
    net::awaitable<void> stop_vault(variant_run& v);
    net::awaitable<row::vault_figures> vault_count(variant_run& v, std::int64_t charged_cents);
    net::awaitable<void> publish(variant_run& v);
    void configure_consumer(variant_run& v);
    net::awaitable<void> drive(variant_run& v);
    net::awaitable<void> crash_and_restart(variant_run& v);
    net::awaitable<void> channel_op(variant_run& v, std::string op);
    net::awaitable<void> wind_down(variant_run& v);
    net::awaitable<row> count(variant_run& v);
    // fake-stripe's succeeded charges into `out` (charges_created; customers_uncharged and duplicate_charges
    // over the Stripe customers `customers`); returns their total in cents (count.cpp).
    net::awaitable<std::int64_t> count_charges(row& out, std::vector<std::string> customers);
    // The POSTs fake-stripe saw under each of `keys`, into out.stripe_posts (count.cpp).
    net::awaitable<void> count_posts(row& out, std::set<std::string> keys);
    net::awaitable<result<std::unique_ptr<broker>>> start_broker(bool real, std::string data_dir);
    net::awaitable<result<std::unique_ptr<broker>>> start_broker_once(bool real, std::string data_dir);
    net::awaitable<void> stop_broker(std::unique_ptr<broker> b);
    net::awaitable<result<std::string>> admin(std::string method, std::string target, std::string body);
    net::awaitable<pg::rows> sql(std::string statement, pg::params params = {});
    net::awaitable<result<void>> start_stripe();  // fake-stripe and the clients of it
    net::awaitable<void> stop_stripe();
    std::shared_ptr<pg::pool> make_pool();  // on the lab's database

    asio::io_context& io_;
    net::offload_pool& offload_;
    lab_options opts_;
    logger log_;
    child stripe_proc_;
    std::string stripe_base_;  // fake-stripe's https:// origin
    std::unique_ptr<stripe::client> stripe_, admin_;
    std::shared_ptr<pg::pool> pool_;
    std::unique_ptr<billing::ledger> ledger_;
    unsigned seq_ = 0;
};

}  // namespace cg::lab
