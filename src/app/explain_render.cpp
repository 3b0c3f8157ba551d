#include "app/explain_render.hpp"

#include <cstdio>

#include "core/log.hpp"

namespace cg::app::explain_impl {

const char* or_dash(const std::optional<std::string>& v) {
    return v ? v->c_str() : "-";
}

// Each revision with its total and state, then its money moves with their Stripe objects.
void print_corrections_text(const explanation& x) {
    if (!x.corrections) {
        std::printf("corrections:  no corrections tables\n");
        return;
    }
    if (x.corrections->empty()) {
        std::printf("corrections:  none\n");
        return;
    }
    std::printf("corrections:  %zu revision(s); net moved for the period: %s cents\n", x.corrections->size(),
                or_dash(x.net_cents));
    for (const auto& r : *x.corrections) {
        std::printf("revision %s (%s): total %s %s, difference %s, %s%s%s\n", r.revision.c_str(),
                    r.key.c_str(), r.total_cents.c_str(), r.currency.c_str(), or_dash(r.delta_cents),
                    r.status.c_str(), r.note ? ": " : "", r.note ? r.note->c_str() : "");
        for (const auto& m : r.moves) {
            std::string what = m.kind == "refund" ? "refund of " + m.refund_of.value_or("?") : "charge";
            std::printf("  move %s: %s %s cents, %s, stripe %s%s%s (generation %s)%s%s\n", m.part.c_str(),
                        what.c_str(), m.amount_cents.c_str(), m.status.c_str(), or_dash(m.stripe_object_id),
                        m.payment_intent_id ? " intent " : "",
                        m.payment_intent_id ? m.payment_intent_id->c_str() : "", m.key_generation.c_str(),
                        m.last_error ? "; last error: " : "", m.last_error ? m.last_error->c_str() : "");
        }
    }
}

void print_text(const explanation& x) {
    if (const auto& c = x.by_stripe_customer) {
        std::printf("stripe customer %s, period %s: %zu ledger row(s)\n", c->stripe_customer.c_str(),
                    x.period.c_str(), c->rows.size());
        for (const auto& r : c->rows)
            std::printf("  ledger %s: customer %s, %s %s %s, charge %s\n", r.key.c_str(),
                        r.customer_id.c_str(), r.status.c_str(), r.amount_cents.c_str(), r.currency.c_str(),
                        or_dash(r.charge_id));
        if (c->stripe_asked) {
            std::printf("  stripe: %zu charge(s) for the period\n", c->charges.size());
            for (const auto& ch : c->charges)
                std::printf("  stripe %s: %s %s %s, customer %s\n", ch.id.c_str(), ch.status.c_str(),
                            ch.amount.c_str(), ch.currency.c_str(), ch.customer_id.c_str());
        }
        std::printf("verdict: %s\n", x.verdict.c_str());
        return;
    }
    std::printf("key:          %s\n", x.key.c_str());
    if (!x.customer.empty())
        std::printf("computed from namespace %s, customer %s, period %s\n", x.key_namespace.c_str(),
                    x.customer.c_str(), x.period.c_str());
    if (!x.row) {
        std::printf("ledger row:   none\n");
    } else {
        std::printf("ledger row:\n");
        for (const auto& f : x.row->fields)
            std::printf("  %-24s %s\n", f.name.c_str(), f.value.value_or("-").c_str());
        std::printf("  %-24s %s\n", "lease_live", x.row->lease_live ? "yes" : "no");
    }
    if (x.letters.empty()) std::printf("dead letters: none\n");
    for (const auto& l : x.letters) {
        std::string state = l.dismissed_at  ? "dismissed " + *l.dismissed_at
                            : l.replayed_at ? "replayed " + *l.replayed_at
                                            : "open";
        std::printf("dead letter %s: %s (received %s, %s; found by its %s)\n", l.id.c_str(), l.reason.c_str(),
                    l.received_at.c_str(), state.c_str(), l.found_by == "key" ? "billing key" : "body");
    }
    if (!x.spend)
        std::printf("vault:        no vault tables\n");
    else if (x.spend->empty())
        std::printf("vault:        no reservation\n");
    for (const auto& s : x.spend.value_or(std::vector<spend_view>{}))
        std::printf("vault %s: %s %s cents under %s (reserved %s, object %s)\n", s.vault_key_id.c_str(),
                    s.state.c_str(), s.amount_cents.c_str(), s.idempotency_key.c_str(), s.reserved_at.c_str(),
                    s.stripe_object_id.value_or("-").c_str());
    print_corrections_text(x);
    if (!x.attempts.empty()) std::printf("attempts:     %zu (retried after a decline)\n", x.attempts.size());
    for (std::size_t i = 0; i < x.attempts.size(); ++i) {
        const auto& a = x.attempts[i];
        std::printf("attempt %zu (generation %s): %s -> %s\n", i + 1, a.generation.c_str(), a.started.c_str(),
                    a.outcome.c_str());
    }
    if (!x.stripe.asked) {
        std::printf("stripe:       %s\n", x.stripe.skipped.c_str());
    } else {
        if (x.stripe.charge)
            std::printf("stripe charge: %s %s %lld %s (created %lld)\n", x.stripe.charge->id.c_str(),
                        x.stripe.charge->status.c_str(), static_cast<long long>(x.stripe.charge->amount),
                        x.stripe.charge->currency.c_str(), static_cast<long long>(x.stripe.charge->created));
        else
            std::printf("stripe charge: none carries metadata[billing_key]=%s\n", x.key.c_str());
        if (x.stripe.intent)
            std::printf("stripe payment intent: %s %s\n", x.stripe.intent->id.c_str(),
                        x.stripe.intent->status.c_str());
        else
            std::printf("stripe payment intent: none\n");
    }
    std::printf("verdict: %s\n", x.verdict.c_str());
}

void json_field(std::string& out, std::string_view name, const std::optional<std::string>& v,
                bool comma = true) {
    if (comma) out += ',';
    append_json_string(out, name);
    out += ':';
    if (v)
        append_json_string(out, *v);
    else
        out += "null";
}

// `[{…},{…}]`: one object per item, its fields written by `fields(out, item)`, the first one without a
// comma before it (json_field's `comma` = false).
template <typename Items, typename Fields>
void json_array(std::string& out, const Items& items, Fields fields) {
    out += '[';
    bool first = true;
    for (const auto& item : items) {
        out += first ? "{" : ",{";
        first = false;
        fields(out, item);
        out += '}';
    }
    out += ']';
}

void print_json(const explanation& x) {
    std::string o = "{";
    json_field(o, "key", x.key, false);
    json_field(o, "customer_id", x.customer.empty() ? std::nullopt : std::optional(x.customer));
    json_field(o, "period", x.period.empty() ? std::nullopt : std::optional(x.period));
    json_field(o, "key_namespace", x.key_namespace);
    json_field(o, "state", x.state);
    json_field(o, "verdict", x.verdict);
    o += ",\"ledger\":";
    if (x.row) {
        o += '{';
        bool first = true;
        for (const auto& f : x.row->fields) {
            json_field(o, f.name, f.value, !first);
            first = false;
        }
        o += std::string(",\"lease_live\":") + (x.row->lease_live ? "true" : "false") + '}';
    } else {
        o += "null";
    }
    o += ",\"dead_letters\":";
    json_array(o, x.letters, [](std::string& out, const auto& l) {
        json_field(out, "id", l.id, false);
        json_field(out, "reason", l.reason);
        json_field(out, "received_at", l.received_at);
        json_field(out, "replayed_at", l.replayed_at);
        json_field(out, "dismissed_at", l.dismissed_at);
        json_field(out, "found_by", l.found_by);
    });
    o += ",\"vault_spend\":";
    if (!x.spend) {
        o += "null";
    } else {
        json_array(o, *x.spend, [](std::string& out, const auto& s) {
            json_field(out, "vault_key_id", s.vault_key_id, false);
            json_field(out, "idempotency_key", s.idempotency_key);
            json_field(out, "amount_cents", s.amount_cents);
            json_field(out, "state", s.state);
            json_field(out, "stripe_object_id", s.stripe_object_id);
            json_field(out, "reserved_at", s.reserved_at);
        });
    }
    o += ",\"corrections\":";
    if (!x.corrections) {
        o += "null";
    } else {
        json_array(o, *x.corrections, [](std::string& out, const auto& r) {
            json_field(out, "key", r.key, false);
            json_field(out, "revision", r.revision);
            json_field(out, "total_cents", r.total_cents);
            json_field(out, "currency", r.currency);
            json_field(out, "delta_cents", r.delta_cents);
            json_field(out, "status", r.status);
            json_field(out, "note", r.note);
            json_field(out, "started_at", r.started_at);
            json_field(out, "finished_at", r.finished_at);
            out += ",\"moves\":";
            json_array(out, r.moves, [](std::string& mo, const auto& m) {
                json_field(mo, "part", m.part, false);
                json_field(mo, "kind", m.kind);
                json_field(mo, "amount_cents", m.amount_cents);
                json_field(mo, "refund_of", m.refund_of);
                json_field(mo, "status", m.status);
                json_field(mo, "stripe_object_id", m.stripe_object_id);
                json_field(mo, "payment_intent_id", m.payment_intent_id);
                json_field(mo, "key_generation", m.key_generation);
                json_field(mo, "last_error", m.last_error);
            });
        });
    }
    json_field(o, "net_cents", x.net_cents);
    o += ",\"attempts\":";
    json_array(o, x.attempts, [](std::string& out, const auto& a) {
        json_field(out, "generation", a.generation, false);
        json_field(out, "started", a.started);
        json_field(out, "outcome", a.outcome);
    });
    o += ",\"stripe_customer\":";
    if (const auto& c = x.by_stripe_customer) {
        o += '{';
        json_field(o, "id", c->stripe_customer, false);
        o += ",\"ledger\":";
        json_array(o, c->rows, [](std::string& out, const auto& r) {
            json_field(out, "key", r.key, false);
            json_field(out, "customer_id", r.customer_id);
            json_field(out, "status", r.status);
            json_field(out, "amount_cents", r.amount_cents);
            json_field(out, "currency", r.currency);
            json_field(out, "charge_id", r.charge_id);
        });
        o += ",\"charges\":";
        if (!c->stripe_asked) {
            o += "null";
        } else {
            json_array(o, c->charges, [](std::string& out, const auto& ch) {
                json_field(out, "id", ch.id, false);
                json_field(out, "status", ch.status);
                json_field(out, "customer_id", ch.customer_id);
                json_field(out, "amount", ch.amount);
                json_field(out, "currency", ch.currency);
            });
        }
        o += '}';
    } else {
        o += "null";
    }
    o += ",\"stripe\":";
    if (!x.stripe.asked) {
        o += "null";
    } else {
        o += '{';
        json_field(o, "charge_id", x.stripe.charge ? std::optional(x.stripe.charge->id) : std::nullopt,
                   false);
        json_field(o, "charge_status",
                   x.stripe.charge ? std::optional(x.stripe.charge->status) : std::nullopt);
        json_field(o, "payment_intent_id",
                   x.stripe.intent ? std::optional(x.stripe.intent->id) : std::nullopt);
        json_field(o, "payment_intent_status",
                   x.stripe.intent ? std::optional(x.stripe.intent->status) : std::nullopt);
        o += '}';
    }
    o += "}\n";
    std::fputs(o.c_str(), stdout);
}

}  // namespace cg::app::explain_impl
