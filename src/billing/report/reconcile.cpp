#include "billing/report/reconcile.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>

#include "billing/machine/machine.hpp"
#include "billing/report/expected_run.hpp"
#include "core/log.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {
namespace {

std::string_view trim_cr(std::string_view s) {
    if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
    return s;
}

bool blank(std::string_view s) {
    return s.find_first_not_of(" \t\r") == std::string_view::npos;
}

error line_error(std::size_t line, const std::string& what) {
    return error(core_errc::invalid_argument, "line " + std::to_string(line) + ": " + what);
}

std::string describe_event_error(const error& e) {
    return e.message.empty() ? e.describe() : e.message;
}

// One CSV record (RFC 4180 quoting within a line; fields may not span lines).
result<std::vector<std::string>> split_csv(std::string_view line, std::size_t line_no) {
    std::vector<std::string> out;
    std::string cur;
    bool quoted = false, was_quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
        char c = line[i];
        if (quoted) {
            if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
                cur += '"';
                ++i;
            } else if (c == '"') {
                quoted = false;
            } else {
                cur += c;
            }
        } else if (c == '"' && cur.empty() && !was_quoted) {
            quoted = was_quoted = true;
        } else if (c == ',') {
            out.push_back(std::move(cur));
            cur.clear();
            was_quoted = false;
        } else {
            cur += c;
        }
    }
    if (quoted) return line_error(line_no, "unterminated quoted field");
    out.push_back(std::move(cur));
    for (auto& f : out) {
        auto b = f.find_first_not_of(" \t");
        auto e = f.find_last_not_of(" \t");
        f = b == std::string::npos ? std::string() : f.substr(b, e - b + 1);
    }
    return out;
}

bool is_integer(std::string_view s) {
    if (!s.empty() && s[0] == '-') s.remove_prefix(1);
    return !s.empty() && s.size() < 19 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The line of `text` that starts at `pos` (without its CR LF or LF); moves `pos` past it, beyond
// text.size() after the last one.
std::string_view next_line(std::string_view text, std::size_t& pos) {
    auto nl = text.find('\n', pos);
    auto line = trim_cr(text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos));
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    return line;
}

result<std::vector<expected_event>> parse_jsonl(std::string_view text) {
    std::vector<expected_event> out;
    std::optional<error> failed;
    for_each_event_line(text, [&](std::size_t line_no, std::string_view line, result<billing_event>& ev) {
        if (!ev) {
            failed = line_error(line_no, describe_event_error(ev.err()));
            return false;
        }
        out.push_back({std::move(*ev), std::string(line), line_no, std::nullopt, 0});
        return true;
    });
    if (failed) return *failed;
    return out;
}

result<std::vector<expected_event>> parse_csv(std::string_view text) {
    static const char* const required[] = {"customer_id", "billing_period", "amount_cents", "currency",
                                           "stripe_customer_id"};
    std::vector<expected_event> out;
    std::map<std::string, std::size_t> col;
    std::size_t line_no = 0, pos = 0;
    bool header = true;
    while (pos <= text.size()) {
        auto line = next_line(text, pos);
        ++line_no;
        if (blank(line)) continue;
        auto fields = split_csv(line, line_no);
        if (!fields) return fields.err();
        if (header) {
            for (std::size_t i = 0; i < fields->size(); ++i) col[(*fields)[i]] = i;
            for (const char* r : required)
                if (!col.count(r)) return line_error(line_no, std::string("CSV header has no column ") + r);
            header = false;
            continue;
        }
        auto field = [&](const char* name) -> std::string {
            auto it = col.find(name);
            return it == col.end() || it->second >= fields->size() ? std::string() : (*fields)[it->second];
        };
        // Rendered as JSON and validated by the same parser `consume` uses.
        std::string json = "{\"customer_id\":";
        append_json_string(json, field("customer_id"));
        json += ",\"billing_period\":";
        append_json_string(json, field("billing_period"));
        json += ",\"amount_cents\":";
        auto amount = field("amount_cents");
        if (is_integer(amount))
            json += amount;
        else
            append_json_string(json, amount);
        json += ",\"currency\":";
        append_json_string(json, field("currency"));
        json += ",\"stripe_customer_id\":";
        append_json_string(json, field("stripe_customer_id"));
        if (auto d = field("description"); !d.empty()) {
            json += ",\"description\":";
            append_json_string(json, d);
        }
        // A PaymentIntent event stays one: re-published without its payment method it would be charged
        // through /v1/charges under a key Stripe already saw on /v1/payment_intents.
        if (auto pm = field("payment_method"); !pm.empty()) {
            json += ",\"payment_method\":";
            append_json_string(json, pm);
        }
        if (auto acct = field("stripe_account"); !acct.empty()) {
            json += ",\"stripe_account\":";
            append_json_string(json, acct);  // validated by the parser below
        }
        if (auto os = field("off_session"); !os.empty()) {
            json += ",\"off_session\":";
            if (os == "true" || os == "false")
                json += os;
            else
                append_json_string(json, os);  // refused by the parser below, with its message
        }
        json += "}";
        auto ev = parse_event(json);
        if (!ev) return line_error(line_no, describe_event_error(ev.err()));
        out.push_back({std::move(*ev), std::move(json), line_no, std::nullopt, 0});
    }
    if (header) return error(core_errc::invalid_argument, "CSV without a header line");
    return out;
}

bool same_payload(const billing_event& a, const billing_event& b) {
    return a.amount_cents == b.amount_cents && a.currency == b.currency &&
           a.stripe_customer_id == b.stripe_customer_id;
}

// " account acct_…" for a Connect event, "" for the platform's: how an error names the run's entry.
std::string on_account(const billing_event& ev) {
    return ev.connected() ? " account " + ev.stripe_account : std::string();
}

std::string money(std::int64_t cents, const std::string& currency) {
    return std::to_string(cents) + " " + currency;
}

}  // namespace

result<std::vector<expected_event>> parse_expected(std::string_view text) {
    auto first = text.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return std::vector<expected_event>{};
    auto parsed = text[first] == '{' ? parse_jsonl(text) : parse_csv(text);
    if (!parsed) return parsed;
    // One entry per (customer, period, account): an exact repeat is dropped, a different payload is an error.
    using run_key = std::tuple<std::string, std::string, std::string>;
    std::map<run_key, std::size_t> seen;
    std::vector<expected_event> out;
    out.reserve(parsed->size());
    // Corrections of each (customer, period, account): revision → its line's index in `parsed`.
    std::map<run_key, std::map<std::int32_t, std::size_t>> revisions;
    for (std::size_t i = 0; i < parsed->size(); ++i) {
        auto& e = (*parsed)[i];
        if (!e.event.is_correction()) continue;
        auto& by_rev = revisions[{e.event.customer_id, e.event.billing_period, e.event.stripe_account}];
        auto [r, fresh] = by_rev.emplace(e.event.revision, i);
        if (!fresh && !same_payload((*parsed)[r->second].event, e.event))
            return line_error(e.line, "customer " + e.event.customer_id + " period " +
                                          e.event.billing_period + on_account(e.event) + " revision " +
                                          std::to_string(e.event.revision) + " is listed on line " +
                                          std::to_string((*parsed)[r->second].line) + " with another total");
    }
    for (auto& e : *parsed) {
        if (e.event.is_correction()) continue;
        run_key k{e.event.customer_id, e.event.billing_period, e.event.stripe_account};
        auto it = seen.find(k);
        if (it == seen.end()) {
            seen.emplace(k, out.size());
            out.push_back(std::move(e));
        } else if (!same_payload(out[it->second].event, e.event)) {
            return line_error(e.line, "customer " + e.event.customer_id + " period " +
                                          e.event.billing_period + on_account(e.event) +
                                          " is listed on line " + std::to_string(out[it->second].line) +
                                          " with another amount, currency or Stripe customer");
        }
    }
    for (const auto& [k, by_rev] : revisions) {
        auto it = seen.find(k);
        if (it == seen.end())
            continue;  // a correction of a period the run does not charge: nothing to compare
        const auto& last = (*parsed)[by_rev.rbegin()->second].event;
        out[it->second].corrected_total = last.amount_cents;
        out[it->second].corrected_revision = last.revision;
    }
    return out;
}

std::string event_json(const billing_event& ev) {
    std::string json = "{\"customer_id\":";
    append_json_string(json, ev.customer_id);
    json += ",\"billing_period\":";
    append_json_string(json, ev.billing_period);
    json += ",\"amount_cents\":" + std::to_string(ev.amount_cents) + ",\"currency\":";
    append_json_string(json, ev.currency);
    json += ",\"stripe_customer_id\":";
    append_json_string(json, ev.stripe_customer_id);
    if (!ev.description.empty()) {
        json += ",\"description\":";
        append_json_string(json, ev.description);
    }
    if (ev.connected()) {
        json += ",\"stripe_account\":";
        append_json_string(json, ev.stripe_account);
    }
    return json + "}";
}

std::string_view to_string(recon_class c) noexcept {
    switch (c) {
        case recon_class::ok:
            return "ok";
        case recon_class::missing:
            return "missing";
        case recon_class::pending:
            return "pending";
        case recon_class::absent_at_stripe:
            return "charged_absent_at_stripe";
        case recon_class::not_in_ledger:
            return "at_stripe_not_in_ledger";
        case recon_class::mismatch:
            return "amount_currency_mismatch";
        case recon_class::declined:
            return "declined";
        case recon_class::dead_lettered:
            return "dead_lettered";
        case recon_class::cap_blocked:
            return "cap_blocked";
        case recon_class::processing:
            return "processing";
    }
    return "unknown";
}

bool is_explained(recon_class c) noexcept {
    return c == recon_class::ok || c == recon_class::declined || c == recon_class::dead_lettered ||
           c == recon_class::cap_blocked || c == recon_class::processing;
}

namespace {

// The charge moved the money, as the fact function reads its status.
bool succeeded_at_stripe(const charge_fact& ch) noexcept {
    return stripe::charge_movement(ch.status) == stripe::movement::charged;
}

}  // namespace

recon_verdict classify(const recon_facts& f) {
    const charge_fact* succeeded = nullptr;
    for (const auto& ch : f.charges)
        if (succeeded_at_stripe(ch) && (!f.record || f.record->charge_id != ch.id)) {
            succeeded = &ch;
            break;
        }
    if (!f.record) {
        if (succeeded)
            return {recon_class::not_in_ledger, "charge " + succeeded->id + " (" +
                                                    money(succeeded->amount, succeeded->currency) +
                                                    ") carries the key; the ledger has no row"};
        if (f.dead_letter_reason) return {recon_class::dead_lettered, *f.dead_letter_reason};
        if (!f.charges.empty())
            return {recon_class::not_in_ledger, f.charges.front().status + " charge " + f.charges.front().id +
                                                    " carries the key; the ledger has no row"};
        return {recon_class::missing, "no ledger row and no dead letter: the message never reached consume"};
    }
    const ledger_record& rec = *f.record;
    if (rec.status == record_status::charged && f.recorded_charge_known) {
        const std::string id = rec.charge_id.value_or("");
        // The charge that does carry the key, if any: what the row should probably say.
        const std::string also = succeeded ? "; " + succeeded->id + " carries the key" : "";
        if (!f.recorded_charge)
            return {recon_class::absent_at_stripe, "charge " + id + " does not exist at Stripe" + also};
        const charge_fact& ch = *f.recorded_charge;
        if (ch.customer != rec.stripe_customer_id || ch.amount != rec.amount_cents ||
            ch.currency != rec.currency)
            return {recon_class::absent_at_stripe,
                    "charge " + id + " is " + ch.customer + " " + money(ch.amount, ch.currency) +
                        " at Stripe; the ledger says " + rec.stripe_customer_id + " " +
                        money(rec.amount_cents, rec.currency) + also};
        if (!succeeded_at_stripe(ch))
            return {recon_class::absent_at_stripe, "charge " + id + " is " + ch.status + " at Stripe" + also};
    }
    // A second successful charge for one key: money taken that the ledger does not account for.
    if (succeeded && !machine::records_found_payment(rec.status))
        return {recon_class::not_in_ledger,
                "charge " + succeeded->id + " (" + money(succeeded->amount, succeeded->currency) +
                    ") carries the key; the ledger records " + rec.charge_id.value_or("none")};
    if (!f.expected)
        return {recon_class::mismatch, "the ledger has this customer and period; the expected list does not"};
    const billing_event& ev = f.expected->event;
    billing_event recorded;
    recorded.customer_id = rec.customer_id;
    recorded.billing_period = rec.billing_period;
    recorded.amount_cents = rec.amount_cents;
    recorded.currency = rec.currency;
    recorded.stripe_customer_id = rec.stripe_customer_id;
    if (!same_payload(ev, recorded))
        return {recon_class::mismatch,
                "expected " + ev.stripe_customer_id + " " + money(ev.amount_cents, ev.currency) +
                    ", ledger " + rec.stripe_customer_id + " " + money(rec.amount_cents, rec.currency)};
    switch (rec.status) {
        case record_status::charged: {
            const auto& exp = *f.expected;
            if (!exp.corrected_total && !f.corrected_net)
                return {recon_class::ok, rec.charge_id.value_or("")};
            // Corrections: the money moved for the period against the run's corrected total.
            std::int64_t want = exp.corrected_total.value_or(rec.amount_cents);
            std::int64_t moved = f.corrected_net.value_or(rec.amount_cents);
            if (want == moved)
                return {recon_class::ok,
                        rec.charge_id.value_or("") + ", corrected to " + money(moved, rec.currency)};
            if (f.correction_open)
                return {recon_class::pending, "a correction is under way: moved " +
                                                  money(moved, rec.currency) + ", expected " +
                                                  money(want, rec.currency)};
            return {recon_class::mismatch, "expected corrected total " + money(want, rec.currency) +
                                               " (revision " + std::to_string(exp.corrected_revision) +
                                               "), the ledger moved " + money(moved, rec.currency)};
        }
        case record_status::pending: {
            std::string d =
                "still pending after " + std::to_string(rec.stripe_attempts) + " Stripe attempt(s)";
            for (const auto& ch : f.charges)
                if (succeeded_at_stripe(ch))
                    d += "; charge " + ch.id + " carries the key (recovery will settle it)";
            return {recon_class::pending, d};
        }
        case record_status::declined:
            return {recon_class::declined, rec.charge_id.value_or("no charge")};
        case record_status::failed:
        case record_status::conflict:
            return {recon_class::dead_lettered,
                    f.dead_letter_reason.value_or(std::string(billing::to_string(rec.status)) +
                                                  " (no open dead letter)")};
        case record_status::cap_blocked:
            return {recon_class::cap_blocked, "the spend cap refused the charge"};
        case record_status::processing:
            return {recon_class::processing,
                    std::string("processing at Stripe: settled by a webhook or the poll") +
                        (succeeded ? "; charge " + succeeded->id + " carries the key and succeeded" : "")};
        case record_status::failed_after_processing:
            return {recon_class::dead_lettered,
                    f.dead_letter_reason.value_or("failed after processing (no open dead letter)")};
    }
    return {recon_class::pending, "unknown status"};
}

}  // namespace cg::billing
