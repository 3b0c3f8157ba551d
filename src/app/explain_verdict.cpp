// The verdict of `chargeguard explain` (app/explain_verdict.hpp): what the ledger row, the dead letters, the
// corrections, the attempts and Stripe's objects mean together, as one line and one state.
#include "app/explain_verdict.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "billing/machine/settlement.hpp"
#include "stripe/fact.hpp"

namespace cg::app::explain_impl {

// "; corrected to 700 cents by revision 2 (applied); net moved 700 cents", and any revision still open.
std::string corrections_summary(const explanation& x) {
    if (!x.corrections || x.corrections->empty()) return "";
    const auto& last = x.corrections->back();
    std::string out = "; corrected to " + last.total_cents + " cents by revision " + last.revision + " (" +
                      last.status + ")";
    for (const auto& rev : *x.corrections)
        if (rev.status == "pending" || rev.status == "waiting")
            out += "; revision " + rev.revision + " " + rev.status;
    if (x.net_cents) out += "; net moved " + *x.net_cents + " cents";
    return out;
}

std::string replay_hint(const explanation& x) {
    for (const auto& l : x.letters)
        if (l.open()) return "; replay with chargeguard dead-letters replay " + l.id;
    return "";
}

const letter_view* open_letter(const explanation& x) {
    for (const auto& l : x.letters)
        if (l.open()) return &l;
    return nullptr;
}

// The verdict from what was found. Ledger first (it is the record of truth consume writes), then Stripe.
void decide(explanation& x) {
    const letter_view* letter = open_letter(x);
    if (!x.row) {
        if (letter) {
            x.state = "dead_lettered";
            x.verdict = "dead-lettered: " + letter->reason + replay_hint(x);
        } else if (!x.letters.empty()) {
            // Every letter closed, and still no row: a dismissal, or a replay whose event has not arrived.
            const auto& l = x.letters.back();
            x.state = "dead_lettered";
            x.verdict = "dead-lettered: " + l.reason + " (letter " + l.id + " " +
                        (l.dismissed_at ? "dismissed at " + *l.dismissed_at
                                        : "replayed at " + l.replayed_at.value_or("?")) +
                        "; no ledger row since)";
        } else {
            x.state = "never_seen";
            x.verdict = "never seen: no ledger row and no dead letter for key " + x.key +
                        " (was the event published? is --key-namespace " + x.key_namespace + " consume's?)";
        }
        if (x.stripe.charge)
            x.verdict += "; but Stripe holds " + x.stripe.charge->id + " (" + x.stripe.charge->status +
                         ") for this key";
        return;
    }
    const auto& r = *x.row;
    auto status = r.str("status");
    auto err = r.get("last_error").value_or("no error recorded");
    x.state = status;
    if (status == "charged") {
        x.verdict = "charged once: " + r.str("charge_id") + " at " + r.str("updated_at");
        auto refunded = r.str("refunded_cents");
        if (!refunded.empty() && refunded != "0")
            x.verdict += refunded == r.str("amount_cents")
                             ? "; refunded in full"
                             : "; refunded " + refunded + " of " + r.str("amount_cents") + " cents";
        if (auto d = r.get("dispute_status")) {
            std::int64_t cents = 0;
            const auto text = r.str("disputed_cents");
            std::from_chars(text.data(), text.data() + text.size(), cents);
            x.verdict += "; " + billing::describe_dispute(*d, cents);
        }
    } else if (status == "processing") {
        x.verdict = "processing since " + r.str("processing_since") + " (Stripe said " +
                    r.str("stripe_status") + " at " + r.str("stripe_status_at") +
                    "): the bank has not answered; a webhook or the processing poll settles it";
    } else if (status == "failed_after_processing") {
        x.verdict = "failed after processing: " + err + replay_hint(x);
    } else if (status == "pending") {
        if (r.lease_live)
            x.verdict = "pending: lease held (epoch " + r.str("lease_epoch") + ") until " +
                        r.str("lease_until") + ", will be retried";
        else if (r.get("indeterminate_since"))
            x.verdict =
                "pending, indeterminate since " + r.str("indeterminate_since") +
                " (Stripe's answer was lost): the next delivery searches Stripe before charging again";
        else
            x.verdict =
                "pending: lease expired; the next delivery resumes it (none coming: chargeguard "
                "reconcile --publish re-publishes it)";
        if (x.stripe.charge)
            x.verdict += "; Stripe already holds " + x.stripe.charge->id + " (" + x.stripe.charge->status +
                         ") for this key: recovery records it";
    } else if (status == "declined") {
        x.verdict = "declined: " + err +
                    "; once the payment method is fixed: chargeguard retry-declined --key " + r.str("key") +
                    " --reason R";
    } else if (status == "cap_blocked") {
        x.verdict = "cap-blocked: " + err + replay_hint(x);
    } else if (letter) {
        x.state = "dead_lettered";
        x.verdict = "dead-lettered: " + letter->reason + " (ledger row " + status + ")" + replay_hint(x);
    } else {
        x.verdict = status + ": " + err;
    }
    if (!x.attempts.empty())
        x.verdict += "; " + std::to_string(x.attempts.size()) + " attempts (" +
                     std::to_string(x.attempts.size() - 1) + " retried after a decline)";
    x.verdict += corrections_summary(x);
    if (r.str("key") != x.key)
        x.verdict += " (the row's key " + r.str("key") + " is not the computed one: another --key-namespace)";
}

// --stripe-customer: how many times the Stripe customer paid for the period, whatever customer ids the
// events came under. Stripe's succeeded charges when Stripe was asked (the money), else the ledger's charged
// rows.
void decide_stripe_customer(explanation& x) {
    const auto& c = *x.by_stripe_customer;
    std::vector<std::pair<std::string, std::string>> paid;  // (charge, customer id)
    if (c.stripe_asked) {
        for (const auto& ch : c.charges)
            if (stripe::charge_movement(ch.status) == stripe::movement::charged)
                paid.emplace_back(ch.id, ch.customer_id);
    } else {
        for (const auto& r : c.rows)
            if (r.status == "charged") paid.emplace_back(r.charge_id.value_or("-"), r.customer_id);
    }
    std::string where = c.stripe_asked ? "Stripe holds " : "the ledger records ";
    if (paid.empty()) {
        x.state = c.rows.empty() ? "never_seen" : "not_charged";
        x.verdict = "not charged: " + where + "no payment of " + c.stripe_customer + " for period " +
                    x.period + " (" + std::to_string(c.rows.size()) + " ledger row(s))";
        return;
    }
    std::sort(paid.begin(), paid.end(), [](const auto& a, const auto& b) {
        return std::tie(a.second, a.first) < std::tie(b.second, b.first);  // by customer id, then charge
    });
    std::string list;
    std::vector<std::string> ids;
    for (const auto& [charge, customer] : paid) {
        list += (list.empty() ? "" : ", ") + customer + ": " + charge;
        if (std::find(ids.begin(), ids.end(), customer) == ids.end()) ids.push_back(customer);
    }
    if (paid.size() == 1) {
        x.state = "charged";
        x.verdict = "charged once: " + where + paid[0].first + " (customer id " + paid[0].second + ")";
        return;
    }
    x.state = "charged_more_than_once";
    x.verdict = (paid.size() == 2 ? std::string("charged twice")
                                  : "charged " + std::to_string(paid.size()) + " times") +
                ": " + where + std::to_string(paid.size()) + " payments of " + c.stripe_customer +
                " for period " + x.period + " under " + std::to_string(ids.size()) + " customer id(s) (" +
                list + ")";
}

}  // namespace cg::app::explain_impl
