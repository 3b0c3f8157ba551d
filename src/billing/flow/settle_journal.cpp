#include "billing/flow/settle_journal.hpp"

#include <utility>

#include "core/log.hpp"

namespace cg::billing {

void settle_journal::note(journal_entry e) {
    trim(e.at);
    ring_.push_back(std::move(e));
    while (ring_.size() > capacity_) ring_.pop_front();
}

void settle_journal::trim(clock::time_point now) {
    while (!ring_.empty() && now - ring_.front().at > keep_) ring_.pop_front();
}

std::vector<journal_entry> settle_journal::recent(clock::time_point now) const {
    std::vector<journal_entry> out;
    for (const auto& e : ring_)
        if (now - e.at <= keep_) out.push_back(e);
    return out;
}

bool reverted_by_failover(const journal_entry& e, const ledger_record& row) noexcept {
    return row.key == e.key && row.status == record_status::pending && row.key_generation == e.generation &&
           row.lease_epoch >= e.first_lease && row.lease_epoch <= e.last_lease;
}

net::awaitable<reapply_report> reapply_after_failover(ledger& l, const settle_journal& j, const logger& log) {
    reapply_report rep;
    for (auto& e : j.recent()) {
        ++rep.checked;
        auto row = co_await l.find(e.key);
        if (!row) {
            ++rep.errors;
            log.warn("failover: reading a row this sidecar settled failed; left to the sweeps",
                     {{"billing_key", e.key}, {"error", row.err().describe()}});
            continue;
        }
        if (!*row || !reverted_by_failover(e, **row)) {
            ++rep.left;
            continue;
        }
        // The settle statement applies only to a pending row: a worker that settled it meanwhile wins.
        result<bool> done = false;
        if (e.status == record_status::charged)
            done = co_await l.mark_charged(e.key, e.charge_id.value_or(""), e.payment_intent_id);
        else
            done =
                co_await l.mark_declined(e.key, e.charge_id, e.last_error.value_or(""), e.payment_intent_id);
        if (!done) {
            ++rep.errors;
            log.warn("failover: re-applying a settle failed; left to the sweeps",
                     {{"billing_key", e.key}, {"error", done.err().describe()}});
            continue;
        }
        if (!*done) {
            ++rep.left;
            continue;
        }
        ++rep.reapplied;
        log.warn("failover: re-applied a settle the failover lost (no Stripe call)",
                 {{"billing_key", e.key},
                  {"status", std::string(to_string(e.status))},
                  {"generation", e.generation},
                  {"lease_epoch", (*row)->lease_epoch}});
    }
    co_return rep;
}

}  // namespace cg::billing
