// The backfill: ledger rows lost entirely (docs/operating/ha-postgres.md). A PostgreSQL failover with
// asynchronous replication can lose a pre-flight insert whose charge Stripe then made; no sweep can find a
// row that does not exist. Periodically (and once soon after startup) the backfill lists the charges created
// within a recent window — the platform's, then each Stripe Connect account's the ledger has rows for or the
// operator names (backfill_config::connect_accounts), with its Stripe-Account; the rows recovered there
// record the account — keeps the succeeded ones whose metadata
// makes them this sidecar's — metadata[billing_key] equals base_key(our namespace, metadata[customer_id],
// metadata[billing_period]), which proves the namespace without carrying it — and inserts every such row the
// ledger lacks as `charged` with the charge id (and its PaymentIntent), marked recovered (recovered_at,
// migration 0012) and logged.
//
// It cannot race the pipeline into a second charge: the insert is ON CONFLICT DO NOTHING on the key and
// on (customer_id, billing_period, stripe_account), so a row a delivery wrote first wins, and a delivery that
// comes after finds the row charged (a prevented duplicate). Declined card charges are not backfilled: a lost
// declined row leaves no money moved, and a redelivery or reconcile decides it again.
//
// A bank debit settles later, so a lost row may be one whose payment is still in flight or already failed.
// A key of this namespace without a succeeded charge in the window comes back from its newest bank-debit
// charge (payment_method_details.type a delayed-notification method): `pending` → a `processing` row, as
// the pipeline leaves one (the poll and the webhooks follow it to its end); `failed` → the same row, then
// failed by the settlement step (settlement_store::apply_retrieved): `failed_after_processing` with its
// dead letter, an alert and chargeguard_billing_failed_after_processing_total, whose replay charges again.
// The row's delivery for that letter is rebuilt: the event as its producer would publish it (to_json), to
// `topic` and `channel`; its key generation is one more than the key's failed bank debits listed before
// that charge, so the replay's new generation is one Stripe has not seen. Webhook events recorded while the
// row was missing (naming no row) are applied to it then (settlement_store::apply_recorded). Without a
// topic and channel only succeeded charges are backfilled.
#pragma once

#include <asio/any_io_executor.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"

namespace cg::stripe {
class client;
}
namespace cg::metrics {
class registry;
}

namespace cg::billing {

struct backfill_config {
    std::string key_namespace = "chargeguard";
    std::chrono::seconds window{3600};            // charges created this long ago or later
    std::chrono::milliseconds interval{600'000};  // between runs (the first one after `first_delay`)
    std::chrono::milliseconds first_delay{5'000};
    unsigned page_size = 100;
    std::size_t max_pages = 1000;  // per run: a bound on Stripe calls
    // The consumer's topic and channel: a recovered bank debit's dead letter re-publishes its event there.
    std::string topic, channel;
    // Connected accounts (acct_…) searched in every run besides those the ledger has rows for: an account
    // every row of which a failover lost is known only from here (consume --connect-accounts).
    std::vector<std::string> connect_accounts;
};

struct backfill_report {
    std::size_t listed = 0;      // charges in the window
    std::size_t ours = 0;        // succeeded or bank debits, with metadata making them this namespace's
    std::size_t inserted = 0;    // rows the ledger lacked, now recovered
    std::size_t processing = 0;  // of those, bank debits recovered still processing
    std::size_t failed = 0;      // of those, bank debits recovered failed after processing (dead-lettered)
    bool truncated = false;      // max_pages reached before the window's end
};

class backfill {
  public:
    // `pool`, `stripe` (and `reg` when given) must outlive it. Runs on the pool's executor. Counts
    // chargeguard_billing_backfilled_total and chargeguard_billing_backfill_errors_total.
    backfill(backfill_config cfg, std::shared_ptr<pg::pool> pool, stripe::client& stripe, logger log,
             metrics::registry* reg = nullptr);
    ~backfill();
    backfill(const backfill&) = delete;
    backfill& operator=(const backfill&) = delete;

    // One run over the window. Returns what it did, or the first Stripe or PostgreSQL error (rows inserted
    // before it stay inserted). Completes on the pool's executor.
    net::awaitable<result<backfill_report>> run_once();

    void start(asio::any_io_executor ex);
    // Ends the loop; completes once a run in progress has finished its current page. Same executor.
    net::awaitable<void> stop();

    struct state;

  private:
    std::shared_ptr<state> st_;
};

}  // namespace cg::billing
