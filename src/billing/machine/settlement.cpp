#include "billing/machine/settlement.hpp"

#include <simdjson.h>

#include <algorithm>
#include <tuple>

#include "stripe/error.hpp"
#include "stripe/fact.hpp"

namespace cg::billing {

std::string_view to_string(fact_kind k) noexcept {
    switch (k) {
        case fact_kind::processing:
            return "processing";
        case fact_kind::succeeded:
            return "succeeded";
        case fact_kind::failed:
            return "failed";
        case fact_kind::refunded:
            return "refunded";
        case fact_kind::refund_update:
            return "refund_update";
        case fact_kind::dispute_opened:
            return "dispute_opened";
        case fact_kind::dispute_closed:
            return "dispute_closed";
        case fact_kind::no_news:
            return "no_news";
        case fact_kind::unknown_type:
            return "unknown_type";
    }
    return "?";
}

std::string_view to_string(settle_result r) noexcept {
    switch (r) {
        case settle_result::applied:
            return "applied";
        case settle_result::no_change:
            return "no_change";
        case settle_result::deferred:
            return "deferred";
        case settle_result::other_payment:
            return "other_payment";
        case settle_result::unconfirmed:
            return "unconfirmed";
        case settle_result::unknown_type:
            return "unknown_type";
    }
    return "?";
}

std::string_view to_string(payment_link l) noexcept {
    switch (l) {
        case payment_link::same:
            return "same";
        case payment_link::other:
            return "other";
        case payment_link::unproven:
            return "unproven";
    }
    return "?";
}

fact_kind fact_kind_for_event(std::string_view type) noexcept {
    if (type == "payment_intent.processing") return fact_kind::processing;
    if (type == "payment_intent.succeeded" || type == "charge.succeeded") return fact_kind::succeeded;
    if (type == "payment_intent.payment_failed" || type == "payment_intent.canceled" ||
        type == "charge.failed")
        return fact_kind::failed;
    if (type == "charge.refunded") return fact_kind::refunded;
    // A refund's failure or cancellation arrives as refund.updated and charge.refund.updated with the refund
    // in its new status: the pinned API version has no refund.failed event.
    if (type == "refund.created" || type == "refund.updated" || type == "charge.refund.updated")
        return fact_kind::refund_update;
    // Every dispute event carries the dispute in its status as of then (under_review comes by
    // charge.dispute.updated; funds_withdrawn and funds_reinstated accompany the opening and the win).
    if (type == "charge.dispute.created" || type == "charge.dispute.updated" ||
        type == "charge.dispute.funds_withdrawn")
        return fact_kind::dispute_opened;
    if (type == "charge.dispute.closed" || type == "charge.dispute.funds_reinstated")
        return fact_kind::dispute_closed;
    return fact_kind::unknown_type;
}

// The poll's retrieve, read as the event it stands for: the movement is stripe/fact's reading, so a status
// means the same here as to the create call, the recovery search and the webhook receiver.
fact_kind fact_kind_for_intent_status(std::string_view status) noexcept {
    switch (stripe::intent_movement(status)) {
        case stripe::movement::charged:
            return fact_kind::succeeded;
        // requires_capture: an authorisation nobody captures lapses (then canceled): money has not moved yet.
        case stripe::movement::in_flight:
        case stripe::movement::authorised:
            return fact_kind::processing;
        // After processing, a failed debit returns the intent to requires_payment_method.
        case stripe::movement::failed:
        case stripe::movement::canceled:
            return fact_kind::failed;
        default:
            // requires_action, requires_confirmation: nothing moved, and only someone acting moves it.
            return fact_kind::no_news;
    }
}

fact_kind fact_kind_for_charge_status(std::string_view status) noexcept {
    switch (stripe::charge_movement(status)) {
        case stripe::movement::charged:
            return fact_kind::succeeded;
        case stripe::movement::in_flight:
            return fact_kind::processing;
        case stripe::movement::failed:
            return fact_kind::failed;
        default:
            return fact_kind::no_news;
    }
}

namespace {

std::string_view str(simdjson::dom::object o, std::string_view field) {
    std::string_view v;
    if (o[field].get_string().get(v)) return {};
    return v;
}

// A field that is an id, or an expanded object carrying one (latest_charge, charge, payment_intent).
std::string_view id_of(simdjson::dom::object o, std::string_view field) {
    auto el = o[field];
    std::string_view v;
    if (!el.get_string().get(v)) return v;
    simdjson::dom::object inner;
    if (!el.get_object().get(inner)) return str(inner, "id");
    return {};
}

std::int64_t int_of(simdjson::dom::object o, std::string_view field) {
    std::int64_t v = 0;
    if (o[field].get_int64().get(v)) return 0;
    return v;
}

}  // namespace

result<payment_fact> parse_event_fact(std::string_view body) {
    auto bad = [](std::string why) {
        return result<payment_fact>(stripe::errc::bad_response, std::move(why));
    };
    thread_local simdjson::dom::parser fact_parser;
    simdjson::dom::element doc;
    if (auto e = fact_parser.parse(body.data(), body.size()).get(doc); e)
        return bad(std::string("not JSON: ") + simdjson::error_message(e));
    simdjson::dom::object ev, obj;
    if (doc.get_object().get(ev)) return bad("not a JSON object");
    if (ev.at_pointer("/data/object").get_object().get(obj)) return bad("no \"data.object\"");
    payment_fact f;
    f.source = std::string(str(ev, "type"));
    f.kind = fact_kind_for_event(f.source);
    f.created = int_of(ev, "created");
    f.account = std::string(str(ev, "account"));
    auto kind = str(obj, "object");
    f.status = std::string(str(obj, "status"));
    simdjson::dom::object md;
    if (!obj["metadata"].get_object().get(md)) f.billing_key = std::string(str(md, "billing_key"));
    if (kind == "payment_intent") {
        f.payment_intent_id = std::string(str(obj, "id"));
        f.charge_id = std::string(id_of(obj, "latest_charge"));
        simdjson::dom::object err;
        if (!obj["last_payment_error"].get_object().get(err)) f.failure = std::string(str(err, "code"));
        if (f.failure.empty()) f.failure = std::string(str(obj, "cancellation_reason"));
    } else if (kind == "charge") {
        f.charge_id = std::string(str(obj, "id"));
        f.payment_intent_id = std::string(id_of(obj, "payment_intent"));
        f.amount_refunded = int_of(obj, "amount_refunded");
        f.failure = std::string(str(obj, "failure_code"));
    } else if (kind == "refund") {
        f.refund_id = std::string(str(obj, "id"));
        f.charge_id = std::string(id_of(obj, "charge"));
        f.payment_intent_id = std::string(id_of(obj, "payment_intent"));
        f.refund_amount = int_of(obj, "amount");
        f.failure = std::string(str(obj, "failure_reason"));
        if (f.refund_id.empty() || (f.charge_id.empty() && f.payment_intent_id.empty()))
            return bad("event " + f.source + " carries a refund without its id or its payment");
    } else if (kind == "dispute") {
        f.charge_id = std::string(id_of(obj, "charge"));
        f.payment_intent_id = std::string(id_of(obj, "payment_intent"));
        f.dispute_amount = int_of(obj, "amount");
    } else if (f.kind != fact_kind::unknown_type) {
        // A type we act on must carry the object we read: anything else is a different API shape.
        return bad("event " + f.source + " carries a \"" + std::string(kind) + "\" object");
    }
    return f;
}

namespace {

int payment_rank(record_status s) noexcept {
    switch (s) {
        case record_status::processing:
            return 1;
        case record_status::failed_after_processing:
            return 2;
        case record_status::charged:
            return 3;
        default:
            return 0;
    }
}

// Two readings of a dispute keep the later status in the order a dispute can pass them (stripe/fact).
std::tuple<int, std::string_view> dispute_rank(std::string_view s) {
    return {stripe::dispute_order(s), s};
}

// An inquiry (warning_needs_response, warning_under_review, warning_closed) withdraws no money: it is
// recorded as the dispute's status but does not count as disputed money.
bool inquiry(std::string_view status) noexcept {
    const auto m = stripe::dispute_movement(status);
    return m == stripe::movement::inquiry || m == stripe::movement::inquiry_closed;
}

bool proves_success(fact_kind k) noexcept {
    return k == fact_kind::succeeded || k == fact_kind::refunded || k == fact_kind::refund_update ||
           k == fact_kind::dispute_opened || k == fact_kind::dispute_closed;
}

}  // namespace

// A PaymentIntent may make several charges (a retried attempt), so the same intent is enough; a charge,
// refund or dispute naming no intent reaches the row through its charge. An id the fact does not name
// proves nothing, and neither does metadata: a charge made by hand or by another integration may carry
// the row's billing_key.
payment_link link_payment(const settlement_row& row, const payment_fact& f) noexcept {
    if (row.stripe_account != f.account) return payment_link::other;
    if (!row.payment_intent_id && !row.charge_id) return payment_link::unproven;
    if (row.payment_intent_id && !f.payment_intent_id.empty())
        return *row.payment_intent_id == f.payment_intent_id ? payment_link::same : payment_link::other;
    if (row.charge_id && !f.charge_id.empty())
        return *row.charge_id == f.charge_id ? payment_link::same : payment_link::other;
    return payment_link::other;
}

std::string join_dispute_status(std::string_view a, std::string_view b) {
    return std::string(std::max(dispute_rank(a), dispute_rank(b)) == dispute_rank(a) ? a : b);
}

std::string describe_dispute(std::string_view status, std::int64_t disputed_cents) {
    const std::string st(status);
    const std::string cents = std::to_string(disputed_cents) + " cents";
    switch (stripe::dispute_movement(status)) {
        case stripe::movement::inquiry:
            return "an inquiry (" + st + "): no funds withdrawn";
        case stripe::movement::inquiry_closed:
            return "an inquiry closed without a dispute (" + st + "): no funds withdrawn";
        case stripe::movement::dispute_won:
            return "dispute won (" + st + "): the " + cents + " withdrawn came back";
        case stripe::movement::dispute_lost:
            return "dispute lost (" + st + "): " + cents + " gone";
        default:
            return "disputed (" + st + ", " + cents + " withdrawn)";
    }
}

settlement_change apply_fact(const settlement_row& row, const payment_fact& f) {
    settlement_change c;
    c.row = row;
    if (f.kind == fact_kind::unknown_type) {
        c.result = settle_result::unknown_type;
        c.note = "event type not acted on";
        return c;
    }
    const auto link = link_payment(row, f);
    if (link == payment_link::other) {
        c.result = settle_result::other_payment;
        c.note = row.stripe_account != f.account ? "comes from another Stripe account than the row's"
                                                 : "names another payment than the row's";
        return c;
    }
    // A pending row's ids are the pipeline's to record (Stripe's answer, or its recovery's search, under the
    // row's lease); the recorded fact is applied then, by those ids. A deferred fact also sends the row to
    // the sweeper's next sweep once no worker holds its lease (abandoned_sql::record_has_deferred_fact).
    if (row.status == record_status::pending) {
        c.result = settle_result::deferred;
        c.note = "row pending: applied once the pipeline settles it";
        return c;
    }
    if (link == payment_link::unproven) {
        c.result = settle_result::unconfirmed;
        c.note = "found by metadata only: the row holds no Stripe id to prove it";
        return c;
    }
    settlement_row& n = c.row;
    const bool payment_row = payment_rank(row.status) > 0;
    if (!payment_row) {
        // declined, failed, cap_blocked, conflict: the pipeline's verdicts. Only money that moved for a
        // declined row (an on-session intent the customer completed later) changes one.
        if (proves_success(f.kind) && row.status == record_status::declined) {
            c.anomaly = true;
            c.note = "Stripe reports money taken for a row recorded declined";
        } else {
            if (proves_success(f.kind)) {
                c.anomaly = true;
                c.note = std::string("Stripe reports money taken for a row recorded ") +
                         std::string(to_string(row.status));
            }
            c.result = settle_result::no_change;
            return c;
        }
    }
    // Ids the row lacks are filled from the fact (never overwritten: link_payment checked they agree).
    if (!n.payment_intent_id && !f.payment_intent_id.empty()) n.payment_intent_id = f.payment_intent_id;
    if (proves_success(f.kind) && !n.charge_id && !f.charge_id.empty()) n.charge_id = f.charge_id;
    if (proves_success(f.kind)) {
        if (n.charge_id) {
            if (row.status == record_status::failed_after_processing) {
                c.anomaly = true;
                c.note = "Stripe reports success after the failure was recorded";
            }
            n.status = record_status::charged;
        } else {
            c.note = "success without a charge id: the row stays as it is";
        }
    } else if (f.kind == fact_kind::failed) {
        if (row.status == record_status::processing) n.status = record_status::failed_after_processing;
    }
    if (f.kind == fact_kind::refunded)
        n.refunded_cents =
            std::max(n.refunded_cents, std::clamp<std::int64_t>(f.amount_refunded, 0, n.amount_cents));
    if (f.kind == fact_kind::dispute_opened || f.kind == fact_kind::dispute_closed) {
        if (!inquiry(f.status))
            n.disputed_cents =
                std::max(n.disputed_cents, std::clamp<std::int64_t>(f.dispute_amount, 0, n.amount_cents));
        std::string s =
            f.status.empty() ? (f.kind == fact_kind::dispute_closed ? "closed" : "needs_response") : f.status;
        n.dispute_status = join_dispute_status(n.dispute_status.value_or(""), s);
    }
    c.failed_now =
        row.status == record_status::processing && n.status == record_status::failed_after_processing;
    c.charged_now = row.status != record_status::charged && n.status == record_status::charged;
    c.result = n == row ? settle_result::no_change : settle_result::applied;
    return c;
}

}  // namespace cg::billing
