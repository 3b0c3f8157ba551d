// The ledger: billing_records and the semantics of ledger_sql.hpp's statements, one row per key.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "billing/machine/machine.hpp"
#include "world.hpp"

namespace cg::sim::detail {

// States move only along the money machine's table (billing/machine/machine.hpp), the one docs/design.md
// prints.
void world::set_status(row& r, record_status to) {
    const record_status from = r.rec.status;
    if (!billing::machine::allowed(from, to))
        violation("state order: " + r.rec.key + " " + std::string(billing::to_string(from)) + " -> " +
                  std::string(billing::to_string(to)));
    r.rec.status = to;
}

// Every statement that writes a row: its trigger sets updated_at, and the row as it was is journalled — the
// commits an asynchronous standby may not have yet (failover() in sweeper.cpp rolls them back). A failover
// is armed for a moment and strikes just after the next commit, when it can lose something. The writes it
// never loses: a pre-flight insert (a row lost entirely is the backfill's to heal, not modelled here), the
// operator's commands, and a webhook's settle of a row not processing (nothing in the design heals that:
// reconcile reports it).
void world::commit(const row* before, row& after, bool losable) {
    after.updated = now_;
    if (!before || !losable) {
        journal_.clear();
        return;
    }
    journal_.push_back({after.rec.key, *before, now_});
    if (journal_.size() > static_cast<std::size_t>(p_.lost_commits)) journal_.pop_front();
    if (failover_armed_ && faults_) {
        failover_armed_ = false;
        at(now_ + rnd_.range(1, 2 * sec), [this] { failover(); });
    }
}

bool world::insert(const delivery& d) {
    if (rows_.count(d.key)) return false;
    row r;
    r.rec.key = d.key;
    r.rec.customer_id = d.ev.customer_id;
    r.rec.billing_period = d.ev.billing_period;
    r.rec.amount_cents = d.ev.amount_cents;
    r.rec.currency = d.ev.currency;
    r.rec.stripe_customer_id = d.ev.stripe_customer_id;
    r.rec.stripe_attempts = 1;
    r.lease_until = now_ + p_.lease;
    r.epoch = 1;
    r.first_attempt = now_;
    r.last_life = now_;
    commit(nullptr, rows_.emplace(d.key, std::move(r)).first->second);
    return true;
}

std::optional<std::int64_t> world::take(const std::string& key) {
    row* r = find_row(key);
    if (!r || !r->pending() || (r->lease_until >= 0 && r->lease_until >= now_)) return std::nullopt;
    commit(r, *r);
    r->lease_until = now_ + p_.lease;
    return ++r->epoch;
}

std::optional<world::attempted> world::attempt(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return std::nullopt;
    commit(r, *r);
    ++r->rec.stripe_attempts;
    if (r->first_attempt < 0) r->first_attempt = now_;
    r->last_life = now_;
    r->lease_until = now_ + p_.lease;
    return attempted{r->rec.key_generation, ++r->epoch};
}

std::optional<std::int64_t> world::renew(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return std::nullopt;
    commit(r, *r);
    r->lease_until = now_ + p_.lease;
    r->last_life = now_;
    return ++r->epoch;
}

void world::in_flight_note(const std::string& key, std::int32_t gen) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->rec.key_generation != gen) return;
    commit(r, *r);
    r->last_life = now_;
}

bool world::settle(const std::string& key, record_status s, const std::string& charge_id,
                   const std::string& payment_intent) {
    row* r = find_row(key);
    if (!r || !r->pending()) return false;
    commit(r, *r);
    set_status(*r, s);
    if (!charge_id.empty() && !r->rec.charge_id) r->rec.charge_id = charge_id;
    if (!payment_intent.empty() && !r->payment_intent_id) r->payment_intent_id = payment_intent;
    if (s == record_status::processing) r->processing_since = now_;
    r->lease_until = -1;
    ++r->epoch;
    left_pending(*r);
    return true;
}

void world::indeterminate(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending()) return;
    commit(r, *r);
    if (r->indeterminate_since < 0) r->indeterminate_since = now_;
    if (r->epoch == epoch) {
        r->lease_until = now_ - 1;
        ++r->epoch;
    }
}

void world::release(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return;
    commit(r, *r);
    r->lease_until = now_ - 1;
    ++r->epoch;
}

// The events recorded while the row was pending are applied once the pipeline settled it.
// They were recorded by the key, the PaymentIntent or the charge they named.
void world::left_pending(row& r) {
    std::string names[] = {r.rec.key, r.payment_intent_id.value_or(""), r.rec.charge_id.value_or("")};
    for (const auto& name : names) {
        auto it = name.empty() ? stashed_.end() : stashed_.find(name);
        if (it == stashed_.end()) continue;
        auto facts = std::move(it->second);
        stashed_.erase(it);
        for (const auto& [f, foreign] : facts) apply_to_row(r, f, foreign);
    }
}

}  // namespace cg::sim::detail
