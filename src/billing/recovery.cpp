// The pipeline's recovery: a pending row found again (RECOVER), and the search of the customer's charges and
// PaymentIntents for one carrying the row's base key.
#include <stdexcept>

#include "billing/pipeline_run.hpp"
#include "stripe/client.hpp"

namespace cg::billing {
namespace {

std::int64_t unix_seconds(sys_time t) {
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// A failed payment carrying the key, created well before the row's first attempt (five minutes of clock
// skew allowed), belongs to an earlier life of the row: the payment that failed after processing, which a
// replay superseded (reopening restarts the attempt window). It says nothing about the current generation
// and is never read as this row's decline; a success is always believed.
bool superseded_failure(const std::optional<sys_time>& first_attempt, std::int64_t created) {
    return first_attempt && created < unix_seconds(*first_attempt) - 300;
}

}  // namespace

// RECOVER: take the expired lease (by the database clock), then decide again on the row we now hold — it may
// have moved since it was read (another worker's attempt, an indeterminate answer).
net::awaitable<verdict> pipeline::recover(run& r) {
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

// List the customer's charges — and, for a PaymentIntent event, its PaymentIntents — for one carrying our
// base key: found → settle from it; none → new generation. Charges first: every confirmed intent that reached
// the card made one (carrying the intent's metadata); an intent that stopped at requires_action made none and
// is only found in the second list.
net::awaitable<verdict> pipeline::search(run& r) {
    std::optional<std::int64_t> since;
    if (r.first_attempt) since = unix_seconds(*r.first_attempt - cfg_.search_slack);
    auto found = co_await stripe_.find_charge_by_billing_key(r.ev.stripe_customer_id, r.key, since);
    if (!found) co_return co_await search_failed(r, found.err());
    if (*found && (**found).status == "failed" && superseded_failure(r.first_attempt, (**found).created)) {
        r.log.info("a failed charge from before the replay carries the key: not this generation's answer",
                   {{"charge_id", (**found).id}});
        found->reset();
    }
    if (*found) {
        const stripe::charge& ch = **found;
        std::optional<std::string> intent;
        if (!ch.payment_intent.empty()) intent = ch.payment_intent;
        if (stripe::charge_in_flight(ch.status))
            co_return co_await leave_processing(r, ch.id, intent, ch.status);
        // A bank debit that failed while the answer to its create call was lost: it failed after processing
        // (the events recorded for it, or the poll, make the row failed_after_processing with its letter).
        if (ch.status == "failed" && stripe::bank_debit(ch.payment_method_type))
            co_return co_await leave_processing(r, ch.id, intent, ch.status);
        if (ch.status == "failed") {
            auto m = co_await ledger_.mark_declined(r.key, ch.id,
                                                    "declined (found by search): " + ch.failure_code, intent);
            if (!m) co_return postgres_failed(r, m.err(), "mark declined");
            co_return verdict::finish(verdict_reason::declined, "found declined charge " + ch.id);
        }
        auto m = co_await ledger_.mark_charged(r.key, ch.id, intent);
        if (!m) co_return postgres_failed(r, m.err(), "mark charged");
        if (!*m) r.log.warn("row already settled by another worker", {{"charge_id", ch.id}});
        co_return verdict::finish(verdict_reason::charged, "found existing charge " + ch.id);
    }
    if (r.ev.uses_payment_intent()) {
        auto pi = co_await stripe_.find_payment_intent_by_billing_key(r.ev.stripe_customer_id, r.key, since);
        if (!pi) co_return co_await search_failed(r, pi.err());
        if (*pi && step_for_found_intent(**pi) == found_intent_step::mark_declined &&
            superseded_failure(r.first_attempt, (**pi).created)) {
            r.log.info(
                "a failed payment intent from before the replay carries the key: not this generation's",
                {{"payment_intent", (**pi).id}});
            pi->reset();
        }
        if (*pi && step_for_found_intent(**pi) != found_intent_step::not_charged)
            co_return co_await settle_found_intent(r, **pi);
        if (*pi)
            r.log.warn("the payment intent found was never confirmed: Stripe did not try the card",
                       {{"payment_intent", (*pi)->id}});
    }
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
net::awaitable<verdict> pipeline::search_failed(run& r, const error& e) {
    auto rel = co_await ledger_.release_lease(r.key, r.lease, "charge search failed: " + e.describe());
    if (!rel) r.log.warn("could not release the lease", {{"error", rel.err().describe()}});
    co_return verdict::requeue(verdict_reason::requeued_stripe_unavailable, cfg_.stripe_unavailable_delay,
                               e.describe());
}

// A PaymentIntent carrying our key, found by the recovery search.
net::awaitable<verdict> pipeline::settle_found_intent(run& r, const stripe::payment_intent& pi) {
    std::optional<std::string> charge_id;
    if (!pi.latest_charge.empty()) charge_id = pi.latest_charge;
    switch (step_for_found_intent(pi)) {
        case found_intent_step::mark_charged: {
            auto m = co_await ledger_.mark_charged(r.key, pi.latest_charge, pi.id);
            if (!m) co_return postgres_failed(r, m.err(), "mark charged");
            if (!*m) r.log.warn("row already settled by another worker", {{"payment_intent", pi.id}});
            co_return verdict::finish(verdict_reason::charged, "found existing payment intent " + pi.id);
        }
        case found_intent_step::mark_declined: {
            std::string why = "payment intent " + pi.id + " is " + pi.status;
            if (!pi.last_error_code.empty()) why += ": " + pi.last_error_code;
            auto m =
                co_await ledger_.mark_declined(r.key, charge_id, "declined (found by search): " + why, pi.id);
            if (!m) co_return postgres_failed(r, m.err(), "mark declined");
            co_return verdict::finish(verdict_reason::declined, "found " + why);
        }
        case found_intent_step::still_open: {
            // Succeeding but no charge yet: the intent is ours and moving; look again later, never recharge.
            auto rel =
                co_await ledger_.release_lease(r.key, r.lease, "payment intent " + pi.id + " still open");
            if (!rel) co_return postgres_failed(r, rel.err(), "release lease");
            co_return verdict::requeue(
                verdict_reason::requeued_indeterminate, cfg_.indeterminate_delay,
                "payment intent " + pi.id + " is " + pi.status + " without a charge yet");
        }
        case found_intent_step::mark_processing:
            co_return co_await leave_processing(r, charge_id, pi.id, pi.status);
        case found_intent_step::not_charged:
            break;  // search() goes on to a new generation instead
    }
    throw std::logic_error("unknown found_intent_step");
}

}  // namespace cg::billing
