// The charge flow's executor: what each command of the charge fsm (billing/machine/charge_fsm.hpp) runs
// against the ledger and Stripe, and the input its outcome becomes. No decision is taken here.
#include <asio/this_coro.hpp>
#include <exception>
#include <memory>
#include <stdexcept>

#include "billing/flow/charge_flow.hpp"
#include "billing/flow/charge_flow_run.hpp"
#include "billing/store/retry_store.hpp"
#include "net/turn_budget.hpp"
#include "stripe/client.hpp"

namespace cg::billing {
namespace {

using machine::op;
namespace in = machine::in;

// The ledger's in-flight note as a lease renewal takes it (lease_renewal::note_in_flight).
net::awaitable<result<void>> note_in_flight(billing::ledger& ledger, std::string key,
                                            std::int32_t generation) {
    auto noted = co_await ledger.note_in_flight(std::move(key), generation);
    if (!noted) co_return noted.err();
    co_return result<void>{};
}

// A statement's outcome as the fsm takes it.
machine::fsm_input changed(const result<bool>& m) {
    if (!m) return in::failed{m.err()};
    return in::applied{*m};
}

}  // namespace

// Not a coroutine: the command's own coroutine is what drive() awaits. g++ gives every local of every
// branch of a coroutine its own slot in the frame, so one coroutine for all commands kept a frame sized for
// all of them beside the Stripe call or the pre-flight statement a delivery waits in, for each of the
// hundreds of deliveries in flight.
net::awaitable<machine::fsm_input> charge_flow::execute(run& r, machine::charge_fsm& fsm,
                                                        const machine::command& c) {
    switch (c.what) {
        case op::preflight:
            return preflight(r, fsm);
        case op::create:
            return call_stripe(r, fsm, c);
        case op::settle:
            return settle(r, fsm, c);
        default:
            return run_command(r, fsm, c);
    }
}

net::awaitable<machine::fsm_input> charge_flow::preflight(run& r, machine::charge_fsm& fsm) {
    r.log.debug("pre-flight");
    new_record row{fsm.key(), fsm.event(), r.d.message_id, r.d.attempts, cfg_.key_namespace};
    auto pf = co_await ledger_.preflight(std::move(row), cfg_.lease);
    if (!pf) co_return in::failed{pf.err()};
    if (pf->inserted) r.log.debug("ledger row written");
    co_return in::preflighted{pf->inserted, std::move(pf->record), cfg_.now()};
}

// The commands other than the pre-flight, the Stripe call and the settles (execute() above).
net::awaitable<machine::fsm_input> charge_flow::run_command(run& r, machine::charge_fsm& fsm,
                                                            const machine::command& c) {
    const auto& key = fsm.key();
    switch (c.what) {
        case op::find: {
            auto row = co_await ledger_.find(key);
            if (!row) co_return in::failed{row.err()};
            co_return in::row{std::move(*row), cfg_.now()};
        }
        case op::take_lease: {
            auto taken = co_await ledger_.take_expired_lease(key, cfg_.lease, r.d.message_id, r.d.attempts);
            if (!taken) co_return in::failed{taken.err()};
            co_return in::row{std::move(*taken), cfg_.now()};
        }
        case op::record_attempt: {
            auto att = co_await ledger_.record_attempt(key, fsm.held_lease(), cfg_.lease);
            if (!att) co_return in::failed{att.err()};
            if (!*att) co_return in::attempted{};
            co_return in::attempted{(*att)->key_generation, (*att)->lease};
        }
        case op::superseded_payments: {
            auto old = co_await retry_store(ledger_.pool()).superseded_payments(key);
            if (!old) co_return in::failed{old.err()};
            co_return in::superseded{std::move(*old)};
        }
        case op::bump_generation: {
            auto b = co_await ledger_.bump_generation(key, fsm.held_lease(), fsm.generation(),
                                                      c.quiet.value_or(cfg_.new_key_quiet));
            if (!b) co_return in::failed{b.err()};
            co_return in::bumped{b->generation, b->wait};
        }
        case op::apply_recorded: {
            auto applied = co_await settlements_->apply_recorded(key);
            if (!applied) {
                r.log.warn("could not apply the events recorded for the row yet",
                           {{"error", applied.err().describe()}});
                co_return in::failed{applied.err()};
            }
            if (*applied && (*applied)->failed_now) {
                if (metrics_) metrics_->failed_after_processing->Increment();
                r.log.error("alert: payment failed after processing; dead-lettered, replay charges again",
                            {{"alert", true}, {"reason", (*applied)->note}});
            }
            co_return in::applied{applied->has_value()};
        }
        case op::dead_letter: {
            auto added = co_await ledger_.add_dead_letter(r.letter(c.text, c.letter_key));
            co_return changed(added);
        }
        case op::search_charges: {
            const auto& q = c.search;
            auto found = co_await stripe_.find_charge_by_billing_key(q.stripe_customer_id, q.key, q.since,
                                                                     100, q.stripe_account);
            if (!found) co_return in::failed{found.err()};
            co_return in::charge_found{std::move(*found)};
        }
        case op::search_intents: {
            const auto& q = c.search;
            auto found = co_await stripe_.find_payment_intent_by_billing_key(q.stripe_customer_id, q.key,
                                                                             q.since, 100, q.stripe_account);
            if (!found) co_return in::failed{found.err()};
            co_return in::intent_found{std::move(*found)};
        }
        case op::pause:
            co_await test_pause();
            co_return in::resumed{};
        case op::correction: {
            auto v = co_await corrections_->handle(r.d, r.touch, fsm.event(), key, r.log);
            co_return in::corrected{std::move(v)};
        }
        case op::done:
        case op::preflight:
        case op::create:
        case op::settle:
            break;
    }
    throw std::logic_error("charge_flow: no command to execute");
}

// A ledger command of the charge vocabulary (charge_step): the settle statements, the release.
net::awaitable<machine::fsm_input> charge_flow::settle(run& r, machine::charge_fsm& fsm,
                                                       const machine::command& c) {
    const auto& key = fsm.key();
    switch (c.step) {
        case charge_step::mark_charged: {
            auto m = co_await ledger_.mark_charged(key, c.charge_id.value_or(""), c.payment_intent_id);
            co_return changed(m);
        }
        case charge_step::mark_declined: {
            auto m = co_await ledger_.mark_declined(key, c.charge_id, c.text, c.payment_intent_id);
            co_return changed(m);
        }
        case charge_step::mark_cap_blocked: {
            auto m = co_await ledger_.mark_cap_blocked(key, c.text, r.letter(c.letter, key));
            co_return changed(m);
        }
        case charge_step::mark_conflict_dead_letter: {
            auto m = co_await ledger_.mark_conflict(key, c.text, r.letter(c.letter, key));
            co_return changed(m);
        }
        case charge_step::mark_failed_dead_letter: {
            auto m = co_await ledger_.mark_failed(key, c.text, r.letter(c.letter, key));
            co_return changed(m);
        }
        case charge_step::mark_processing: {
            if (c.alert) {
                if (metrics_) metrics_->requires_capture->Increment();
                r.log.error(
                    "alert: Stripe left the payment intent requires_capture, an authorisation chargeguard "
                    "never "
                    "asks for; recorded as processing, not charged",
                    {{"alert", true}, {"payment_intent", c.payment_intent_id.value_or("")}});
            }
            auto m =
                co_await ledger_.mark_processing(key, c.charge_id, c.payment_intent_id, c.status,
                                                 r.letter(std::string(failed_after_processing_reason), key));
            if (m)
                r.log.info("payment processing: the row waits for Stripe's final answer",
                           {{"status", c.status},
                            {"payment_intent", c.payment_intent_id.value_or("")},
                            {"charge_id", c.charge_id.value_or("")}});
            co_return changed(m);
        }
        case charge_step::mark_indeterminate_requeue: {
            auto m = co_await ledger_.mark_indeterminate(key, fsm.held_lease(), c.text);
            co_return changed(m);
        }
        case charge_step::release_requeue:
        case charge_step::setup_requeue: {
            auto m = co_await ledger_.release_lease(key, fsm.held_lease(), c.text);
            co_return changed(m);
        }
    }
    throw std::logic_error("unknown charge_step");
}

// CREATE: the call is awaited here, the lease kept by a timer beside it (lease_keeper). A delivery waits for
// its turn among the client's calls before it builds its request: meanwhile it holds this frame and a timer,
// neither the request nor the client's coroutines.
net::awaitable<machine::fsm_input> charge_flow::call_stripe(run& r, machine::charge_fsm& fsm,
                                                            const machine::command& c) {
    r.called_stripe = true;
    stripe::charge_outcome out;
    auto ex = co_await asio::this_coro::executor;
    auto keeper = std::make_shared<lease_keeper>(
        ex, cfg_.lease_renew_interval, [this, &r, &fsm] { return renew_once(r, fsm); }, r.log);
    auto began = std::chrono::steady_clock::now();
    r.log.debug("calling Stripe", {{"generation", fsm.generation()}});
    keeper->start();
    std::exception_ptr failed;
    try {
        auto turn = co_await stripe_.turn();
        auto req = c.request;
        auto* intent = std::get_if<stripe::payment_intent_request>(&req);
        // One awaitable, one result slot in this frame (a co_await per branch would give each its own).
        auto call =
            intent ? stripe_.create_payment_intent(std::move(*intent), std::move(turn))
                   : stripe_.create_charge(std::move(std::get<stripe::charge_request>(req)), std::move(turn));
        out = co_await std::move(call);
    } catch (...) {
        failed = std::current_exception();
    }
    co_await keeper->stop();
    if (failed) std::rethrow_exception(failed);
    r.log.debug("Stripe answered", {{"outcome", stripe::to_string(out.cls)}, {"charge_id", out.charge_id}});
    auto took = std::chrono::steady_clock::now() - began;
    // Answers to calls made together come back together: past the loop's turn budget the settlement starts
    // on the next turn, behind sockets and timers (net/turn_budget.hpp).
    if (!turns_) turns_ = &net::turn_budget::of(ex);
    if (turns_->spent()) co_await turns_->next_turn();
    note_stripe_time(took);
    if (metrics_) metrics_->stripe_duration->Observe(std::chrono::duration<double>(took).count());
    co_return in::answer{std::move(out)};
}

// One renewal while Stripe is awaited (lease_keeper): tell the transport we are alive and extend the lease,
// so a redelivery elsewhere sees "lease held" instead of recovering a row whose call is still in flight.
// The fsm says what to write and takes the result (its held lease moves on, or it learns the lease is lost).
net::awaitable<void> charge_flow::renew_once(run& r, machine::charge_fsm& fsm) {
    const auto& key = fsm.key();
    lease_renewal how{
        r.touch, [this, &key](std::int64_t epoch) { return ledger_.renew_lease(key, epoch, cfg_.lease); },
        [this, &key](std::int32_t generation) { return note_in_flight(ledger_, key, generation); },
        metrics_ ? metrics_->lease_lost : nullptr, "row"};
    if (auto renewed = co_await billing::renew_once(how, fsm.renewal(), r.log)) fsm.renewed(*renewed);
}

}  // namespace cg::billing
