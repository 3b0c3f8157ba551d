#include "billing/flow/settle_journal.hpp"

#include <string_view>
#include <utility>

#include "core/log.hpp"

namespace cg::billing {

settle_journal::packed settle_journal::pack(const journal_entry& e) {
    packed p;
    const std::array<const std::optional<std::string>*, 3> opt{&e.charge_id, &e.payment_intent_id,
                                                               &e.last_error};
    std::size_t n = e.key.size();
    for (const auto* o : opt) n += o->has_value() ? (*o)->size() : 0;
    p.text.reserve(n);
    p.text += e.key;
    p.ends[0] = static_cast<std::uint32_t>(p.text.size());
    for (std::size_t i = 0; i < opt.size(); ++i) {
        if (opt[i]->has_value()) {
            p.present |= static_cast<std::uint8_t>(1u << i);
            p.text += **opt[i];
        }
        if (i + 1 < opt.size()) p.ends[i + 1] = static_cast<std::uint32_t>(p.text.size());
    }
    p.status = e.status;
    p.generation = e.generation;
    p.first_lease = e.first_lease;
    p.last_lease = e.last_lease;
    p.at = e.at;
    return p;
}

journal_entry settle_journal::unpack(const packed& p) {
    journal_entry e;
    std::string_view t = p.text;
    e.key = std::string(t.substr(0, p.ends[0]));
    const std::array<std::optional<std::string>*, 3> opt{&e.charge_id, &e.payment_intent_id, &e.last_error};
    for (std::size_t i = 0; i < opt.size(); ++i) {
        std::size_t from = p.ends[i], to = i + 1 < opt.size() ? p.ends[i + 1] : t.size();
        if (p.present & (1u << i)) *opt[i] = std::string(t.substr(from, to - from));
    }
    e.status = p.status;
    e.generation = p.generation;
    e.first_lease = p.first_lease;
    e.last_lease = p.last_lease;
    e.at = p.at;
    return e;
}

void settle_journal::note(journal_entry e) {
    trim(e.at);
    ring_.push_back(pack(e));
    while (ring_.size() > capacity_) ring_.pop_front();
}

void settle_journal::trim(clock::time_point now) {
    while (!ring_.empty() && now - ring_.front().at > keep_) ring_.pop_front();
}

std::vector<journal_entry> settle_journal::recent(clock::time_point now) const {
    std::vector<journal_entry> out;
    for (const auto& p : ring_)
        if (now - p.at <= keep_) out.push_back(unpack(p));
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
