// The settlement step (billing/machine/settlement.hpp): the expected row for every (state, fact), and the
// lattice laws over every ordering of the facts a payment can produce: the same facts in any order, any
// number of times, end in the same row; the payment rank and the amounts never go down.
#include "billing/machine/settlement.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <vector>

#include "settlement_support.hpp"

using namespace cg::billing;

namespace {

using namespace cg::test::settlement_support;

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
