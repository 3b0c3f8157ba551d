// The recovery search as one call (recovery.hpp), for reconcile.
#include "billing/flow/recovery.hpp"

#include <algorithm>
#include <stdexcept>

#include "billing/machine/machine.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {
namespace {

std::int64_t unix_seconds(sys_time t) {
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

// The charge carrying the key, and the machine's reading of it (on_found): a bank debit that failed while the
// answer to its create call was lost goes processing first; a status the pinned API version does not define
// is looked at again later, never charged beside.
recovery_found found_charge(stripe::charge ch) {
    recovery_found f;
    f.command = machine::on_found(machine::table::charge, stripe::read(ch));
    f.charge_id = ch.id;
    if (!ch.payment_intent.empty()) f.payment_intent_id = ch.payment_intent;
    f.status = ch.status;
    if (f.command == machine::found_command::mark_declined) f.decline = ch.failure_code;
    f.charge = std::move(ch);
    return f;
}

// The PaymentIntent carrying the key, and the machine's reading of it (on_found). `none` (an intent Stripe
// never tried) is as if nothing carried the key.
recovery_found found_intent(stripe::payment_intent pi) {
    recovery_found f;
    f.command = machine::on_found(machine::table::charge, stripe::read(pi));
    if (f.command == machine::found_command::none) return recovery_found{};
    if (!pi.latest_charge.empty()) f.charge_id = pi.latest_charge;
    f.payment_intent_id = pi.id;
    f.status = pi.status;
    if (f.command == machine::found_command::mark_declined) {
        f.decline = "payment intent " + pi.id + " is " + pi.status;
        if (!pi.last_error_code.empty()) f.decline += ": " + pi.last_error_code;
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
    if (*found && machine::superseded_failure(stripe::read(**found), (**found).created, q.superseded,
                                              q.first_attempt)) {
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
    if (*pi &&
        machine::superseded_failure(stripe::read(**pi), (**pi).created, q.superseded, q.first_attempt)) {
        log.info("a failed payment intent from before the replay carries the key: not this generation's",
                 {{"payment_intent", (**pi).id}});
        pi->reset();
    }
    if (*pi && machine::on_found(machine::table::charge, stripe::read(**pi)) == machine::found_command::none)
        log.warn("the payment intent found was never confirmed: Stripe did not try the card",
                 {{"payment_intent", (*pi)->id}});
    if (*pi) co_return found_intent(std::move(**pi));
    co_return recovery_found{};
}

}  // namespace cg::billing
