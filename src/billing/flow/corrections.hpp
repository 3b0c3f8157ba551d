// Corrections of a charged period (docs/design.md §4a): a billing event with "revision": N > 0 carries the
// period's new total. Revision N applies once N−1 has ended (revision 0 is the original charge); it moves
// total(N) less the money the ledger has moved for the period so far — a charge when positive, refunds when
// negative — planned in the ledger before Stripe hears of any of it (migration 0018), each move under a key
// derived from the original key, the revision and the move's part (correction_ledger.hpp), so a redelivered,
// re-published or crashed-and-recovered revision moves money once.
//
// Every decision is the revision fsm's (billing/machine/revision_fsm.hpp); this class is its driver, running
// its commands against the corrections ledger and Stripe. Each move goes through the machine charges go
// through: its attempt recorded under the revision's lease
// before the call; an open answer (5xx, timeout) or a first attempt older than the same-key window sends
// it to the search — the customer's charges by metadata[billing_key] for a charge, the refunds of the
// charge for a refund — and only a search that finds nothing, once no call under the old key has shown
// life for new_key_quiet, takes a new key generation.
#pragma once

#include <functional>
#include <memory>
#include <random>
#include <string>

#include "billing/machine/event.hpp"
#include "billing/machine/machine.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/machine/revision_fsm.hpp"
#include "billing/store/correction_ledger.hpp"
#include "core/log.hpp"
#include "metrics/registry.hpp"
#include "net/tokens.hpp"
#include "stripe/outcome.hpp"

namespace cg::stripe {
class client;
}

namespace cg::billing {

struct delivery;
struct charge_flow_config;
class ledger;

class corrections {
  public:
    // `cfg`, `ledger_` and `stripe` must outlive the object (the pipeline owns it and them).
    corrections(const charge_flow_config& cfg, billing::ledger& ledger, stripe::client& stripe);

    // The whole machine for one delivery of a correction `ev` of the period whose original key is `base`:
    // FIN (applied, a no-op with its reason, dead-lettered) or REQ with a delay (waiting for its
    // predecessor, lease held, Stripe's answer open, PostgreSQL failed). Never throws for database, Stripe or
    // payload failures. Call and complete on the ledger pool's executor; `d` must outlive the call. While a
    // move's Stripe call is awaited the revision's lease is renewed every lease_renew_interval
    // (lease_keeper.hpp) and `touch` (may be empty) is called, as for a charge.
    net::awaitable<verdict> handle(const delivery& d, std::function<void()> touch, billing_event ev,
                                   std::string base, logger log);

    // Where a revision's lease found taken over during a move's Stripe call is counted (the charges' counter,
    // chargeguard_billing_lease_lost_total); null counts nothing.
    void count_lease_lost_in(metrics::Counter* c) { lease_lost_ = c; }

  private:
    struct job;
    // The driver of the revision fsm (billing/machine/revision_fsm.hpp): runs one command.
    net::awaitable<machine::revision_input> execute(job& j, machine::revision_fsm& fsm,
                                                    const machine::revision_command& c);
    net::awaitable<machine::revision_input> call(job& j, machine::revision_fsm& fsm,
                                                 const machine::revision_command& c);
    net::awaitable<void> renew_once(job& j, machine::revision_fsm& fsm);

    const charge_flow_config& cfg_;
    machine::flow_config fsm_cfg_;  // cfg_'s decision parameters
    billing::ledger& ledger_;
    correction_ledger store_;
    stripe::client& stripe_;
    metrics::Counter* lease_lost_ = nullptr;
    std::mt19937_64 rng_{std::random_device{}()};
};

}  // namespace cg::billing
