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

namespace in = machine::in;
using machine::rop;

machine::revision_input done(const result<void>& r) {
    if (!r) return in::failed{r.err()};
    return in::applied{};
}

machine::move_view view(const correction_move& m, const std::string& base, std::int32_t revision) {
    machine::move_view v;
    v.part = m.part;
    v.refund = m.is_refund();
    v.amount_cents = m.amount_cents;
    v.refund_of = m.refund_of.value_or("");
    v.key_generation = m.key_generation;
    v.status = m.status;
    v.stripe_object_id = m.stripe_object_id.value_or("");
    v.first_stripe_attempt_at = m.first_stripe_attempt_at;
    v.indeterminate_since = m.indeterminate_since;
    v.key = correction_move_key(base, revision, m.part);
    return v;
}

}  // namespace

corrections::corrections(const charge_flow_config& cfg, billing::ledger& ledger, stripe::client& stripe)
    : cfg_(cfg), fsm_cfg_(fsm_config(cfg)), ledger_(ledger), store_(ledger.pool()), stripe_(stripe) {}

net::awaitable<verdict> corrections::handle(const delivery& d, std::function<void()> touch, billing_event ev,
                                            std::string base, logger log) {
    job j{d, std::move(touch), std::move(ev), std::move(base), {}, std::move(log)};
    j.key = correction_key(j.base, j.ev.revision);
    j.log = j.log.with({{"correction_key", j.key}, {"revision", j.ev.revision}});
    machine::revision_fsm fsm(fsm_cfg_);
    const double unit = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
    // Named first: g++ 12 destroys a temporary argument of a co_awaited call twice.
    const machine::revision_input first = in::revision{j.ev, j.base, j.key, d.attempts, unit};
    auto cmd = fsm.resume(first);
    for (;;) {
        if (!cmd.note.empty()) {
            if (cmd.warn)
                j.log.warn(cmd.note);
            else
                j.log.info(cmd.note);
        }
        if (cmd.what == rop::done) break;
        auto next = co_await execute(j, fsm, cmd);
        cmd = fsm.resume(next);
    }
    co_return std::move(cmd.result);
}

// One command of the revision fsm against the corrections ledger (correction_ledger.hpp) or Stripe.
net::awaitable<machine::revision_input> corrections::execute(job& j, machine::revision_fsm& fsm,
                                                             const machine::revision_command& c) {
    switch (c.what) {
        case rop::admit: {
            auto a = co_await store_.admit(j.key, j.base, j.ev.revision, j.ev.amount_cents, j.ev.currency,
                                           j.d.body, j.d.message_id, cfg_.lease);
            if (!a) co_return in::failed{a.err()};
            if (a->action == "run")
                j.log.debug("correction leased",
                            {{"delta_cents", a->delta.value_or(0)}, {"step", a->detail}});
            co_return in::admitted{a->action, a->detail, a->epoch, a->lease_remaining, a->delta.value_or(0)};
        }
        case rop::moves: {
            auto ms = co_await store_.moves(j.key);
            if (!ms) co_return in::failed{ms.err()};
            in::moves out;
            out.now = cfg_.now();
            for (const auto& m : *ms) out.list.push_back(view(m, j.base, j.ev.revision));
            co_return out;
        }
        case rop::record_attempt: {
            auto att = co_await store_.record_attempt(j.key, c.part, c.epoch, cfg_.lease);
            if (!att) co_return in::failed{att.err()};
            co_return in::leased{*att};
        }
        case rop::move_done: {
            std::optional<std::string> intent = c.intent_id;  // named: see handle
            auto r = co_await store_.move_done(j.key, c.part, c.object_id, std::move(intent));
            co_return done(r);
        }
        case rop::move_ended: {
            auto r = co_await store_.move_ended(j.key, c.part, c.status, c.text);
            co_return done(r);
        }
        case rop::move_indeterminate: {
            auto r = co_await store_.move_indeterminate(j.key, c.part, c.epoch, c.text);
            co_return done(r);
        }
        case rop::release: {
            auto r = co_await store_.release(j.key, c.part, c.epoch, c.text);
            co_return done(r);
        }
        case rop::bump_generation: {
            auto b =
                co_await store_.bump_generation(j.key, c.part, c.epoch, c.generation, cfg_.new_key_quiet);
            if (!b) co_return in::failed{b.err()};
            in::bumped out;
            if (*b) out.generation = c.generation + 1;
            co_return out;
        }
        case rop::finish: {
            auto r = co_await store_.finish(j.key, c.status, c.text);
            co_return done(r);
        }
        case rop::dead_letter: {
            auto added = co_await ledger_.add_dead_letter(j.letter(c.text));
            if (!added) co_return in::failed{added.err()};
            co_return in::applied{*added};
        }
        case rop::create_charge:
        case rop::create_refund:
            co_return co_await call(j, fsm, c);
        case rop::search_charge: {
            auto found = co_await stripe_.find_charge_by_metadata(
                j.ev.stripe_customer_id, "billing_key", c.move_key, c.since, 100, j.ev.stripe_account);
            if (!found) co_return in::failed{found.err()};
            co_return in::charge_found{std::move(*found)};
        }
        case rop::search_refund: {
            auto found = co_await stripe::find_refund_by_metadata(stripe_, c.refund_of, "billing_key",
                                                                  c.move_key, j.ev.stripe_account);
            if (!found) co_return in::failed{found.err()};
            co_return in::refund_found{std::move(*found)};
        }
        case rop::done:
            break;
    }
    throw std::logic_error("corrections: no command to execute");
}

// The move's Stripe call with the revision's lease kept alive beside it, as a charge's is: a redelivery, or a
// sweeper, that comes while Stripe is slow finds the lease held instead of sending the same move again.
net::awaitable<machine::revision_input> corrections::call(job& j, machine::revision_fsm& fsm,
                                                          const machine::revision_command& c) {
    auto ex = co_await asio::this_coro::executor;
    auto keeper = std::make_shared<lease_keeper>(
        ex, cfg_.lease_renew_interval, [this, &j, &fsm] { return renew_once(j, fsm); }, j.log);
    j.log.debug("calling Stripe for a correction",
                {{"part", c.part}, {"amount", c.amount_cents}, {"generation", c.generation}});
    keeper->start();
    machine::revision_input out = in::answer{};
    std::exception_ptr failed;
    try {
        if (c.what == rop::create_refund) {
            stripe::refund_request req{c.refund_of, c.amount_cents, c.metadata, c.idempotency_key,
                                       j.ev.stripe_account};
            auto r = co_await stripe::create_refund(stripe_, std::move(req));
            out = in::refund_answer{r.cls, r.message, std::move(r.refund)};
        } else {
            auto req = c.request;
            auto* intent = std::get_if<stripe::payment_intent_request>(&req);
            auto call = intent ? stripe_.create_payment_intent(std::move(*intent))
                               : stripe_.create_charge(std::move(std::get<stripe::charge_request>(req)));
            auto answer = co_await std::move(call);
            out = in::answer{std::move(answer)};
        }
    } catch (...) {
        failed = std::current_exception();
    }
    co_await keeper->stop();
    if (failed) std::rethrow_exception(failed);
    co_return out;
}

// One renewal while a move's call is awaited: the message touched, the revision's lease extended — or, once
// it was taken over, the call noted in flight, so whoever holds the revision now takes no new key generation
// while this call can still move money. The fsm says which and takes the result.
net::awaitable<void> corrections::renew_once(job& j, machine::revision_fsm& fsm) {
    const auto part = fsm.current().part;
    lease_renewal how{
        j.touch,
        [this, &j, part](std::int64_t epoch) { return store_.renew_lease(j.key, part, epoch, cfg_.lease); },
        [this, &j, part](std::int32_t generation) { return store_.note_in_flight(j.key, part, generation); },
        lease_lost_, "revision"};
    if (auto renewed = co_await billing::renew_once(how, fsm.renewal(), j.log)) fsm.renewed(*renewed);
}

}  // namespace cg::billing
