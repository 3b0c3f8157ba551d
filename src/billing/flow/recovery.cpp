// The recovery search (recovery.hpp) and the pipeline's recovery: a pending row found again (RECOVER),
// searched for and settled from what carries its key.
#include "billing/flow/recovery.hpp"

#include <algorithm>
#include <stdexcept>

#include "billing/flow/charge_flow_run.hpp"
#include "billing/machine/machine.hpp"
#include "billing/store/retry_store.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {
namespace {

std::int64_t unix_seconds(sys_time t) {
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// A failed payment carrying the key, created well before the row's first attempt (five minutes of clock
// skew allowed), belongs to an earlier life of the row: the payment that failed after processing, which a
// replay superseded (reopening restarts the attempt window). It says nothing about the current generation
// and is never read as this row's decline; a success is always believed.
// A retried declined row (retry_store.hpp) names the payments its earlier attempts made: those are never this
// generation's answer either, however recent.
bool superseded_failure(const recovery_query& q, const std::string& id, std::int64_t created) {
    if (std::find(q.superseded.begin(), q.superseded.end(), id) != q.superseded.end()) return true;
    return q.first_attempt && created < unix_seconds(*q.first_attempt) - 300;
}

// What a charge carrying the key makes of the row, as the money machine reads its fact (machine::on_found):
// a bank debit that failed while the answer to its create call was lost failed after processing, so it goes
// processing first; a status the pinned API version does not define is looked at again later, never
// charged beside.
recovery_found found_charge(stripe::charge ch) {
    recovery_found f;
    f.charge_id = ch.id;
    if (!ch.payment_intent.empty()) f.payment_intent_id = ch.payment_intent;
    f.status = ch.status;
    switch (machine::on_found(machine::table::charge, stripe::read(ch))) {
        case machine::found_command::mark_processing:
            f.step = found_step::mark_processing;
            break;
        case machine::found_command::mark_declined:
            f.step = found_step::mark_declined;
            f.decline = ch.failure_code;
            break;
        case machine::found_command::mark_charged:
            f.step = found_step::mark_charged;
            break;
        case machine::found_command::still_open:
        case machine::found_command::none:
            f.step = found_step::still_open;
            break;
    }
    f.charge = std::move(ch);
    return f;
}

// What a PaymentIntent carrying the key makes of the row (step_for_found_intent; not_charged is none).
recovery_found found_intent(stripe::payment_intent pi) {
    recovery_found f;
    if (!pi.latest_charge.empty()) f.charge_id = pi.latest_charge;
    f.payment_intent_id = pi.id;
    f.status = pi.status;
    switch (step_for_found_intent(pi)) {
        case found_intent_step::mark_charged:
            f.step = found_step::mark_charged;
            break;
        case found_intent_step::mark_declined:
            f.step = found_step::mark_declined;
            f.decline = "payment intent " + pi.id + " is " + pi.status;
            if (!pi.last_error_code.empty()) f.decline += ": " + pi.last_error_code;
            break;
        case found_intent_step::still_open:
            f.step = found_step::still_open;
            break;
        case found_intent_step::mark_processing:
            f.step = found_step::mark_processing;
            break;
        case found_intent_step::not_charged:
            return recovery_found{};
    }
    f.intent = std::move(pi);
    return f;
}

}  // namespace

net::awaitable<result<recovery_found>> search_by_key(stripe::client& stripe, recovery_query q,
                                                     const logger& log, before_search_fn before) {
    std::optional<std::int64_t> since;
    if (q.first_attempt) since = unix_seconds(*q.first_attempt - q.slack);
    if (before) co_await before();
    auto found =
        co_await stripe.find_charge_by_billing_key(q.stripe_customer_id, q.key, since, 100, q.stripe_account);
    if (!found) co_return found.err();
    if (*found && stripe::charge_movement((**found).status) == stripe::movement::failed &&
        superseded_failure(q, (**found).id, (**found).created)) {
        log.info("a failed charge from before the replay carries the key: not this generation's answer",
                 {{"charge_id", (**found).id}});
        found->reset();
    }
    if (*found) co_return found_charge(std::move(**found));
    if (!q.payment_intent) co_return recovery_found{};
    if (before) co_await before();
    auto pi = co_await stripe.find_payment_intent_by_billing_key(q.stripe_customer_id, q.key, since, 100,
                                                                 q.stripe_account);
    if (!pi) co_return pi.err();
    const auto failed_attempt = [](const stripe::payment_intent& p) {
        auto m = stripe::read(p).moved;
        return m == stripe::movement::failed || m == stripe::movement::needs_customer ||
               m == stripe::movement::canceled;
    };
    if (*pi && failed_attempt(**pi) && superseded_failure(q, (**pi).id, (**pi).created)) {
        log.info("a failed payment intent from before the replay carries the key: not this generation's",
                 {{"payment_intent", (**pi).id}});
        pi->reset();
    }
    if (*pi && step_for_found_intent(**pi) == found_intent_step::not_charged)
        log.warn("the payment intent found was never confirmed: Stripe did not try the card",
                 {{"payment_intent", (*pi)->id}});
    if (*pi) co_return found_intent(std::move(**pi));
    co_return recovery_found{};
}

// RECOVER: take the expired lease (by the database clock), then decide again on the row we now hold — it may
// have moved since it was read (another worker's attempt, an indeterminate answer).
net::awaitable<verdict> charge_flow::recover(run& r) {
    auto taken = co_await ledger_.take_expired_lease(r.key, cfg_.lease, r.d.message_id, r.d.attempts);
    if (!taken) co_return postgres_failed(r, taken.err(), "take lease");
    if (!*taken) {
        // Another worker took it first (or settled it): wait for its lease, by a fresh read of the row.
        auto now_row = co_await ledger_.find(r.key);
        if (!now_row) co_return postgres_failed(r, now_row.err(), "find");
        if (*now_row && is_final((*now_row)->status))
            co_return verdict::finish(verdict_reason::duplicate_prevented,
                                      std::string(to_string((*now_row)->status)));
        std::optional<std::chrono::milliseconds> remaining;
        if (*now_row) remaining = (*now_row)->lease_remaining;
        co_return lease_held(remaining, "lease taken by another worker");
    }
    ledger_record rec = std::move(**taken);
    r.lease = rec.lease_epoch;
    r.attempt_lease = r.lease;
    r.generation = rec.key_generation;
    r.first_attempt = rec.first_stripe_attempt_at;
    auto action = recovery_mode(rec, cfg_.now(), cfg_.same_key_window);
    r.log.info("recovering a pending billing record", {{"action", to_string(action)},
                                                       {"generation", rec.key_generation},
                                                       {"stripe_attempts", rec.stripe_attempts}});
    // Anything but "same key is safe" searches first: searching is never wrong, only slower.
    if (action == existing_action::recover_same_key) co_return co_await charge(r, false);
    co_return co_await search(r);
}

// The recovery search (billing/flow/recovery.hpp), then its step: found → settle from it; none → new
// generation.
net::awaitable<verdict> charge_flow::search(run& r) {
    recovery_query q{
        r.ev.stripe_customer_id, r.key, r.first_attempt, cfg_.search_slack, r.ev.uses_payment_intent(),
        r.ev.stripe_account};
    if (r.generation >= 2) {
        // Maybe a retried declined row: its earlier attempts' payments are not this generation's answer.
        auto old = co_await retry_store(ledger_.pool()).superseded_payments(r.key);
        if (!old) co_return postgres_failed(r, old.err(), "read retries");
        q.superseded = std::move(*old);
    }
    auto found = co_await search_by_key(stripe_, std::move(q), r.log);
    if (!found) co_return co_await search_failed(r, found.err());
    if (found->step != found_step::none) co_return co_await settle_found(r, *found);
    auto bumped = co_await ledger_.bump_generation(r.key, r.lease, r.generation, cfg_.new_key_quiet);
    if (!bumped) co_return postgres_failed(r, bumped.err(), "bump generation");
    if (!bumped->generation && bumped->wait.count() > 0) {
        // A call under this key showed life too recently: it may still charge. Look again once it cannot.
        std::string why = "no charge carries the key yet, but a call under it showed life less than " +
                          std::to_string(cfg_.new_key_quiet.count() / 1000) + " s ago";
        auto rel = co_await ledger_.release_lease(r.key, r.lease, why);
        if (!rel) co_return postgres_failed(r, rel.err(), "release lease");
        r.log.info("waiting out the previous call before a new key generation",
                   {{"wait_ms", static_cast<std::int64_t>(bumped->wait.count())}});
        auto delay =
            std::min(std::max(bumped->wait + std::chrono::milliseconds(100), cfg_.indeterminate_delay),
                     cfg_.max_requeue_delay);
        co_return verdict::requeue(verdict_reason::requeued_indeterminate, delay, why);
    }
    if (!bumped->generation)
        co_return verdict::requeue(verdict_reason::requeued_lease_lost, cfg_.lease_held_delay,
                                   "bump generation");
    r.log.warn("no charge carries the key: charging under a new key generation",
               {{"generation", *bumped->generation}});
    r.generation = *bumped->generation;
    co_return co_await charge(r, false);
}

// Without an answer from the search nothing may be charged: give the row back for a later try.
net::awaitable<verdict> charge_flow::search_failed(run& r, const error& e) {
    auto rel = co_await ledger_.release_lease(r.key, r.lease, "charge search failed: " + e.describe());
    if (!rel) r.log.warn("could not release the lease", {{"error", rel.err().describe()}});
    co_return verdict::requeue(verdict_reason::requeued_stripe_unavailable, cfg_.stripe_unavailable_delay,
                               e.describe());
}

// A charge or PaymentIntent carrying our key, found by the recovery search.
net::awaitable<verdict> charge_flow::settle_found(run& r, const recovery_found& f) {
    switch (f.step) {
        case found_step::mark_charged: {
            auto m = co_await ledger_.mark_charged(r.key, f.charge_id.value_or(""), f.payment_intent_id);
            if (!m) co_return postgres_failed(r, m.err(), "mark charged");
            if (*m)
                journal_.note({r.key, r.generation, r.attempt_lease, r.lease, record_status::charged,
                               f.charge_id.value_or(""), f.payment_intent_id, std::nullopt,
                               std::chrono::steady_clock::now()});
            if (f.intent) {
                if (!*m)
                    r.log.warn("row already settled by another worker", {{"payment_intent", f.intent->id}});
                co_return verdict::finish(verdict_reason::charged,
                                          "found existing payment intent " + f.intent->id);
            }
            if (!*m) r.log.warn("row already settled by another worker", {{"charge_id", f.charge->id}});
            co_return verdict::finish(verdict_reason::charged, "found existing charge " + f.charge->id);
        }
        case found_step::mark_declined: {
            auto why = "declined (found by search): " + f.decline;
            auto m = co_await ledger_.mark_declined(r.key, f.charge_id, why, f.payment_intent_id);
            if (!m) co_return postgres_failed(r, m.err(), "mark declined");
            if (*m)
                journal_.note({r.key, r.generation, r.attempt_lease, r.lease, record_status::declined,
                               f.charge_id, f.payment_intent_id, std::move(why),
                               std::chrono::steady_clock::now()});
            bool authenticate = false;
            if (f.intent) {
                const auto fact = stripe::read(*f.intent);
                authenticate = needs_authentication(f.intent->last_error_code, &fact);
            }
            co_return verdict::finish(
                authenticate ? verdict_reason::needs_authentication : verdict_reason::declined,
                f.intent ? "found " + f.decline : "found declined charge " + f.charge->id);
        }
        case found_step::still_open: {
            // Succeeding but no charge yet (or a status Stripe's pinned version does not define): the payment
            // is ours and moving; look again later, never recharge.
            const std::string what = f.intent ? "payment intent " + f.intent->id : "charge " + f.charge->id;
            const std::string status = f.intent ? f.intent->status : f.charge->status;
            auto rel = co_await ledger_.release_lease(r.key, r.lease, what + " still open");
            if (!rel) co_return postgres_failed(r, rel.err(), "release lease");
            co_return verdict::requeue(verdict_reason::requeued_indeterminate, cfg_.indeterminate_delay,
                                       what + " is " + status + " without a settled charge yet");
        }
        case found_step::mark_processing:
            co_return co_await leave_processing(r, f.charge_id, f.payment_intent_id, f.status);
        case found_step::none:
            break;
    }
    throw std::logic_error("settle_found: nothing found");
}

}  // namespace cg::billing
