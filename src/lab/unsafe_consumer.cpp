#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "lab/keys.hpp"
#include "lab/run_state.hpp"
#include "nsq/connection.hpp"
#include "stripe/refunds.hpp"

namespace cg::lab {

// "Crash after Stripe answered, before FIN": the first `crashes` deliveries of a run park here; the driver
// sees crash_pending, tears the consumer's connections down without a FIN (what a killed process does), and
// only then wakes them, to return into a consumer that can no longer answer nsqd.
net::awaitable<bool> maybe_crash(run_t* v) {
    if (v->crashes_left <= 0) co_return false;
    --v->crashes_left;
    v->crash_pending = true;
    co_await v->park.async_wait();
    co_return true;
}

// The deferred-REQ scenario: the first delivery's requeue lands after Stripe's 24 h window.
net::awaitable<void> after_delivery(run_t* v) {
    if (!v->sc->clock_jump_after_first || v->clock_jumped) co_return;
    v->clock_jumped = true;
    co_await v->L->advance_stripe_clock(stripe_day);
    v->clock_offset += stripe_day;
}

namespace {

// The unsafe consumers' charge under `key`; the key is remembered so the count can ask fake-stripe how many
// POSTs it saw under it.
stripe::charge_request charge_for(run_t* v, const billing::billing_event& ev, std::string key) {
    v->keys.insert(key);
    stripe::charge_request r;
    r.amount = ev.amount_cents;
    r.currency = ev.currency;
    r.customer = ev.stripe_customer_id;
    r.description = ev.description;
    r.metadata = {
        {"billing_key", key}, {"customer_id", ev.customer_id}, {"billing_period", ev.billing_period}};
    r.idempotency_key = std::move(key);
    return r;
}

nsq::disposition after_stripe(const stripe::charge_outcome& out) {
    using oc = stripe::outcome_class;
    if (out.cls == oc::retry_same_key || out.cls == oc::indeterminate)
        return nsq::disposition::requeue(300ms);
    return nsq::disposition::finish();
}

// What the unsafe consumers know about one delivery when they build a key.
key_inputs inputs_for(run_t* v, const nsq::message& m, const billing::billing_event& ev) {
    key_inputs in;
    in.key_namespace = key_namespace;
    in.customer_id = ev.customer_id;
    in.billing_period = ev.billing_period;
    in.attempts = m.attempts();
    in.connection_uuid = v->conn_uuid;
    in.nsqd_address = m.conn() ? m.conn()->key() : std::string();
    in.call_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    in.message_id = std::string(m.id());
    return in;
}

billing::lease_token token_of(const billing::ledger_record& r) {
    return r.lease_epoch;
}

// The ledger without the rest: a pending row and a lease before Stripe, recovery of an expired lease by
// calling Stripe again — but under a naive key (salted with Attempts) and without searching Stripe first.
net::awaitable<nsq::disposition> ledger_naive(run_t* v, nsq::message& m, billing::billing_event ev) {
    auto& led = v->L->ledger();
    auto base = billing::base_key(key_namespace, ev.customer_id, ev.billing_period);
    const milliseconds lease = 2s;
    billing::new_record rec{base, ev, std::string(m.id()), m.attempts()};
    auto pf = co_await led.preflight(rec, lease);
    if (!pf) co_return nsq::disposition::requeue(300ms);
    billing::lease_token tok;
    if (pf->inserted) {
        tok = token_of(pf->record);
    } else {
        if (billing::is_final(pf->record.status)) co_return nsq::disposition::finish();
        auto taken = co_await led.take_expired_lease(base, lease, std::string(m.id()), m.attempts());
        if (!taken || !*taken) co_return nsq::disposition::requeue_without_backoff(500ms);
        tok = token_of(**taken);
    }
    auto att = co_await led.record_attempt(base, tok, lease);
    if (!att || !*att) co_return nsq::disposition::requeue_without_backoff(500ms);
    stripe::charge_outcome out;
    {
        nsq::keepalive alive(m);
        out = co_await v->stripe->create_charge(
            charge_for(v, ev, make_key(v->sc->unsafe_key, inputs_for(v, m, ev))));
    }
    if (co_await maybe_crash(v)) co_return nsq::disposition::finish();
    if (out.cls == stripe::outcome_class::succeeded) {
        co_await led.mark_charged(base, out.charge_id);
        co_return nsq::disposition::finish();
    }
    if (out.cls == stripe::outcome_class::indeterminate) {
        co_await led.mark_indeterminate(base, (*att)->lease, out.message);
        co_return nsq::disposition::requeue(300ms);
    }
    co_return nsq::disposition::finish();
}

// A correction without the ledger: the customer's charge found at Stripe, the difference refunded under a key
// salted like the scenario's charges (NSQ Attempts) — so a redelivery refunds again.
net::awaitable<nsq::disposition> unsafe_correction(run_t* v, nsq::message& m, billing::billing_event ev) {
    stripe::list_charges_request req;
    req.customer = ev.stripe_customer_id;
    req.limit = 10;
    auto page = co_await v->stripe->list_charges(req);
    if (!page) co_return nsq::disposition::requeue(300ms);
    const stripe::charge* original = nullptr;
    for (const auto& c : page->data)
        if (c.status == "succeeded") {
            original = &c;
            break;
        }
    if (!original) co_return nsq::disposition::requeue(300ms);  // not charged yet
    auto key = make_key(v->sc->unsafe_key, inputs_for(v, m, ev)) + "-refund";
    v->keys.insert(key);
    stripe::refund_request r{
        original->id,
        original->amount - ev.amount_cents,
        {{"billing_key", key}, {"customer_id", ev.customer_id}, {"billing_period", ev.billing_period}},
        key,
        ev.stripe_account};
    auto out = co_await stripe::create_refund(*v->stripe, std::move(r));
    if (co_await maybe_crash(v)) co_return nsq::disposition::finish();
    using oc = stripe::outcome_class;
    if (out.cls == oc::retry_same_key || out.cls == oc::indeterminate)
        co_return nsq::disposition::requeue(300ms);
    co_return nsq::disposition::finish();
}

}  // namespace

// In a correction scenario only the corrections crash: the charge before them goes through untouched.
bool crash_applies(const run_t* v, std::string_view body) {
    if (!v->sc->correction) return true;
    auto ev = billing::parse_event(body);
    return ev && ev->is_correction();
}

// The unsafe consumer: the real NSQ consumer and Stripe client, no ledger, and one of the bad keys.
net::awaitable<nsq::disposition> unsafe_handle(run_t* v, nsq::message& m) {
    running_guard g(v);
    auto ev = billing::parse_event(m.body());
    if (!ev) co_return nsq::disposition::finish();
    if (v->sc->call == unsafe_call::ledger_naive_key) co_return co_await ledger_naive(v, m, std::move(*ev));
    if (ev->is_correction()) co_return co_await unsafe_correction(v, m, std::move(*ev));
    std::optional<nsq::keepalive> alive;
    if (v->sc->call == unsafe_call::offloaded_touch) alive.emplace(m);
    auto key = make_key(v->sc->unsafe_key, inputs_for(v, m, *ev));
    stripe::charge_outcome out;
    if (v->sc->call == unsafe_call::blocking) {
        // pynsq's IOLoop failure: the handler waits for Stripe on the loop's own thread, so nothing else on
        // the main loop runs — no heartbeat answer, no FIN of the messages already done, no reads.
        auto f =
            asio::co_spawn(v->L->offload().get_executor(),
                           v->stripe->create_charge(charge_for(v, *ev, std::move(key))), asio::use_future);
        out = f.get();
    } else {
        out = co_await v->stripe->create_charge(charge_for(v, *ev, std::move(key)));
    }
    alive.reset();
    if (crash_applies(v, m.body()) && co_await maybe_crash(v)) co_return nsq::disposition::finish();
    co_await after_delivery(v);
    co_return after_stripe(out);
}

// go-nsq's default past max_attempts: log and FIN.
net::awaitable<nsq::disposition> unsafe_give_up(nsq::message&) {
    co_return nsq::disposition::finish();
}

}  // namespace cg::lab
