// The sidecars: each delivery is the charge fsm that ships (billing/machine/charge_fsm.hpp, the one
// billing::charge_flow drives), and this file runs its commands against the models as charge_flow_steps.cpp
// runs them against PostgreSQL and Stripe: the ledger's statements (ledger_model.cpp), the create call
// through a client that retries and times out (stripe_model.cpp), FIN and REQ (nsqd_model.cpp). A removed
// safeguard is a model that misbehaves the way the code without it did (docs/testing.md), never a change to
// the fsm.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/outcome.hpp"
#include "stripe/fact.hpp"
#include "stripe/json.hpp"
#include "stripe/outcome.hpp"
#include "world.hpp"

namespace cg::sim::detail {

namespace in = billing::machine::in;
using billing::machine::op;

billing::machine::flow_config world::fsm_config() const {
    billing::machine::flow_config f;
    f.key_namespace = "sim";
    f.lease = std::chrono::milliseconds(p_.lease);
    f.lease_held_delay = std::chrono::milliseconds(p_.lease_held_floor);
    f.max_requeue_delay = std::chrono::milliseconds(p_.max_requeue);
    f.retry_same_key_delay = std::chrono::milliseconds(p_.retry_same_key_delay);
    f.indeterminate_delay = std::chrono::milliseconds(p_.indeterminate_delay);
    f.stripe_unavailable_delay = std::chrono::milliseconds(p_.indeterminate_delay);
    f.new_key_quiet = std::chrono::milliseconds(has(safeguard::quiet_period) ? p_.quiet : 0);
    // Without the window the same key is re-sent however old it is.
    if (!has(safeguard::same_key_window)) f.same_key_window = std::chrono::hours(24 * 365);
    return f;
}

bool world::alive(int id) {
    const delivery& d = deliveries_[id];
    const sidecar& s = sidecars_[d.sidecar];
    if (!s.up || s.incarnation != d.incarnation) return false;
    if (fault(0.008)) {  // the process dies between two steps
        crash(d.sidecar);
        return false;
    }
    return true;
}

void world::crash(int sc) {
    note("crash s" + std::to_string(sc));
    sidecars_[sc].up = false;
    ++sidecars_[sc].incarnation;
    // Back within a minute, or once the fleet is up again (a restart due during a fleet outage waits).
    at(std::max(now_ + rnd_.range(sec, 60 * sec), fleet_down_until_), [this, sc] {
        if (now_ >= fleet_down_until_) sidecars_[sc].up = true;
    });
}

void world::start(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    const message& m = messages_[d.msg];
    d.fsm.emplace(fsm_cfg_);
    auto c = d.fsm->resume(in::delivery{m.body, {}, m.attempts, at_ms(now_), rnd_.unit()});
    if (d.fsm->event_known()) {
        d.ev = d.fsm->event();
        d.key = d.fsm->key();
    }
    exec(id, std::move(c));
}

void world::resume(int id, const billing::machine::fsm_input& i) {
    exec(id, deliveries_[id].fsm->resume(i));
}

// One command: a ledger statement a few milliseconds later (the process may die before it), the create call,
// or the verdict.
void world::exec(int id, billing::machine::command c) {
    delivery& d = deliveries_[id];
    switch (c.what) {
        case op::done:
            note("verdict " + d.key + " " + std::string(billing::to_string(c.result.reason)));
            d.fsm.reset();
            if (c.result.finished()) return fin(d);
            return req(d, c.result.delay.count());
        case op::create:
            d.request = std::move(c.request);
            return call(id);
        case op::search_charges:
        case op::search_intents:
            d.pending = std::move(c);
            at(now_ + rnd_.range(50, 800), [this, id] {
                if (!alive(id)) return;
                const auto& c = deliveries_[id].pending;
                resume(id, c.what == op::search_charges ? search_charges(id, c.search)
                                                        : search_intents(id, c.search));
            });
            return;
        case op::pause:
            return resume(id, in::resumed{});
        case op::apply_recorded:  // the ledger model applies them as the row leaves pending
            return resume(id, in::applied{false});
        case op::dead_letter:
        case op::correction:
            violation("a valid charge event came to " + std::string(billing::machine::to_string(c.what)) +
                      ": " + c.text);
            d.fsm.reset();
            return fin(d);
        default:
            // Kept in the delivery, not in the scheduled action: a small action is not allocated.
            d.pending = std::move(c);
            at(now_ + pg(), [this, id] {
                if (!alive(id)) return;
                ledger_step(id, deliveries_[id].pending);
            });
            return;
    }
}

// The ledger's statements (ledger_sql.hpp), as ledger_model.cpp holds their semantics.
void world::ledger_step(int id, const billing::machine::command& c) {
    delivery& d = deliveries_[id];
    auto& f = *d.fsm;
    switch (c.what) {
        case op::preflight: {
            if (!has(safeguard::write_before_call) && !find_row(d.key)) {
                // Without the safeguard: Stripe first, the row after (finish_call writes it).
                d.row_written = false;
                billing::ledger_record rec;
                rec.key = d.key;
                rec.lease_epoch = 1;
                return resume(id, in::preflighted{true, rec, at_ms(now_)});
            }
            const bool inserted = insert(d);
            if (inserted) note("insert " + d.key);
            return resume(id, in::preflighted{inserted, find_row(d.key)->view(now_), at_ms(now_)});
        }
        case op::find: {
            const row* r = find_row(d.key);
            return resume(id, in::row{r ? std::optional(r->view(now_)) : std::nullopt, at_ms(now_)});
        }
        case op::take_lease: {
            auto e = take(d.key);
            note("take " + d.key + (e ? " ok" : " lost"));
            if (!e) return resume(id, in::row{std::nullopt, at_ms(now_)});
            return resume(id, in::row{find_row(d.key)->view(now_), at_ms(now_)});
        }
        case op::record_attempt: {
            auto a = attempt(d.key, f.held_lease());
            if (!a) return resume(id, in::attempted{});
            return resume(id, in::attempted{a->gen, a->epoch});
        }
        case op::superseded_payments:
            return resume(id, in::superseded{{retried_payments_.begin(), retried_payments_.end()}});
        case op::bump_generation:
            return resume(id, bump(id, c));
        case op::settle:
            return settle_step(id, c);
        default:
            violation("not a ledger statement: " + std::string(billing::machine::to_string(c.what)));
    }
}

void world::settle_step(int id, const billing::machine::command& c) {
    delivery& d = deliveries_[id];
    const auto lease = d.fsm->held_lease();
    const std::string ch = c.charge_id.value_or(""), pi = c.payment_intent_id.value_or("");
    bool changed = true;
    switch (c.step) {
        case billing::charge_step::mark_charged:
            changed = settle(d.key, record_status::charged, ch, pi);
            break;
        case billing::charge_step::mark_declined:
            changed = settle(d.key, record_status::declined, ch, pi);
            break;
        case billing::charge_step::mark_processing:
            changed = settle(d.key, record_status::processing, ch, pi);
            break;
        case billing::charge_step::mark_cap_blocked:  // with its dead letter, in the same statement
            changed = settle(d.key, record_status::cap_blocked, ch, pi);
            break;
        case billing::charge_step::release_requeue:
        case billing::charge_step::setup_requeue:
            release(d.key, lease);
            break;
        case billing::charge_step::mark_indeterminate_requeue:
            indeterminate(d.key, lease);
            break;
        default:
            violation("an answer the simulated Stripe never gives: " +
                      std::string(billing::to_string(c.step)));
            break;
    }
    note("settle " + d.key + " " + std::string(billing::to_string(c.step)) + (changed ? "" : " (no change)"));
    resume(id, in::applied{changed});
}

void world::call(int id) {
    delivery& d = deliveries_[id];
    d.calling = true;
    int c = ++d.call;
    note("call " + std::visit([](const auto& r) { return r.idempotency_key; }, d.request));
    at(now_ + p_.renew, [this, id, c] { renew_tick(id, c); });
    send(id, c, 1);
}

// One request attempt of the client: it reaches Stripe (or not), Stripe runs it (maybe long after we gave up)
// and answers; the client waits client_timeout at most.
void world::send(int id, int c, int attempt) {
    delivery& d = deliveries_[id];
    request q;
    q.delivery = id;
    q.call = c;
    q.attempt = attempt;
    // The request the fsm built (billing::build_request): a charge, or a confirmed PaymentIntent.
    q.intent = std::holds_alternative<stripe::payment_intent_request>(d.request);
    q.idempotency_key = std::visit([](const auto& r) { return r.idempotency_key; }, d.request);
    q.billing_key = d.key;
    q.amount = d.ev.amount_cents;
    q.event = d.swept ? event_of(d.key) : messages_[d.msg].event;
    requests_.push_back(q);
    int rq = static_cast<int>(requests_.size()) - 1;
    // In a 429 storm the client's rate control holds each request back for a slot (minutes, under pressure).
    ms_t wait = now_ < storm_until_ ? rnd_.range(0, 4 * minute) : 0;
    at(now_ + wait, [this, id, c, attempt, rq] { transmit(id, c, attempt, rq); });
}

void world::transmit(int id, int c, int attempt, int rq) {
    const delivery& d = deliveries_[id];
    const sidecar& sc = sidecars_[d.sidecar];
    if (!sc.up || sc.incarnation != d.incarnation) return;  // the process died while the request waited
    if (fault(0.01)) {                                      // the connection failed before a byte was sent
        at(now_ + rnd_.range(1, 100), [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
        return;
    }
    // The vault proxy reserves it against its period's cap (vault_model.cpp); a refusal is the proxy's
    // answer.
    if (!vault_forward(rq)) {
        at(now_ + 20, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
        return;
    }
    // Stripe runs it at once, or (a stall) later, maybe after our client gave up on it.
    ms_t exec =
        now_ + (fault(0.03) ? rnd_.range(p_.client_timeout / 2, p_.max_late_execution) : rnd_.range(5, 300));
    at(exec, [this, rq] { stripe_execute(rq); });
    ms_t back = exec + rnd_.range(5, 200);
    if (back - now_ > p_.client_timeout)
        at(now_ + p_.client_timeout, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, true); });
    else
        at(back, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
    // The proxy settles the reservation by the answer, or once it gave up waiting (its timeout the client's).
    const bool proxy_gave_up = back - now_ > p_.client_timeout;
    at(std::min(back, now_ + p_.client_timeout),
       [this, rq, proxy_gave_up] { vault_account(rq, proxy_gave_up); });
}

void world::answered(int id, int c, int attempt, int rq, bool timed_out) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    if (!alive(id)) return;
    const request& q = requests_[rq];
    stripe::charge_outcome out;
    out.attempts = static_cast<unsigned>(attempt);
    if (timed_out) {
        out.cls = stripe::classify_transport_failure(true);
    } else if (q.http == 0) {
        out.cls = stripe::classify_transport_failure(false);
    } else {
        stripe::response_facts rf;
        rf.status = q.http;
        // The vault's refusal, its body read as stripe/client_call.cpp reads any error body.
        const auto refusal = q.refusal.empty() ? std::nullopt : stripe::parse_error(q.refusal);
        if (refusal) {
            rf.error_type = refusal->type;
            rf.error_code = refusal->code;
            rf.error_param = refusal->param;
        }
        if (q.http == 402 && !refusal) rf.error_type = "card_error";
        if (q.http == 500) rf.error_type = "api_error";
        if (q.http == 429) rf.error_type = "rate_limit_error";
        out.cls = stripe::classify_response(rf);
        out.http_status = q.http;
    }
    if (out.cls == stripe::outcome_class::retry_same_key && attempt < p_.client_tries) {
        ms_t backoff = std::min<ms_t>(sec << (attempt - 1), 60 * sec);
        at(now_ + backoff, [this, id, c, attempt] { send(id, c, attempt + 1); });
        return;
    }
    const bool stripe_answered = !timed_out && q.refusal.empty();
    if (stripe_answered && q.intent && q.intent_idx >= 0 && (q.http == 200 || q.http == 402)) {
        // The intent in the body Stripe saved, read as stripe/client.cpp's read_intent reads it.
        const stripe_intent& pi = intents_[q.intent_idx];
        stripe::payment_intent p;
        p.id = pi.id;
        p.status = pi.created_status;
        if (pi.charge >= 0) p.latest_charge = charges_[pi.charge].id;
        out.payment_intent_id = pi.id;
        out.charge_id = p.latest_charge;
        switch (stripe::read(p).moved) {
            case stripe::movement::charged:
                break;
            case stripe::movement::in_flight:
            case stripe::movement::authorised:
                if (has(safeguard::in_flight_not_charged)) out.in_flight_status = p.status;
                break;
            case stripe::movement::failed:
            case stripe::movement::needs_customer:
            case stripe::movement::canceled:
                out.cls = stripe::outcome_class::declined;
                break;
            default:
                out.cls = stripe::outcome_class::indeterminate;
                break;
        }
    } else if (stripe_answered && !q.intent && (q.http == 200 || q.http == 402)) {
        // The create's 2xx body or its 402 (which names the failed charge), read as stripe/client.cpp reads
        // it: through the fact. The body is the one Stripe saved: the charge as it was when created.
        const stripe_charge& ch = charges_[q.charge];
        stripe::charge sc;
        sc.id = ch.id;
        sc.payment_method_type = ch.payment_method_type;
        sc.status = q.http == 402                                ? "failed"
                    : stripe::bank_debit(ch.payment_method_type) ? "pending"
                                                                 : "succeeded";
        out.charge_id = ch.id;
        auto f = stripe::read(sc);
        if (f.moved == stripe::movement::in_flight && has(safeguard::in_flight_not_charged))
            out.in_flight_status = sc.status;
    }
    note("answer " + std::string(stripe::to_string(out.cls)) +
         (out.in_flight_status.empty() ? "" : " in flight"));
    d.calling = false;
    finish_call(id, out);
}

void world::finish_call(int id, const stripe::charge_outcome& out) {
    delivery& d = deliveries_[id];
    if (!d.row_written) {
        // write_before_call removed: the row is written only now, its first attempt now.
        if (!insert(d)) {
            d.fsm.reset();
            return req(d, p_.retry_same_key_delay);
        }
        d.row_written = true;
        d.fsm->renewed(in::renewed{1});  // the lease the row was written with
    }
    resume(id, in::answer{out});
}

// While a call is awaited: TOUCH the message and renew the lease; a worker whose lease was taken over keeps
// noting its call in flight.
void world::renew_tick(int id, int c) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    const sidecar& s = sidecars_[d.sidecar];
    if (!s.up || s.incarnation != d.incarnation) return;
    touch(d);
    if (!d.swept && fault(0.02)) {
        // The connection to nsqd dropped: nsqd puts the message back at once; this worker carries on (its
        // FIN will be refused), and another sidecar gets the message.
        message& m = messages_[d.msg];
        if (m.inflight && m.token == d.token) {
            m.inflight = false;
            int msg = d.msg;
            at(now_ + rnd_.range(1, 500), [this, msg] { deliver(msg); });
        }
    }
    if (has(safeguard::lease_renewal) && d.row_written) {
        // What the fsm asks for (billing::renew_once), its result handed back; the model notes the call in
        // flight as soon as a renewal finds the lease taken over.
        const auto what = d.fsm->renewal();
        std::optional<std::int64_t> e;
        if (!what.note_in_flight) {
            e = renew(d.key, what.epoch);
            d.fsm->renewed(in::renewed{e});
        }
        if (!e) in_flight_note(d.key, what.generation);
    }
    at(now_ + p_.renew, [this, id, c] { renew_tick(id, c); });
}

}  // namespace cg::sim::detail
