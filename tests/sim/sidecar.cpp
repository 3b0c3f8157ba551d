// The sidecars: one delivery's steps, as billing/flow/charge_flow.cpp and recovery.cpp take them
// (docs/design.md §4), with the project's pure rules deciding: decide_existing, recovery_mode, the money
// machine (machine.hpp), stripe::read.
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <variant>

#include "billing/machine/decision.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "billing/machine/outcome.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"
#include "world.hpp"

namespace cg::sim::detail {

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
    at(now_ + rnd_.range(sec, 60 * sec), [this, sc] { sidecars_[sc].up = true; });
}

void world::start(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    message& m = messages_[d.msg];
    if (!m.parsed) {
        auto ev = billing::parse_event(m.body);
        if (!ev) {
            violation("a valid event did not parse: " + ev.err().describe());
            return fin(d);
        }
        m.parsed = std::move(*ev);
    }
    d.ev = *m.parsed;
    d.key = billing::base_key("sim", d.ev.customer_id, d.ev.billing_period, d.ev.stripe_account);
    if (!has(safeguard::write_before_call) && !find_row(d.key)) {
        d.row_written = false;  // Stripe first, the row after
        d.gen = 1;
        return call(id);
    }
    at(now_ + pg(), [this, id] { preflight(id); });
}

void world::preflight(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    if (insert(d)) {
        d.epoch = 1;
        d.gen = 1;
        note("insert " + d.key);
        return call(id);
    }
    decide(id, *find_row(d.key));
}

void world::decide(int id, const row& r) {
    delivery& d = deliveries_[id];
    const auto window = has(safeguard::same_key_window) ? std::chrono::seconds(billing::same_key_window)
                                                        : std::chrono::seconds(std::chrono::hours(24 * 365));
    auto act = billing::decide_existing(r.view(now_), d.ev, at_ms(now_), window);
    note("decide " + d.key + " " + std::string(billing::to_string(act)));
    switch (act) {
        case billing::existing_action::duplicate_finish:
            return fin(d);
        case billing::existing_action::payload_conflict:
            violation("payload conflict for an unchanged event");
            return fin(d);
        case billing::existing_action::lease_held_requeue: {
            auto v = r.view(now_);
            auto delay =
                billing::lease_held_requeue_delay(v.lease_remaining, std::chrono::milliseconds(p_.lease),
                                                  std::chrono::milliseconds(p_.lease_held_floor),
                                                  std::chrono::milliseconds(p_.max_requeue), rnd_.unit());
            return req(d, delay.count());
        }
        case billing::existing_action::recover_same_key:
        case billing::existing_action::recover_search:
            at(now_ + pg(), [this, id] { take_step(id); });
            return;
    }
}

void world::take_step(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    auto e = take(d.key);
    if (!e) return req(d, p_.retry_same_key_delay);  // requeued_lease_lost
    d.epoch = *e;
    const row& r = *find_row(d.key);
    d.gen = r.rec.key_generation;
    const auto window = has(safeguard::same_key_window) ? std::chrono::seconds(billing::same_key_window)
                                                        : std::chrono::seconds(std::chrono::hours(24 * 365));
    auto mode = billing::recovery_mode(r.view(now_), at_ms(now_), window);
    note("take " + d.key + " " + std::string(billing::to_string(mode)));
    if (mode == billing::existing_action::recover_same_key) {
        at(now_ + pg(), [this, id] { attempt_then_call(id); });
    } else if (has(safeguard::search_before_new_key)) {
        at(now_ + rnd_.range(50, 800), [this, id] { search(id); });
    } else {
        at(now_ + pg(), [this, id] { bump(id); });
    }
}

void world::attempt_then_call(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    auto a = attempt(d.key, d.epoch);
    if (!a) return req(d, p_.retry_same_key_delay);
    d.epoch = a->epoch;
    d.gen = a->gen;
    call(id);
}

void world::call(int id) {
    delivery& d = deliveries_[id];
    d.calling = true;
    int c = ++d.call;
    note("call " + billing::stripe_idempotency_key(d.key, d.gen));
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
    // The request the event becomes (billing::build_request): a charge, or a confirmed PaymentIntent.
    auto made = billing::build_request(d.ev, d.key, d.gen);
    q.intent = std::holds_alternative<stripe::payment_intent_request>(made);
    q.idempotency_key = std::visit([](const auto& r) { return r.idempotency_key; }, made);
    q.billing_key = d.key;
    q.amount = d.ev.amount_cents;
    q.event = messages_[d.msg].event;
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
    // Stripe runs it at once, or (a stall) later, maybe after our client gave up on it.
    ms_t exec =
        now_ + (fault(0.03) ? rnd_.range(p_.client_timeout / 2, p_.max_late_execution) : rnd_.range(5, 300));
    at(exec, [this, rq] { stripe_execute(rq); });
    ms_t back = exec + rnd_.range(5, 200);
    if (back - now_ > p_.client_timeout)
        at(now_ + p_.client_timeout, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, true); });
    else
        at(back, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
}

void world::answered(int id, int c, int attempt, int rq, bool timed_out) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    if (!alive(id)) return;
    const request& q = requests_[rq];
    stripe::charge_outcome out;
    out.attempts = static_cast<unsigned>(attempt);
    int charge = -1;
    if (timed_out) {
        out.cls = stripe::classify_transport_failure(true);
    } else if (q.http == 0) {
        out.cls = stripe::classify_transport_failure(false);
    } else {
        stripe::response_facts rf;
        rf.status = q.http;
        if (q.http == 402) rf.error_type = "card_error";
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
    std::string intent;
    if (!timed_out && q.intent && q.intent_idx >= 0 && (q.http == 200 || q.http == 402)) {
        // The intent in the body Stripe saved, read as stripe/client.cpp's read_intent reads it.
        const stripe_intent& pi = intents_[q.intent_idx];
        stripe::payment_intent p;
        p.id = pi.id;
        p.status = pi.created_status;
        if (pi.charge >= 0) p.latest_charge = charges_[pi.charge].id;
        intent = pi.id;
        charge = pi.charge;
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
    } else if (!timed_out && !q.intent && (q.http == 200 || q.http == 402)) {
        // The create's 2xx body or its 402 (which names the failed charge), read as stripe/client.cpp reads
        // it: through the fact. The body is the one Stripe saved: the charge as it was when created.
        charge = q.charge;
        const stripe_charge& ch = charges_[charge];
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
    } else {
        charge = -1;
    }
    note("answer " + std::string(stripe::to_string(out.cls)) +
         (out.in_flight_status.empty() ? "" : " in flight"));
    d.calling = false;
    finish_call(id, out, charge, intent);
}

void world::finish_call(int id, const stripe::charge_outcome& out, int charge, const std::string& intent) {
    delivery& d = deliveries_[id];
    if (!d.row_written) {
        // write_before_call removed: the row is written only now, its first attempt now.
        if (!insert(d)) return req(d, p_.retry_same_key_delay);
        d.row_written = true;
        d.epoch = 1;
    }
    // The money machine's reading of the answer, as charge_flow.cpp settle takes it.
    auto step = billing::machine::on_answer(out).command;
    std::string ch = charge >= 0 ? charges_[charge].id : std::string();
    at(now_ + pg(), [this, id, step, ch, intent] {
        if (!alive(id)) return;
        delivery& d = deliveries_[id];
        switch (step) {
            case billing::charge_step::mark_charged:
                settle(d.key, record_status::charged, ch, intent);
                return fin(d);
            case billing::charge_step::mark_processing:
                settle(d.key, record_status::processing, ch, intent);
                return fin(d);
            case billing::charge_step::mark_declined:
                settle(d.key, record_status::declined, ch, intent);
                return fin(d);
            case billing::charge_step::release_requeue:
                release(d.key, d.epoch);
                return req(d, p_.retry_same_key_delay);
            case billing::charge_step::mark_indeterminate_requeue:
                indeterminate(d.key, d.epoch);
                return req(d, p_.indeterminate_delay);
            default:
                violation("an answer the simulated Stripe never gives: " +
                          std::string(billing::to_string(step)));
                return fin(d);
        }
    });
}

// While a call is awaited: TOUCH the message and renew the lease; a worker whose lease was taken over keeps
// noting its call in flight.
void world::renew_tick(int id, int c) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    const sidecar& s = sidecars_[d.sidecar];
    if (!s.up || s.incarnation != d.incarnation) return;
    touch(d);
    if (fault(0.02)) {
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
        if (auto e = renew(d.key, d.epoch))
            d.epoch = *e;
        else
            in_flight_note(d.key, d.gen);
    }
    at(now_ + p_.renew, [this, id, c] { renew_tick(id, c); });
}

}  // namespace cg::sim::detail
