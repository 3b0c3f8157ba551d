#include "app/declined_retry.hpp"

#include <optional>
#include <string>

#include "billing/machine/decision.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/machine.hpp"
#include "nsq/producer.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
// A named namespace, not an anonymous one: the unity build joins the app's files into one unit.
namespace declined_retry_impl {

void problem(declined_retry& x, const std::string& line) {
    ++x.n.failed;
    x.say(line, true);
}

// What the open intent of a declined row allows. true: the row may be reopened (the intent is cancelled,
// or there is none); false: it may not, and the reason was said.
net::awaitable<bool> settle_open_intent(declined_retry& x, const billing::retry_candidate& c) {
    if (!c.payment_intent_id) co_return true;
    const std::string& id = *c.payment_intent_id;
    const std::string who = describe_row(c);
    if (!x.stripe) {
        problem(x, who + ": declined payment intent " + id +
                       " may still be open, and Stripe is not reachable from here (" + x.stripe_unusable +
                       "): not retried");
        co_return false;
    }
    for (int round = 0; round < 2; ++round) {
        auto pi = co_await x.stripe->retrieve_payment_intent(id, c.event.stripe_account);
        if (!pi) {
            problem(x, who + ": retrieving payment intent " + id + " failed: " + pi.err().describe() +
                           ": not retried");
            co_return false;
        }
        if (stripe::intent_succeeded(pi->status)) {
            auto m = co_await x.store.charged_by_its_intent(c.key, id, pi->latest_charge);
            if (!m) {
                problem(x, who + ": recording payment intent " + id +
                               " as charged failed: " + m.err().describe());
                co_return false;
            }
            x.say(who + ": payment intent " + id + " succeeded after all (" + pi->latest_charge +
                      "): " + (*m ? "recorded charged" : "the row moved meanwhile") + ", not retried",
                  false);
            ++x.n.charged;
            co_return false;
        }
        if (stripe::intent_movement(pi->status) == stripe::movement::canceled) co_return true;
        if (stripe::intent_in_flight(pi->status)) {
            problem(x, who + ": payment intent " + id + " is " + pi->status +
                           " (money may still move): not retried");
            co_return false;
        }
        // Still open (requires_action, requires_payment_method, requires_confirmation): cancel it, so it can
        // never succeed beside the retry's payment. A refusal means it moved: look again.
        auto target = "/v1/payment_intents/" + id + "/cancel";
        auto cancelled =
            co_await x.stripe->call("POST", target, "", c.key + "-cancel-" + id, c.event.stripe_account);
        if (cancelled.cls == stripe::outcome_class::succeeded) {
            x.say(who + ": payment intent " + id + " was " + pi->status + ": cancelled", false);
            co_return true;
        }
    }
    problem(x, who + ": payment intent " + id + " could not be cancelled: not retried");
    co_return false;
}

// The retry that reopened a pending row, if one did (the row's generation is that retry's): its event is
// published again, since a crash may have come between the reopen and the publish.
net::awaitable<result<std::optional<billing::retry_record>>> pending_by_retry(
    declined_retry& x, const billing::retry_candidate& c) {
    auto retries = co_await x.store.retries_of(c.key);
    if (!retries) co_return retries.err();
    if (retries->empty() || retries->back().generation != c.key_generation)
        co_return std::optional<billing::retry_record>();
    co_return std::optional<billing::retry_record>(retries->back());
}

}  // namespace declined_retry_impl

std::string describe_row(const billing::retry_candidate& c) {
    std::string s =
        "key " + c.key + " (customer " + c.event.customer_id + ", period " + c.event.billing_period;
    if (c.event.connected()) s += ", account " + c.event.stripe_account;
    return s + ")";
}

net::awaitable<bool> retry_declined_row(declined_retry& x, const billing::retry_candidate& c) {
    using namespace declined_retry_impl;
    const std::string who = describe_row(c);
    std::string done;
    const auto command = billing::machine::on_retry_declined(c.status);
    if (command == billing::machine::retry_command::reopen) {
        if (!co_await settle_open_intent(x, c)) co_return true;
        auto r = co_await x.store.reopen_declined(c.key, x.by, x.reason, x.once_per_requester);
        if (!r) {
            problem(x, who + ": reopening failed: " + r.err().describe());
            co_return true;
        }
        if (!*r) {
            x.say(who + (x.once_per_requester
                             ? ": not reopened (" + x.by +
                                   " retried it before, or another retry reopened it "
                                   "first): nothing done"
                             : std::string(
                                   ": no longer declined (another retry reopened it first): nothing done")),
                  false);
            ++x.n.retried;
            co_return true;
        }
        done = "retry #" + std::to_string((*r)->id) + " by " + x.by + ": reopened under generation " +
               std::to_string((*r)->generation) + " (was declined: " + c.last_error.value_or("-") + ")";
    } else if (command == billing::machine::retry_command::follow_pending) {
        auto p = co_await pending_by_retry(x, c);
        if (!p) {
            problem(x, who + ": reading its retries failed: " + p.err().describe());
            co_return true;
        }
        if (!*p) {
            x.say(who + ": pending: the pipeline is charging it; nothing to retry", true);
            ++x.n.not_declined;
            co_return true;
        }
        const auto& last = **p;
        done = "retry #" + std::to_string(last.id) + " by " + last.requested_by + " at " + last.requested_at +
               " is under way (generation " + std::to_string(last.generation) + "): published again";
    } else if (command == billing::machine::retry_command::already_charged) {
        x.say(who + ": charged (" + c.charge_id.value_or("-") + "): nothing to retry", false);
        ++x.n.charged;
        co_return true;
    } else {
        x.say(who + ": " + std::string(billing::to_string(c.status)) + ", not declined (" +
                  c.last_error.value_or("-") + "): not retried (see chargeguard explain, dead-letters)",
              true);
        ++x.n.not_declined;
        co_return true;
    }
    auto pub = co_await x.producer.publish(x.topic, billing::to_json(c.event));
    if (!pub) {
        problem(x, who + ": " + done + ", but publishing to " + x.topic + " failed: " + pub.err().describe() +
                       " (the row is pending: the sweeper charges it, or run this command again)");
        co_return false;
    }
    x.say(who + ": " + done + "; event published to " + x.topic, false);
    ++x.n.retried;
    co_return true;
}

}  // namespace cg::app
