// The settlement step (billing/machine/settlement.hpp): the expected row for every (state, fact), and the
// lattice laws over every ordering of the facts a payment can produce: the same facts in any order, any
// number of times, end in the same row; the payment rank and the amounts never go down.
#include "billing/machine/settlement.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <ostream>
#include <vector>

using namespace cg::billing;

namespace cg::billing {
std::ostream& operator<<(std::ostream& o, record_status s) {
    return o << to_string(s);
}
std::ostream& operator<<(std::ostream& o, fact_kind k) {
    return o << to_string(k);
}
std::ostream& operator<<(std::ostream& o, settle_result r) {
    return o << to_string(r);
}
std::ostream& operator<<(std::ostream& o, payment_link l) {
    return o << to_string(l);
}
}  // namespace cg::billing

namespace {

constexpr std::int64_t amount = 1999;

settlement_row row(record_status s) {
    settlement_row r;
    r.status = s;
    r.amount_cents = amount;
    r.payment_intent_id = "pi_1";
    if (s == record_status::charged) r.charge_id = "ch_1";
    return r;
}

payment_fact fact(fact_kind k, std::string status = {}) {
    payment_fact f;
    f.kind = k;
    f.source = std::string(to_string(k));
    f.payment_intent_id = "pi_1";
    f.charge_id = "ch_1";
    f.status = std::move(status);
    return f;
}

payment_fact refund(std::int64_t cumulative) {
    auto f = fact(fact_kind::refunded, "succeeded");
    f.amount_refunded = cumulative;
    return f;
}

payment_fact dispute(fact_kind k, std::string status, std::int64_t amt = amount) {
    auto f = fact(k, std::move(status));
    f.dispute_amount = amt;
    return f;
}

settlement_row fold(settlement_row r, const std::vector<payment_fact>& fs) {
    for (const auto& f : fs) r = apply_fact(r, f).row;
    return r;
}

int rank(record_status s) {
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

// Every fact a payment can produce, including duplicates' worth of variety: the pool the laws range over.
std::vector<payment_fact> pool() {
    return {fact(fact_kind::processing, "processing"),
            fact(fact_kind::succeeded, "succeeded"),
            fact(fact_kind::failed, "requires_payment_method"),
            refund(500),
            refund(amount),
            dispute(fact_kind::dispute_opened, "needs_response"),
            dispute(fact_kind::dispute_opened, "under_review"),
            dispute(fact_kind::dispute_closed, "won"),
            dispute(fact_kind::dispute_closed, "lost"),
            fact(fact_kind::no_news, "requires_action"),
            fact(fact_kind::unknown_type)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(event_types_map_to_facts) {
    BOOST_TEST(fact_kind_for_event("payment_intent.processing") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_event("payment_intent.succeeded") == fact_kind::succeeded);
    BOOST_TEST(fact_kind_for_event("charge.succeeded") == fact_kind::succeeded);
    BOOST_TEST(fact_kind_for_event("payment_intent.payment_failed") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("payment_intent.canceled") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("charge.failed") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_event("charge.refunded") == fact_kind::refunded);
    for (const char* t : {"refund.created", "refund.updated", "charge.refund.updated"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::refund_update, t);
    // Not an event type of the pinned API version: a refund's failure comes as refund.updated.
    BOOST_TEST(fact_kind_for_event("refund.failed") == fact_kind::unknown_type);
    for (const char* t :
         {"charge.dispute.created", "charge.dispute.updated", "charge.dispute.funds_withdrawn"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::dispute_opened, t);
    for (const char* t : {"charge.dispute.closed", "charge.dispute.funds_reinstated"})
        BOOST_TEST(fact_kind_for_event(t) == fact_kind::dispute_closed, t);
    BOOST_TEST(fact_kind_for_event("customer.created") == fact_kind::unknown_type);
    BOOST_TEST(fact_kind_for_intent_status("requires_capture") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_intent_status("requires_payment_method") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_intent_status("canceled") == fact_kind::failed);
    BOOST_TEST(fact_kind_for_intent_status("requires_action") == fact_kind::no_news);
    BOOST_TEST(fact_kind_for_charge_status("pending") == fact_kind::processing);
    BOOST_TEST(fact_kind_for_charge_status("failed") == fact_kind::failed);
}

BOOST_AUTO_TEST_CASE(parses_each_object_kind) {
    auto pi = parse_event_fact(
        R"({"id":"evt_1","object":"event","type":"payment_intent.payment_failed","created":1700000000,)"
        R"("data":{"object":{"id":"pi_9","object":"payment_intent","status":"requires_payment_method",)"
        R"("latest_charge":"ch_9","metadata":{"billing_key":"abc"},)"
        R"("last_payment_error":{"code":"insufficient_funds"}}}})");
    BOOST_TEST_REQUIRE(pi.has_value());
    BOOST_TEST(pi->kind == fact_kind::failed);
    BOOST_TEST(pi->payment_intent_id == "pi_9");
    BOOST_TEST(pi->charge_id == "ch_9");
    BOOST_TEST(pi->billing_key == "abc");
    BOOST_TEST(pi->failure == "insufficient_funds");
    BOOST_TEST(pi->created == 1700000000);
    auto ch = parse_event_fact(
        R"({"id":"evt_2","object":"event","type":"charge.refunded","created":1,"data":{"object":{"id":"ch_9",)"
        R"("object":"charge","status":"succeeded","payment_intent":{"id":"pi_9"},"amount_refunded":700}}})");
    BOOST_TEST_REQUIRE(ch.has_value());
    BOOST_TEST(ch->kind == fact_kind::refunded);
    BOOST_TEST(ch->charge_id == "ch_9");
    BOOST_TEST(ch->payment_intent_id == "pi_9");
    BOOST_TEST(ch->amount_refunded == 700);
    auto dp = parse_event_fact(
        R"({"id":"evt_3","object":"event","type":"charge.dispute.closed","created":1,"data":{"object":{)"
        R"("id":"dp_1","object":"dispute","charge":"ch_9","payment_intent":null,"amount":300,"status":"lost"}}})");
    BOOST_TEST_REQUIRE(dp.has_value());
    BOOST_TEST(dp->kind == fact_kind::dispute_closed);
    BOOST_TEST(dp->charge_id == "ch_9");
    BOOST_TEST(dp->payment_intent_id.empty());
    BOOST_TEST(dp->dispute_amount == 300);
    BOOST_TEST(dp->status == "lost");
    auto re = parse_event_fact(
        R"({"id":"evt_4","object":"event","type":"refund.updated","created":5,"data":{"object":{"id":"re_1",)"
        R"("object":"refund","amount":400,"charge":"ch_9","payment_intent":"pi_9","status":"failed",)"
        R"("failure_reason":"lost_or_stolen_card","metadata":{}}}})");
    BOOST_TEST_REQUIRE(re.has_value());
    BOOST_TEST(re->kind == fact_kind::refund_update);
    BOOST_TEST(re->refund_id == "re_1");
    BOOST_TEST(re->refund_amount == 400);
    BOOST_TEST(re->charge_id == "ch_9");
    BOOST_TEST(re->payment_intent_id == "pi_9");
    BOOST_TEST(re->status == "failed");
    BOOST_TEST(re->failure == "lost_or_stolen_card");
    // A refund event proves the charge went through, and moves no amount itself (the store sums refunds).
    settlement_row processing_row;
    processing_row.status = record_status::processing;
    processing_row.amount_cents = 1000;
    processing_row.payment_intent_id = "pi_9";
    auto proved = apply_fact(processing_row, *re);
    BOOST_TEST(proved.row.status == record_status::charged);
    BOOST_TEST(proved.row.refunded_cents == 0);
    // A refund without its id, or naming no payment, cannot be counted once: refused.
    BOOST_TEST(!parse_event_fact(
        R"({"type":"refund.created","data":{"object":{"object":"refund","amount":1,"charge":"ch_9"}}})"));
    BOOST_TEST(
        !parse_event_fact(R"({"type":"refund.created","data":{"object":{"id":"re_2","object":"refund"}}})"));
    // A type we act on with another object is a different API shape: refused, not guessed at.
    BOOST_TEST(!parse_event_fact(R"({"type":"charge.refunded","data":{"object":{"object":"customer"}}})"));
    BOOST_TEST(!parse_event_fact("not json"));
    auto other = parse_event_fact(R"({"type":"customer.created","data":{"object":{"object":"customer"}}})");
    BOOST_TEST_REQUIRE(other.has_value());
    BOOST_TEST(other->kind == fact_kind::unknown_type);
}

BOOST_AUTO_TEST_CASE(table_from_processing) {
    auto p = row(record_status::processing);
    auto s = apply_fact(p, fact(fact_kind::succeeded, "succeeded"));
    BOOST_TEST(s.result == settle_result::applied);
    BOOST_TEST(s.row.status == record_status::charged);
    BOOST_TEST(*s.row.charge_id == "ch_1");
    BOOST_TEST(s.charged_now);
    BOOST_TEST(!s.failed_now);

    auto f = apply_fact(p, fact(fact_kind::failed, "requires_payment_method"));
    BOOST_TEST(f.row.status == record_status::failed_after_processing);
    BOOST_TEST(f.failed_now);
    BOOST_TEST(!f.row.charge_id);  // a failed debit leaves no charge behind on the row

    auto dup = apply_fact(p, fact(fact_kind::processing, "processing"));
    BOOST_TEST(dup.result == settle_result::no_change);
    BOOST_TEST((dup.row == p));

    // A refund or a dispute proves the charge went through.
    auto r = apply_fact(p, refund(500));
    BOOST_TEST(r.row.status == record_status::charged);
    BOOST_TEST(r.row.refunded_cents == 500);
    auto d = apply_fact(p, dispute(fact_kind::dispute_opened, "needs_response"));
    BOOST_TEST(d.row.status == record_status::charged);
    BOOST_TEST(d.row.disputed_cents == amount);
    BOOST_TEST(*d.row.dispute_status == "needs_response");

    auto u = apply_fact(p, fact(fact_kind::unknown_type));
    BOOST_TEST(u.result == settle_result::unknown_type);
    BOOST_TEST((u.row == p));
    auto n = apply_fact(p, fact(fact_kind::no_news, "requires_action"));
    BOOST_TEST(n.result == settle_result::no_change);
}

BOOST_AUTO_TEST_CASE(final_facts_are_not_undone) {
    auto failed = fold(row(record_status::processing), {fact(fact_kind::failed, "requires_payment_method")});
    // A stale processing (Stripe's retry of an older event) neither reopens nor moves a failure.
    auto stale = apply_fact(failed, fact(fact_kind::processing, "processing"));
    BOOST_TEST(stale.result == settle_result::no_change);
    BOOST_TEST(stale.row.status == record_status::failed_after_processing);
    // A second failure report writes no second dead letter.
    BOOST_TEST(!apply_fact(failed, fact(fact_kind::failed, "canceled")).failed_now);

    auto charged = row(record_status::charged);
    for (auto k : {fact_kind::processing, fact_kind::failed}) {
        auto c = apply_fact(charged, fact(k, "processing"));
        BOOST_TEST(c.result == settle_result::no_change);
        BOOST_TEST(c.row.status == record_status::charged);
    }
    // A success after the failure was recorded: money moved; the ledger records it and says so.
    auto late = apply_fact(failed, fact(fact_kind::succeeded, "succeeded"));
    BOOST_TEST(late.row.status == record_status::charged);
    BOOST_TEST(late.anomaly);
}

BOOST_AUTO_TEST_CASE(refunds_partial_full_and_only_growing) {
    auto c = row(record_status::charged);
    auto partial = apply_fact(c, refund(500));
    BOOST_TEST(partial.result == settle_result::applied);
    BOOST_TEST(partial.row.refunded_cents == 500);
    BOOST_TEST(partial.row.status == record_status::charged);
    auto full = apply_fact(partial.row, refund(amount));
    BOOST_TEST(full.row.refunded_cents == amount);
    // The partial refund's event replayed after the full one: the amount only grows.
    auto replay = apply_fact(full.row, refund(500));
    BOOST_TEST(replay.result == settle_result::no_change);
    BOOST_TEST(replay.row.refunded_cents == amount);
    // Never more than the amount charged, whatever the event says.
    BOOST_TEST(apply_fact(c, refund(amount * 3)).row.refunded_cents == amount);
    // succeeded replayed after a refund: still charged, the refund kept.
    auto again = apply_fact(full.row, fact(fact_kind::succeeded, "succeeded"));
    BOOST_TEST(again.result == settle_result::no_change);
    BOOST_TEST(again.row.refunded_cents == amount);
}

BOOST_AUTO_TEST_CASE(disputes_created_and_closed_in_either_order) {
    auto c = row(record_status::charged);
    auto opened = dispute(fact_kind::dispute_opened, "needs_response");
    for (const char* end : {"won", "lost"}) {
        auto closed = dispute(fact_kind::dispute_closed, end);
        auto a = fold(c, {opened, closed});
        auto b = fold(c, {closed, opened});
        BOOST_TEST((a == b));
        BOOST_TEST(*a.dispute_status == end);
        BOOST_TEST(a.disputed_cents == amount);
        BOOST_TEST(a.status == record_status::charged);
    }
    BOOST_TEST(join_dispute_status("won", "lost") == "lost");
    BOOST_TEST(join_dispute_status("lost", "won") == "lost");
    BOOST_TEST(join_dispute_status("", "under_review") == "under_review");
    BOOST_TEST(join_dispute_status("under_review", "needs_response") == "under_review");
    // An inquiry escalated into a chargeback stays one whatever order the events come in.
    BOOST_TEST(join_dispute_status("needs_response", "warning_needs_response") == "needs_response");
    BOOST_TEST(join_dispute_status("warning_under_review", "needs_response") == "needs_response");
    BOOST_TEST(join_dispute_status("warning_needs_response", "warning_closed") == "warning_closed");
    BOOST_TEST(join_dispute_status("warning_closed", "won") == "won");
}

// explain's words for a charged row's dispute: an inquiry is not called disputed and names no amount
// withdrawn; a chargeback names its status and the amount, and how it ended.
BOOST_AUTO_TEST_CASE(an_inquiry_is_not_described_as_disputed) {
    for (const char* s : {"warning_needs_response", "warning_under_review", "warning_closed"}) {
        auto d = describe_dispute(s, 0);
        BOOST_TEST(d.find("inquiry") != std::string::npos, d);
        BOOST_TEST(d.find("disputed") == std::string::npos, d);
        BOOST_TEST(d.find("no funds withdrawn") != std::string::npos, d);
        BOOST_TEST(d.find(s) != std::string::npos, d);
    }
    BOOST_TEST(describe_dispute("warning_closed", 0).find("closed without a dispute") != std::string::npos);
    BOOST_TEST(describe_dispute("needs_response", 3000) == "disputed (needs_response, 3000 cents withdrawn)");
    BOOST_TEST(describe_dispute("under_review", 3000) == "disputed (under_review, 3000 cents withdrawn)");
    BOOST_TEST(describe_dispute("won", 3000) == "dispute won (won): the 3000 cents withdrawn came back");
    BOOST_TEST(describe_dispute("lost", 3000) == "dispute lost (lost): 3000 cents gone");
    // A status the pinned version does not define (or the receiver's "closed" for a status-less close).
    BOOST_TEST(describe_dispute("closed", 3000) == "disputed (closed, 3000 cents withdrawn)");
}

// charge.dispute.updated records under_review; an inquiry (warning_*) is recorded as the dispute's status
// but moves no disputed money, until it escalates into a chargeback.
BOOST_AUTO_TEST_CASE(under_review_is_recorded_and_an_inquiry_is_not_disputed_money) {
    auto c = row(record_status::charged);
    auto review = apply_fact(c, dispute(fact_kind_for_event("charge.dispute.updated"), "under_review"));
    BOOST_TEST(review.result == settle_result::applied);
    BOOST_TEST(*review.row.dispute_status == "under_review");
    BOOST_TEST(review.row.disputed_cents == amount);

    auto asked = dispute(fact_kind::dispute_opened, "warning_needs_response");
    auto reviewed = dispute(fact_kind::dispute_opened, "warning_under_review");
    auto closed = dispute(fact_kind::dispute_closed, "warning_closed");
    auto inquiry = fold(c, {asked, reviewed, closed});
    BOOST_TEST(*inquiry.dispute_status == "warning_closed");
    BOOST_TEST(inquiry.disputed_cents == 0);
    BOOST_TEST((fold(c, {closed, asked, reviewed}) == inquiry));

    auto escalated = dispute(fact_kind::dispute_opened, "needs_response");
    auto a = fold(c, {asked, escalated});
    BOOST_TEST(*a.dispute_status == "needs_response");
    BOOST_TEST(a.disputed_cents == amount);
    BOOST_TEST((fold(c, {escalated, asked}) == a));
}

BOOST_AUTO_TEST_CASE(pending_rows_defer_and_other_payments_are_ignored) {
    auto pending = row(record_status::pending);
    for (const auto& f : pool()) {
        auto c = apply_fact(pending, f);
        BOOST_TEST((c.row == pending));
        if (f.kind != fact_kind::unknown_type) BOOST_TEST(c.result == settle_result::deferred);
    }
    // An event of an earlier attempt (the replay charges under a new key, so a new PaymentIntent).
    auto p = row(record_status::processing);
    auto old = fact(fact_kind::failed, "requires_payment_method");
    old.payment_intent_id = "pi_0";
    auto c = apply_fact(p, old);
    BOOST_TEST(c.result == settle_result::other_payment);
    BOOST_TEST((c.row == p));
    // Matched by charge when the row has no intent (a /v1/charges payment left pending).
    settlement_row by_charge = p;
    by_charge.payment_intent_id.reset();
    by_charge.charge_id = "ch_1";
    auto other_charge = fact(fact_kind::succeeded, "succeeded");
    other_charge.payment_intent_id.clear();
    other_charge.charge_id = "ch_2";
    BOOST_TEST(apply_fact(by_charge, other_charge).result == settle_result::other_payment);
    other_charge.charge_id = "ch_1";
    BOOST_TEST(apply_fact(by_charge, other_charge).row.status == record_status::charged);
}

BOOST_AUTO_TEST_CASE(pipeline_verdicts_move_only_when_money_moved) {
    for (auto s : {record_status::declined, record_status::failed, record_status::cap_blocked,
                   record_status::conflict}) {
        for (const auto& f : pool()) {
            auto c = apply_fact(row(s), f);
            bool success = f.kind == fact_kind::succeeded || f.kind == fact_kind::refunded ||
                           f.kind == fact_kind::dispute_opened || f.kind == fact_kind::dispute_closed;
            if (s == record_status::declined && success) {
                BOOST_TEST(c.row.status == record_status::charged);
                BOOST_TEST(c.anomaly);
            } else {
                BOOST_TEST(c.row.status == s);
                BOOST_TEST(c.anomaly == success);
            }
        }
    }
}

// The laws, over every ordered pair and every permutation of every triple of the pool, from each state a
// webhook acts on: the end row does not depend on the order; applying a fact twice is applying it once;
// the payment rank and the amounts never decrease along the way.
BOOST_AUTO_TEST_CASE(order_independent_idempotent_monotonic) {
    const auto facts = pool();
    const std::size_t n = facts.size();
    std::size_t checked = 0;
    for (auto start : {record_status::processing, record_status::charged,
                       record_status::failed_after_processing, record_status::declined}) {
        auto s0 = row(start);
        if (start == record_status::failed_after_processing) s0.charge_id.reset();
        for (std::size_t i = 0; i < n; ++i) {
            auto once = apply_fact(s0, facts[i]).row;
            BOOST_TEST((apply_fact(once, facts[i]).row == once), "idempotent: " << facts[i].source);
            for (std::size_t j = 0; j < n; ++j) {
                BOOST_TEST((fold(s0, {facts[i], facts[j]}) == fold(s0, {facts[j], facts[i]})),
                           facts[i].source << "/" << facts[i].status << " vs " << facts[j].source << "/"
                                           << facts[j].status);
                for (std::size_t k = 0; k < n; ++k) {
                    std::vector<std::size_t> idx{i, j, k};
                    std::sort(idx.begin(), idx.end());
                    const auto first = fold(s0, {facts[idx[0]], facts[idx[1]], facts[idx[2]]});
                    do {
                        settlement_row r = s0;
                        for (auto x : idx) {
                            auto next = apply_fact(r, facts[x]).row;
                            BOOST_TEST(rank(next.status) >= rank(r.status));
                            BOOST_TEST(next.refunded_cents >= r.refunded_cents);
                            BOOST_TEST(next.disputed_cents >= r.disputed_cents);
                            r = next;
                        }
                        BOOST_TEST((r == first));
                        ++checked;
                    } while (std::next_permutation(idx.begin(), idx.end()));
                }
            }
        }
    }
    BOOST_TEST(checked > 4000u);
}

// The orders the issue names, end to end through the step.
BOOST_AUTO_TEST_CASE(named_orders) {
    auto p = row(record_status::processing);
    // payment_failed before processing.
    auto a = fold(
        p, {fact(fact_kind::failed, "requires_payment_method"), fact(fact_kind::processing, "processing")});
    BOOST_TEST(a.status == record_status::failed_after_processing);
    // succeeded replayed after a refund.
    auto b = fold(p, {fact(fact_kind::succeeded, "succeeded"), refund(amount),
                      fact(fact_kind::succeeded, "succeeded")});
    BOOST_TEST(b.status == record_status::charged);
    BOOST_TEST(b.refunded_cents == amount);
    // Duplicates of everything.
    auto c = fold(p, {fact(fact_kind::processing), fact(fact_kind::processing), fact(fact_kind::succeeded),
                      fact(fact_kind::succeeded)});
    BOOST_TEST(c.status == record_status::charged);
    // Canceled (an authorisation that lapsed).
    auto d = fold(p, {fact(fact_kind::failed, "canceled")});
    BOOST_TEST(d.status == record_status::failed_after_processing);
}

namespace {

// "" none, "mine" the row's own id, "theirs" another of the same kind.
std::optional<std::string> row_id(std::string_view which, std::string_view mine) {
    if (which.empty()) return std::nullopt;
    return std::string(which == "mine" ? mine : std::string_view("x_other"));
}
std::string fact_id(std::string_view which, std::string_view mine) {
    if (which.empty()) return {};
    return std::string(which == "mine" ? mine : (mine.starts_with("pi_") ? "pi_other" : "ch_other"));
}

}  // namespace

// Every pairing of the ids a row may hold (none, its PaymentIntent, its charge, both) with the ids a fact
// may link (none, the row's, another, for the intent and the charge), in one account: metadata is never
// among them, so a row without ids is only ever `unproven`.
BOOST_AUTO_TEST_CASE(link_payment_every_pairing_of_ids) {
    struct row_case {
        const char* pi;
        const char* ch;
        const char* fpi;
        const char* fch;
        payment_link want;
    };
    using L = payment_link;
    const row_case table[] = {
        // The row holds its PaymentIntent only (processing: the bank has not answered).
        {"mine", "", "", "", L::other},
        {"mine", "", "", "mine", L::other},  // a charge naming no intent: not one of this intent's
        {"mine", "", "", "theirs", L::other},
        {"mine", "", "mine", "", L::same},
        {"mine", "", "mine", "mine", L::same},
        {"mine", "", "mine", "theirs", L::same},  // another attempt of the same intent
        {"mine", "", "theirs", "", L::other},
        {"mine", "", "theirs", "mine", L::other},
        {"mine", "", "theirs", "theirs", L::other},
        // The row holds its charge only (a /v1/charges payment).
        {"", "mine", "", "", L::other},
        {"", "mine", "", "mine", L::same},
        {"", "mine", "", "theirs", L::other},
        {"", "mine", "mine", "", L::other},  // an intent the row never named, no charge linked
        {"", "mine", "mine", "mine", L::same},
        {"", "mine", "mine", "theirs", L::other},
        {"", "mine", "theirs", "", L::other},
        {"", "mine", "theirs", "mine", L::same},
        {"", "mine", "theirs", "theirs", L::other},
        // Both (charged).
        {"mine", "mine", "", "", L::other},
        {"mine", "mine", "", "mine", L::same},  // a dispute or refund naming the charge only
        {"mine", "mine", "", "theirs", L::other},
        {"mine", "mine", "mine", "", L::same},
        {"mine", "mine", "mine", "mine", L::same},
        {"mine", "mine", "mine", "theirs", L::same},
        {"mine", "mine", "theirs", "", L::other},
        {"mine", "mine", "theirs", "mine", L::other},
        {"mine", "mine", "theirs", "theirs", L::other},
        // Neither: only metadata can have found the row.
        {"", "", "", "", L::unproven},
        {"", "", "", "mine", L::unproven},
        {"", "", "", "theirs", L::unproven},
        {"", "", "mine", "", L::unproven},
        {"", "", "mine", "mine", L::unproven},
        {"", "", "mine", "theirs", L::unproven},
        {"", "", "theirs", "", L::unproven},
        {"", "", "theirs", "mine", L::unproven},
        {"", "", "theirs", "theirs", L::unproven},
    };
    // The accounts: (row, fact). Equal ones keep the table's answer; different ones are always `other`.
    const std::pair<const char*, const char*> accounts[] = {
        {"", ""}, {"acct_A", "acct_A"}, {"", "acct_A"}, {"acct_A", ""}, {"acct_A", "acct_B"}};
    for (const auto& t : table) {
        for (const auto& [ra, fa] : accounts) {
            settlement_row r = row(record_status::processing);
            r.payment_intent_id = row_id(t.pi, "pi_1");
            r.charge_id = row_id(t.ch, "ch_1");
            r.stripe_account = ra;
            auto f = fact(fact_kind::failed, "failed");
            f.payment_intent_id = fact_id(t.fpi, "pi_1");
            f.charge_id = fact_id(t.fch, "ch_1");
            f.billing_key = "the-rows-key";  // metadata: proves nothing
            f.account = fa;
            const auto want = std::string_view(ra) == fa ? t.want : L::other;
            BOOST_TEST(link_payment(r, f) == want, "row " << t.pi << "/" << t.ch << "@" << ra << " fact "
                                                          << t.fpi << "/" << t.fch << "@" << fa);
            // The step follows the link: only `same` moves a processing row.
            auto c = apply_fact(r, f);
            if (want == L::same) {
                BOOST_TEST(c.row.status == record_status::failed_after_processing);
            } else {
                BOOST_TEST((c.row == r));
                BOOST_TEST(!c.failed_now);
                BOOST_TEST(c.result ==
                           (want == L::other ? settle_result::other_payment : settle_result::unconfirmed));
            }
        }
    }
}

// The two cases seen on a shared Stripe account: a charge made outside chargeguard that carries the row's
// billing_key, with no PaymentIntent (a charge made by hand) or another one (a second integration).
BOOST_AUTO_TEST_CASE(a_foreign_charge_carrying_the_rows_metadata_moves_nothing) {
    auto p = row(record_status::processing);  // pi_1, no charge yet
    for (const std::string foreign_pi : {"", "pi_foreign"}) {
        auto failed = fact(fact_kind::failed, "failed");
        failed.source = "charge.failed";
        failed.payment_intent_id = foreign_pi;
        failed.charge_id = "ch_foreign";
        failed.billing_key = "the-rows-key";
        auto c = apply_fact(p, failed);
        BOOST_TEST(c.result == settle_result::other_payment);
        BOOST_TEST(!c.failed_now);
        BOOST_TEST((c.row == p));

        auto succeeded = failed;
        succeeded.kind = fact_kind::succeeded;
        succeeded.source = "charge.succeeded";
        succeeded.status = "succeeded";
        c = apply_fact(p, succeeded);
        BOOST_TEST(c.result == settle_result::other_payment);
        BOOST_TEST(!c.charged_now);
        BOOST_TEST(!c.row.charge_id.has_value());
        // The row's own failure afterwards still applies.
        auto own = fold(p, {succeeded, fact(fact_kind::failed, "requires_payment_method")});
        BOOST_TEST(own.status == record_status::failed_after_processing);
    }
    // A row holding no Stripe id yet: pending defers (the pipeline records the ids, then applies by them);
    // any other state is never moved on metadata.
    settlement_row bare = row(record_status::pending);
    bare.payment_intent_id.reset();
    auto s = fact(fact_kind::succeeded, "succeeded");
    BOOST_TEST(apply_fact(bare, s).result == settle_result::deferred);
    bare.status = record_status::declined;
    auto c = apply_fact(bare, s);
    BOOST_TEST(c.result == settle_result::unconfirmed);
    BOOST_TEST((c.row == bare));
    BOOST_TEST(!c.anomaly);
}

BOOST_AUTO_TEST_CASE(the_events_account_is_read) {
    auto f = parse_event_fact(
        R"({"id":"evt_1","object":"event","type":"charge.failed","created":1700000000,"account":"acct_X",)"
        R"("data":{"object":{"id":"ch_9","object":"charge","payment_intent":"pi_9","status":"failed"}}})");
    BOOST_TEST_REQUIRE(f.has_value());
    BOOST_TEST(f->account == "acct_X");
    auto platform = parse_event_fact(
        R"({"id":"evt_2","object":"event","type":"charge.failed","created":1700000000,)"
        R"("data":{"object":{"id":"ch_9","object":"charge","payment_intent":"pi_9","status":"failed"}}})");
    BOOST_TEST_REQUIRE(platform.has_value());
    BOOST_TEST(platform->account.empty());
}
