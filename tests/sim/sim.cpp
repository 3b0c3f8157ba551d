#include "sim.hpp"

#include <algorithm>
#include <string>

#include "billing/machine/key.hpp"
#include "world.hpp"

namespace cg::sim {

std::string_view to_string(safeguard s) noexcept {
    switch (s) {
        case safeguard::write_before_call:
            return "write_before_call";
        case safeguard::lease_renewal:
            return "lease_renewal";
        case safeguard::search_before_new_key:
            return "search_before_new_key";
        case safeguard::same_key_window:
            return "same_key_window";
        case safeguard::quiet_period:
            return "quiet_period";
        case safeguard::same_payment:
            return "same_payment";
        case safeguard::in_flight_not_charged:
            return "in_flight_not_charged";
        case safeguard::not_tried_not_declined:
            return "not_tried_not_declined";
        case safeguard::failed_debit_processing:
            return "failed_debit_processing";
        case safeguard::cancel_before_retry:
            return "cancel_before_retry";
        case safeguard::sweeper:
            return "sweeper";
        case safeguard::replay_new_generation:
            return "replay_new_generation";
        case safeguard::cap_reservation:
            return "cap_reservation";
        case safeguard::retry_counted_once:
            return "retry_counted_once";
        case safeguard::follow_until_ended:
            return "follow_until_ended";
    }
    return "?";
}

namespace detail {

void world::check_final() {
    for (int i = 0; i < static_cast<int>(events_.size()); ++i) {
        const auto& e = events_[i];
        result_.upstream_bugs += e.upstream_bug;
        const row* r = find_row(e.key);
        std::vector<const stripe_charge*> moved;
        for (const auto& c : charges_)
            if (c.owner == e.key && c.status != "failed") moved.push_back(&c);
        if (!r) {
            violation("event " + std::to_string(i) + " has no ledger row once faults stopped");
            continue;
        }
        using rs = record_status;
        const rs s = r->rec.status;
        if (s != rs::charged && s != rs::declined && s != rs::failed_after_processing &&
            s != rs::cap_blocked) {
            violation("event " + std::to_string(i) +
                      " not final once faults stopped: " + std::string(billing::to_string(s)));
            continue;
        }
        if (s == rs::charged && (moved.size() != 1 || moved[0]->id != r->rec.charge_id.value_or("") ||
                                 moved[0]->status != "succeeded"))
            violation("ledger != Stripe: " + e.key + " charged " + r->rec.charge_id.value_or("?") +
                      ", Stripe has " + std::to_string(moved.size()) + " payment(s)" +
                      (moved.empty() ? "" : " (" + moved[0]->id + " " + moved[0]->status + ")"));
        // Never zero times, for valid events: the cap refuses one only when the reservations that may still
        // move money, each idempotency key counted once, leave it no room (an upstream bug's event, an
        // intent still waiting for its customer, or an older key generation that may still charge, holds
        // it); its dead letter waits for the operator.
        if (s == rs::cap_blocked && !e.upstream_bug) {
            ++result_.valid_cap_blocked;
            auto it = cap_refused_.find(i);
            if (it == cap_refused_.end() || !it->second)
                violation("event " + std::to_string(i) +
                          " cap_blocked though the cap had room for every payment that may still move money "
                          "(each key counted once): zero times");
        }
        // Only a customer whose payment method declines (or asks them to authenticate)
        // ends declined, and not once the operator retried it with the payment method fixed.
        if (s == rs::declined && !e.declines && !e.needs_auth)
            violation("event " + std::to_string(i) + " declined though its customer's payment method pays");
        if (s == rs::declined && e.retry)
            violation("event " + std::to_string(i) + " still declined though the operator retried it");
        if (s == rs::failed_after_processing && e.replay)
            violation("event " + std::to_string(i) +
                      " still failed after processing though the operator replayed its dead letter");
        if (s != rs::charged && !moved.empty())
            violation("ledger != Stripe: " + e.key + " " + std::string(billing::to_string(s)) +
                      ", Stripe has " + moved[0]->id + " " + moved[0]->status);
    }
    for (std::size_t i = 0; i < messages_.size(); ++i)
        if (!messages_[i].done) violation("message m" + std::to_string(i) + " never finished");
    cap_check();
}

run_result world::run() {
    sidecars_.resize(static_cast<std::size_t>(cfg_.sidecars));
    for (int i = 0; i < cfg_.events; ++i) {
        event_spec e;
        e.ev.customer_id = "cust" + std::to_string(i);
        e.ev.billing_period = "2026-11";
        e.ev.amount_cents = 100 + static_cast<std::int64_t>(rnd_.next() % 10'000);
        e.ev.currency = "usd";
        e.ev.stripe_customer_id = "cus_" + std::to_string(i);
        e.key = billing::base_key("sim", e.ev.customer_id, e.ev.billing_period);
        e.declines = rnd_.chance(0.1);
        e.debit = !e.declines && rnd_.chance(0.2);
        // A third of the events name a payment method: charged through a confirmed PaymentIntent.
        if (rnd_.chance(0.33)) e.ev.payment_method = e.debit ? "pm_usBankAccount" : "pm_card_visa";
        // Some card intents are on-session and stop at requires_action (3-D Secure): declined
        // (needs_authentication) until the customer authenticates or the operator retries.
        if (e.ev.uses_payment_intent() && !e.declines && !e.debit && rnd_.chance(0.3)) {
            e.needs_auth = true;
            e.ev.off_session = false;
        }
        // The operator retries most declines once the customer fixed the payment method.
        e.retry = (e.declines || e.needs_auth) && rnd_.chance(0.6);
        events_.push_back(std::move(e));
    }
    // What was added since keeps its own stream, so the seeds of the earlier faults replay as they did.
    rng more{cfg_.seed ^ 0x5ca1ab1e0ddba11ULL};
    for (auto& e : events_) e.replay = e.debit && more.chance(0.6);
    vault_open();
    if (cfg_.failovers)  // PostgreSQL fails over in some schedules, once or twice while faults last
        for (int n = more.chance(0.4) ? static_cast<int>(more.range(1, 2)) : 0; n > 0; --n)
            at(more.range(0, cfg_.fault_ms), [this] { failover_armed_ = true; });
    for (int sc = 0; sc < cfg_.sidecars; ++sc, ++sweep_ticks_)
        at(more.range(0, p_.sweep_every), [this, sc] { sweep_tick(sc); });
    for (int i = 0; i < cfg_.events; ++i) {
        ms_t t = rnd_.range(0, cfg_.fault_ms / 2);
        at(t, [this, i] { publish(i); });
        if (rnd_.chance(0.2))  // the producer publishes it again (re-publication, `reconcile`)
            at(rnd_.range(t, cfg_.fault_ms), [this, i] { publish(i); });
    }
    // The vault and the upstream bug keep a stream of their own (vault_model.cpp). Two schedules in three
    // charge through the vault proxy, the others directly (consume's --stripe-api-base either way), so the
    // flow's own safeguards are tested without the cap standing behind them too.
    rng bug{cfg_.seed ^ 0x0ddc0ffee15bad5ULL};
    vault_on_ = bug.chance(2.0 / 3);
    upstream_bug(bug);
    // Faults of the world beside the flow: foreign webhooks, 429 storms, crashes of idle sidecars.
    for (ms_t t = 0; t < cfg_.fault_ms; t += rnd_.range(5 * minute, 40 * minute)) {
        at(t, [this] {
            if (!faults_ || !kept_fault()) return;
            int i = static_cast<int>(rnd_.next() % static_cast<std::uint64_t>(cfg_.events));
            bool ok = rnd_.chance(0.5);
            const std::string n = std::to_string(++seq_);
            std::string body =
                charge_event_json("evt_f" + n, ok ? "charge.succeeded" : "charge.failed", now_,
                                  "ch_foreign" + n, ok ? "succeeded" : "failed", events_[i].key);
            if (auto f = read_webhook(body)) receive_webhook(*f, true);
        });
        if (rnd_.chance(0.1))
            at(t, [this] {
                if (kept_fault()) storm_until_ = now_ + rnd_.range(2 * minute, 10 * minute);
            });
    }
    at(cfg_.fault_ms, [this] {
        faults_ = false;
        storm_until_ = -1;
        note("faults stop");
    });
    at(p_.poll_every, [this] { poll(); });
    at(rnd_.range(hour, 4 * hour), [this] { operator_run(); });
    const ms_t end = cfg_.fault_ms + p_.horizon;
    while (!queue_.empty()) {
        action a = queue_.top();
        queue_.pop();
        if (a.at > end) break;
        now_ = std::max(now_, a.at);
        ++result_.steps;
        a.fn();
    }
    now_ = end;
    check_final();
    result_.digest = digest_;
    return std::move(result_);
}

}  // namespace detail

run_result run(const config& c) {
    detail::world w(c);
    return w.run();
}

}  // namespace cg::sim
