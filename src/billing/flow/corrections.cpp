#include "billing/flow/corrections.hpp"

#include <asio/this_coro.hpp>
#include <stdexcept>

#include "billing/flow/charge_flow.hpp"
#include "billing/flow/lease_keeper.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"
#include "stripe/refunds.hpp"

namespace cg::billing {

struct corrections::job {
    const delivery& d;
    std::function<void()> touch;
    billing_event ev;
    std::string base;
    std::string key;  // correction_key(base, revision)
    logger log;
    std::int64_t epoch = 0;
    std::int64_t delta = 0;

    dead_letter letter(std::string reason) const {
        return {d.topic, d.channel, d.message_id, d.attempts, d.body, std::move(reason), key};
    }
};

namespace {

// What every Stripe object of a move carries: its own key (what the search looks for), the original key it
// corrects, the revision, and the period's names.
stripe::metadata move_metadata(const billing_event& ev, const std::string& base,
                               const std::string& move_key) {
    return {{"billing_key", move_key},
            {"corrects", base},
            {"revision", std::to_string(ev.revision)},
            {"customer_id", ev.customer_id},
            {"billing_period", ev.billing_period}};
}

}  // namespace

corrections::corrections(const charge_flow_config& cfg, billing::ledger& ledger, stripe::client& stripe)
    : cfg_(cfg), ledger_(ledger), store_(ledger.pool()), stripe_(stripe) {}

verdict corrections::postgres_failed(job& j, const error& e, std::string_view step) {
    return billing::postgres_failed(cfg_, j.d.attempts, j.log, e, step);
}

// A correction never gives up on a predecessor that has not arrived yet: that would move its money zero
// times.
verdict corrections::waiting(std::string detail) {
    double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    auto base = std::min(cfg_.correction_wait_delay, cfg_.max_requeue_delay);
    auto jitter =
        std::chrono::milliseconds(static_cast<std::int64_t>(static_cast<double>(base.count()) * unit / 10));
    return verdict::requeue(verdict_reason::requeued_waiting, std::min(base + jitter, cfg_.max_requeue_delay),
                            std::move(detail));
}

net::awaitable<verdict> corrections::handle(const delivery& d, std::function<void()> touch, billing_event ev,
                                            std::string base, logger log) {
    job j{d, std::move(touch), std::move(ev), std::move(base), {}, std::move(log)};
    j.key = correction_key(j.base, j.ev.revision);
    j.log = j.log.with({{"correction_key", j.key}, {"revision", j.ev.revision}});
    auto a = co_await store_.admit(j.key, j.base, j.ev.revision, j.ev.amount_cents, j.ev.currency, d.body,
                                   d.message_id, cfg_.lease);
    if (!a) co_return postgres_failed(j, a.err(), "correction admit");
    const auto& act = a->action;
    if (act == "wait_original") co_return waiting("waiting for the original charge: " + a->detail);
    if (act == "wait_predecessor") co_return waiting("waiting for revision " + a->detail);
    if (act == "lease_held") {
        double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
        co_return verdict::requeue(
            verdict_reason::requeued_lease_held,
            lease_held_requeue_delay(a->lease_remaining, cfg_.lease, cfg_.lease_held_delay,
                                     cfg_.max_requeue_delay, unit),
            "correction " + a->detail);
    }
    if (act == "final")
        co_return verdict::finish(verdict_reason::duplicate_prevented, "revision " + a->detail + " already");
    if (act == "superseded" || act == "applied_zero" || act == "original_declined")
        co_return verdict::finish(verdict_reason::correction_noop, act + ": " + a->detail);
    if (act == "conflict") {
        // As for the original charge: the recorded revision stays as it is and a human decides.
        auto added = co_await ledger_.add_dead_letter(j.letter("conflict"));
        if (!added) co_return postgres_failed(j, added.err(), "dead letter");
        j.log.warn("correction conflicts with the ledger", {{"detail", a->detail}});
        co_return verdict::finish(verdict_reason::dead_lettered, "conflict");
    }
    if (act != "run") throw std::logic_error("cg_correction_admit: unknown action " + act);
    j.epoch = a->epoch;
    j.delta = a->delta.value_or(0);
    j.log.debug("correction leased", {{"delta_cents", j.delta}, {"step", a->detail}});
    co_return co_await run_moves(j);
}

// Every pending move in order; the revision is applied once none is left.
net::awaitable<verdict> corrections::run_moves(job& j) {
    auto ms = co_await store_.moves(j.key);
    if (!ms) co_return postgres_failed(j, ms.err(), "correction moves");
    std::string ids;
    for (const auto& m : *ms) {
        if (m.status == "pending") {
            auto v = co_await run_move(j, m);
            if (v) co_return std::move(*v);
            continue;  // done now
        }
        if (m.status != "done") {
            // Declined or failed: the revision ended with it, and a crash came before the revision was
            // marked.
            auto f =
                co_await store_.finish(j.key, m.status, "move " + std::to_string(m.part) + " " + m.status);
            if (!f) co_return postgres_failed(j, f.err(), "correction ended");
            co_return verdict::finish(verdict_reason::duplicate_prevented, "move " + m.status);
        }
    }
    auto again = co_await store_.moves(j.key);
    if (!again) co_return postgres_failed(j, again.err(), "correction moves");
    for (const auto& m : *again) ids += (ids.empty() ? "" : ",") + m.stripe_object_id.value_or("?");
    auto f = co_await store_.finish(j.key, "applied", "");
    if (!f) co_return postgres_failed(j, f.err(), "correction applied");
    j.log.info("correction applied", {{"delta_cents", j.delta}, {"stripe", ids}});
    co_return verdict::finish(j.delta > 0 ? verdict_reason::charged : verdict_reason::refunded, ids);
}

// One move: straight to Stripe under its key while that key is trusted, else the search first. nullopt:
// the move is done, go on.
net::awaitable<std::optional<verdict>> corrections::run_move(job& j, const correction_move& m) {
    auto now = cfg_.now();
    bool trusted = !m.indeterminate_since &&
                   (!m.first_stripe_attempt_at || now - *m.first_stripe_attempt_at < cfg_.same_key_window);
    if (!trusted) {
        auto s = co_await search_move(j, m);
        if (s) co_return s;
        // Nothing at Stripe under the key: a new generation, once no call under the old one can still land.
        auto b =
            co_await store_.bump_generation(j.key, m.part, j.epoch, m.key_generation, cfg_.new_key_quiet);
        if (!b) co_return postgres_failed(j, b.err(), "correction new key");
        if (!*b) {
            auto r = co_await store_.release(j.key, m.part, j.epoch, "waiting for quiet before a new key");
            if (!r) co_return postgres_failed(j, r.err(), "release lease");
            co_return verdict::requeue(verdict_reason::requeued_indeterminate,
                                       std::max(cfg_.indeterminate_delay, cfg_.new_key_quiet / 10),
                                       "waiting for quiet before a new key");
        }
        // A named copy: g++ 12 destroys a temporary argument of a co_awaited call twice.
        correction_move next = m;
        next.key_generation = m.key_generation + 1;
        next.first_stripe_attempt_at.reset();
        next.indeterminate_since.reset();
        co_return co_await run_move(j, next);
    }

    auto att = co_await store_.record_attempt(j.key, m.part, j.epoch, cfg_.lease);
    if (!att) co_return postgres_failed(j, att.err(), "correction record attempt");
    if (!*att)
        co_return verdict::requeue(verdict_reason::requeued_lease_lost, cfg_.lease_held_delay, "correction");
    j.epoch = **att;

    auto a = co_await call_move_kept(j, m);
    j.log.debug("Stripe answered a correction",
                {{"step", machine::to_string(a.plan.command)}, {"object", a.object_id}});
    co_return co_await settle_move(j, m, std::move(a));
}

// The move's Stripe call with the revision's lease kept alive beside it, as a charge's is (charge_flow.cpp):
// a redelivery, or a sweeper, that comes while Stripe is slow finds the lease held instead of sending the
// same move again.
net::awaitable<corrections::move_answer> corrections::call_move_kept(job& j, const correction_move& m) {
    auto ex = co_await asio::this_coro::executor;
    auto keeper = std::make_shared<lease_keeper>(
        ex, cfg_.lease_renew_interval, [this, &j, &m](lease_keeper& k) { return renew_once(j, m, k); },
        j.log);
    keeper->start();
    move_answer a;
    std::exception_ptr failed;
    try {
        a = co_await call_move(j, m);
    } catch (...) {
        failed = std::current_exception();
    }
    co_await keeper->stop();
    if (failed) std::rethrow_exception(failed);
    co_return a;
}

// One renewal while a move's call is awaited: the message touched, the revision's lease extended — or, once
// it was taken over, the call noted in flight, so whoever holds the revision now takes no new key generation
// while this call can still move money.
net::awaitable<void> corrections::renew_once(job& j, const correction_move& m, lease_keeper& k) {
    lease_renewal how{
        j.touch,
        [this, &j, &m](std::int64_t epoch) { return store_.renew_lease(j.key, m.part, epoch, cfg_.lease); },
        [this, &j, &m]() { return store_.note_in_flight(j.key, m.part, m.key_generation); }, lease_lost_,
        "revision"};
    co_await billing::renew_once(k, how, j.epoch, j.log);
}

// The move's Stripe call under its key and generation, its answer read the way the ledger needs it.
net::awaitable<corrections::move_answer> corrections::call_move(job& j, const correction_move& m) {
    move_answer a;
    auto move_key = correction_move_key(j.base, j.ev.revision, m.part);
    auto idem = stripe_idempotency_key(move_key, m.key_generation);
    j.log.debug(
        "calling Stripe for a correction",
        {{"kind", m.kind}, {"part", m.part}, {"amount", m.amount_cents}, {"generation", m.key_generation}});
    if (m.is_refund()) {
        stripe::refund_request req{*m.refund_of, m.amount_cents, move_metadata(j.ev, j.base, move_key), idem,
                                   j.ev.stripe_account};
        auto out = co_await stripe::create_refund(stripe_, std::move(req));
        a.message = out.message;
        std::string status;
        if (out.refund) {
            a.object_id = out.refund->id;
            status = out.refund->status;
        }
        a.plan = machine::on_refund_answer(out.cls, status);
    } else {
        billing_event charge_ev = j.ev;
        charge_ev.amount_cents = m.amount_cents;
        auto req = build_request(charge_ev, move_key, m.key_generation);
        stripe::charge_outcome out;
        if (auto* intent = std::get_if<stripe::payment_intent_request>(&req)) {
            intent->metadata = move_metadata(j.ev, j.base, move_key);
            out = co_await stripe_.create_payment_intent(std::move(*intent));
        } else {
            auto& ch = std::get<stripe::charge_request>(req);
            ch.metadata = move_metadata(j.ev, j.base, move_key);
            out = co_await stripe_.create_charge(std::move(ch));
        }
        a.message = out.message;
        a.object_id = out.charge_id;
        a.intent_id = out.payment_intent_id;
        // In flight (a bank debit) or no charge id: not settled, followed up by the search later.
        a.plan = machine::on_move_answer(out);
    }
    co_return a;
}

// What the answer makes of the move (and, when it ends the revision, of the revision), as the money
// machine read it (call_move). nullopt: done, go on.
net::awaitable<std::optional<verdict>> corrections::settle_move(job& j, const correction_move& m,
                                                                move_answer a) {
    const auto& o = a.plan;
    const auto& message = a.message;
    switch (o.command) {
        case machine::move_command::done: {
            // Named first: g++ 12 destroys a conditional's temporary in a co_await's arguments twice (a
            // PaymentIntent's id is a heap string: a double free).
            std::optional<std::string> intent;
            if (!a.intent_id.empty()) intent = a.intent_id;
            auto r = co_await store_.move_done(j.key, m.part, a.object_id, std::move(intent));
            if (!r) co_return postgres_failed(j, r.err(), "correction move done");
            co_return std::nullopt;
        }
        case machine::move_command::declined: {
            auto r = co_await store_.move_ended(j.key, m.part, std::string(o.to), message);
            if (!r) co_return postgres_failed(j, r.err(), "correction move declined");
            auto f = co_await store_.finish(j.key, std::string(o.revision_to), message);
            if (!f) co_return postgres_failed(j, f.err(), "correction declined");
            co_return verdict::finish(o.reason, message);
        }
        case machine::move_command::failed_dead_letter:
            co_return co_await fail_with_letter(j, m, std::string(o.letter), message, o.reason);
        case machine::move_command::release: {
            auto r = co_await store_.release(j.key, m.part, j.epoch, message);
            if (!r) co_return postgres_failed(j, r.err(), "release lease");
            co_return verdict::requeue(o.reason,
                                       o.reason == verdict_reason::requeued_retry_same_key
                                           ? cfg_.retry_same_key_delay
                                           : cfg_.stripe_unavailable_delay,
                                       message);
        }
        case machine::move_command::indeterminate:
            break;
    }
    auto r = co_await store_.move_indeterminate(j.key, m.part, j.epoch, message);
    if (!r) co_return postgres_failed(j, r.err(), "correction indeterminate");
    co_return verdict::requeue(verdict_reason::requeued_indeterminate, cfg_.indeterminate_delay, message);
}

// The search: the move's Stripe object by metadata[billing_key]. A verdict when the search decided the
// move's fate or failed; nullopt when nothing carries the key.
net::awaitable<std::optional<verdict>> corrections::search_move(job& j, const correction_move& m) {
    auto move_key = correction_move_key(j.base, j.ev.revision, m.part);
    if (m.is_refund()) {
        auto found = co_await stripe::find_refund_by_metadata(stripe_, *m.refund_of, "billing_key", move_key,
                                                              j.ev.stripe_account);
        if (!found) co_return co_await search_failed(j, m.part, found.err());
        if (!*found || machine::on_found(machine::table::move, stripe::read(**found, j.ev.stripe_account)) ==
                           machine::found_command::none)
            co_return std::nullopt;
        j.log.info("correction refund found at Stripe", {{"refund", (*found)->id}});
        auto r = co_await store_.move_done(j.key, m.part, (*found)->id, std::nullopt);
        if (!r) co_return postgres_failed(j, r.err(), "correction move done");
        co_return co_await run_moves(j);
    }
    std::optional<std::int64_t> since;
    if (m.first_stripe_attempt_at)
        since = std::chrono::duration_cast<std::chrono::seconds>(
                    (*m.first_stripe_attempt_at - cfg_.search_slack).time_since_epoch())
                    .count();
    auto found = co_await stripe_.find_charge_by_metadata(j.ev.stripe_customer_id, "billing_key", move_key,
                                                          since, 100, j.ev.stripe_account);
    if (!found) co_return co_await search_failed(j, m.part, found.err());
    if (!*found) co_return std::nullopt;
    const auto& ch = **found;
    j.log.info("correction charge found at Stripe", {{"charge", ch.id}, {"status", ch.status}});
    // Read through the money machine: in flight (or a status the pinned API version does not define)
    // waits; failed declines the revision; only a charge that moved the money is the move done.
    const auto found_as = machine::on_found(machine::table::move, stripe::read(ch, j.ev.stripe_account));
    if (found_as != machine::found_command::mark_charged &&
        found_as != machine::found_command::mark_declined) {
        auto r = co_await store_.release(j.key, m.part, j.epoch, "charge " + ch.id + " is " + ch.status);
        if (!r) co_return postgres_failed(j, r.err(), "release lease");
        co_return verdict::requeue(verdict_reason::requeued_indeterminate, cfg_.indeterminate_delay,
                                   "charge " + ch.id + " is " + ch.status);
    }
    if (found_as == machine::found_command::mark_declined) {
        auto r = co_await store_.move_ended(j.key, m.part, "declined", "charge " + ch.id + " failed");
        if (!r) co_return postgres_failed(j, r.err(), "correction move declined");
        auto f = co_await store_.finish(j.key, "declined", "charge " + ch.id + " failed: " + ch.failure_code);
        if (!f) co_return postgres_failed(j, f.err(), "correction declined");
        co_return verdict::finish(verdict_reason::declined, "charge " + ch.id + " failed");
    }
    std::optional<std::string> intent;  // named: see settle_move
    if (!ch.payment_intent.empty()) intent = ch.payment_intent;
    auto r = co_await store_.move_done(j.key, m.part, ch.id, std::move(intent));
    if (!r) co_return postgres_failed(j, r.err(), "correction move done");
    co_return co_await run_moves(j);
}

net::awaitable<std::optional<verdict>> corrections::search_failed(job& j, std::int32_t part, error e) {
    auto r = co_await store_.release(j.key, part, j.epoch, "search failed: " + e.describe());
    if (!r) co_return postgres_failed(j, r.err(), "release lease");
    co_return verdict::requeue(verdict_reason::requeued_stripe_unavailable, cfg_.stripe_unavailable_delay,
                               "correction search: " + e.describe());
}

// Stripe refused the move as sent: the dead letter first (a crash after it leaves the revision pending, and
// its redelivery gets the same answer under the same key and finds the letter stored), then the revision
// failed with the move.
net::awaitable<verdict> corrections::fail_with_letter(job& j, const correction_move& m, std::string reason,
                                                      std::string message, verdict_reason why) {
    auto added = co_await ledger_.add_dead_letter(j.letter(reason));
    if (!added) co_return postgres_failed(j, added.err(), "dead letter");
    auto r = co_await store_.move_ended(j.key, m.part, "failed", message);
    if (!r) co_return postgres_failed(j, r.err(), "correction move failed");
    auto f = co_await store_.finish(j.key, "failed", reason + ": " + message);
    if (!f) co_return postgres_failed(j, f.err(), "correction failed");
    j.log.warn("correction dead-lettered", {{"reason", reason}, {"stripe", message}});
    co_return verdict::finish(why, reason + ": " + message);
}

}  // namespace cg::billing
