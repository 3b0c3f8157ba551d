// The pure edges of the pipeline: outcome → ledger step, requeue backoff, the Stripe request of an event.
#include "billing/machine/outcome.hpp"

#include <boost/test/unit_test.hpp>
#include <set>

#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "stripe/fact.hpp"

using namespace cg::billing;
using namespace std::chrono_literals;
using cg::billing::machine::found_command;
using cg::stripe::outcome_class;

BOOST_AUTO_TEST_SUITE(outcome)

namespace {
found_command found(const cg::stripe::payment_intent& pi) {
    return machine::on_found(machine::table::charge, cg::stripe::read(pi));
}
}  // namespace

// docs/design.md §4's CHARGE table, row by row.
BOOST_AUTO_TEST_CASE(outcome_to_ledger_step_table) {
    struct row {
        outcome_class in;
        charge_step want;
    };
    const row rows[] = {
        {outcome_class::succeeded, charge_step::mark_charged},
        {outcome_class::declined, charge_step::mark_declined},
        {outcome_class::cap_exceeded, charge_step::mark_cap_blocked},
        {outcome_class::idempotency_conflict, charge_step::mark_conflict_dead_letter},
        {outcome_class::retry_same_key, charge_step::release_requeue},
        {outcome_class::indeterminate, charge_step::mark_indeterminate_requeue},
        {outcome_class::rejected, charge_step::mark_failed_dead_letter},
        {outcome_class::setup_error, charge_step::setup_requeue},
    };
    for (const auto& r : rows)
        BOOST_TEST(to_string(step_for(r.in)) == to_string(r.want), cg::stripe::to_string(r.in));
}

BOOST_AUTO_TEST_CASE(backoff_doubles_per_attempt_and_caps) {
    backoff b{100ms, 1000ms};
    BOOST_TEST(backoff_delay(b, 0).count() == 100);
    BOOST_TEST(backoff_delay(b, 1).count() == 100);
    BOOST_TEST(backoff_delay(b, 2).count() == 200);
    BOOST_TEST(backoff_delay(b, 3).count() == 400);
    BOOST_TEST(backoff_delay(b, 4).count() == 800);
    BOOST_TEST(backoff_delay(b, 5).count() == 1000);
    BOOST_TEST(backoff_delay(b, 65535).count() == 1000);  // no overflow for NSQ's largest attempt count
    BOOST_TEST(backoff_delay({0ms, 0ms}, 3).count() == 0);
}

BOOST_AUTO_TEST_CASE(charge_request_carries_base_key_metadata_and_generation_key) {
    billing_event e;
    e.customer_id = "acme";
    e.billing_period = "2026-11";
    e.amount_cents = 1999;
    e.currency = "usd";
    e.stripe_customer_id = "cus_1";
    e.description = "plan";
    auto base = base_key("ns", "acme", "2026-11");
    auto g1 = build_charge_request(e, base, 1);
    BOOST_TEST(g1.idempotency_key == base);
    BOOST_TEST(g1.amount == 1999);
    BOOST_TEST(g1.currency == "usd");
    BOOST_TEST(g1.customer == "cus_1");
    BOOST_TEST(g1.description == "plan");
    BOOST_TEST(cg::stripe::metadata_value(g1.metadata, "billing_key").value_or("") == base);
    BOOST_TEST(cg::stripe::metadata_value(g1.metadata, "customer_id").value_or("") == "acme");
    BOOST_TEST(cg::stripe::metadata_value(g1.metadata, "billing_period").value_or("") == "2026-11");
    auto g3 = build_charge_request(e, base, 3);
    BOOST_TEST(g3.idempotency_key == base + "-g3");
    BOOST_TEST(cg::stripe::metadata_value(g3.metadata, "billing_key").value_or("") ==
               base);  // still the base
}

// An event with a payment_method becomes a confirmed PaymentIntent (off_session as the event says) with the
// same key and metadata a charge would carry; without one, a charge.
BOOST_AUTO_TEST_CASE(event_becomes_intent_or_charge_request) {
    billing_event e;
    e.customer_id = "acme";
    e.billing_period = "2026-12";
    e.amount_cents = 2500;
    e.currency = "eur";
    e.stripe_customer_id = "cus_2";
    auto base = base_key("ns", "acme", "2026-12");
    BOOST_TEST(std::holds_alternative<cg::stripe::charge_request>(build_request(e, base, 1)));

    e.payment_method = "pm_card_visa";
    auto req = build_request(e, base, 2);
    BOOST_REQUIRE(std::holds_alternative<cg::stripe::payment_intent_request>(req));
    const auto& pi = std::get<cg::stripe::payment_intent_request>(req);
    BOOST_TEST(pi.payment_method == "pm_card_visa");
    BOOST_TEST(pi.confirm);
    BOOST_TEST(pi.off_session);
    BOOST_TEST(pi.amount == 2500);
    BOOST_TEST(pi.currency == "eur");
    BOOST_TEST(pi.customer == "cus_2");
    BOOST_TEST(pi.idempotency_key == base + "-g2");
    BOOST_TEST(cg::stripe::metadata_value(pi.metadata, "billing_key").value_or("") == base);
    BOOST_TEST(cg::stripe::metadata_value(pi.metadata, "customer_id").value_or("") == "acme");
    BOOST_TEST(cg::stripe::metadata_value(pi.metadata, "billing_period").value_or("") == "2026-12");
    e.off_session = false;
    BOOST_TEST(!build_intent_request(e, base, 1).off_session);
}

// A PaymentIntent found by the recovery search, by status, as the money machine reads it for a ledger row
// (`none`: Stripe never tried the card, as if nothing carried the key).
BOOST_AUTO_TEST_CASE(found_intent_table) {
    struct row {
        std::string status;
        std::string latest_charge;
        found_command want;
    };
    const row rows[] = {
        {"succeeded", "ch_1", found_command::mark_charged},
        {"processing", "ch_1", found_command::mark_processing},
        {"requires_capture", "ch_1", found_command::mark_processing},
        {"succeeded", "", found_command::still_open},
        {"processing", "", found_command::mark_processing},
        {"requires_payment_method", "ch_1", found_command::mark_declined},
        {"requires_action", "", found_command::mark_declined},
        {"requires_confirmation", "", found_command::none},
        {"canceled", "", found_command::mark_declined},
        // A status the pinned API version does not define: the intent exists; never declined or recharged.
        {"requires_source", "", found_command::still_open},
    };
    // A bank debit whose attempt failed (last_payment_error.payment_method.type) failed after processing.
    {
        cg::stripe::payment_intent pi;
        pi.id = "pi_1";
        pi.status = "requires_payment_method";
        pi.latest_charge = "ch_1";
        pi.payment_method_type = "us_bank_account";
        BOOST_TEST((found(pi) == found_command::mark_processing));
        pi.payment_method_type = "card";
        BOOST_TEST((found(pi) == found_command::mark_declined));
    }
    for (const auto& r : rows) {
        cg::stripe::payment_intent pi;
        pi.id = "pi_1";
        pi.status = r.status;
        pi.latest_charge = r.latest_charge;
        BOOST_TEST_CONTEXT(r.status << " charge=" << r.latest_charge) {
            BOOST_TEST((found(pi) == r.want));
        }
    }
}

BOOST_AUTO_TEST_CASE(verdict_reasons_are_distinct_metric_labels) {
    std::set<std::string> seen;
    for (std::size_t i = 0; i < verdict_reason_count; ++i) {
        auto s = std::string(to_string(static_cast<verdict_reason>(i)));
        BOOST_TEST(s != "?");
        seen.insert(s);
    }
    BOOST_TEST(seen.size() == verdict_reason_count);
    BOOST_TEST(verdict::requeue(verdict_reason::requeued_postgres, 5ms).delay.count() == 5);
    BOOST_TEST(!verdict::requeue(verdict_reason::requeued_postgres, 5ms).finished());
    BOOST_TEST(verdict::finish(verdict_reason::charged).finished());
}

BOOST_AUTO_TEST_SUITE_END()

// A 2xx whose payment is still in flight (an intent processing or requires_capture, a charge pending) is
// never charged: the row goes processing.
BOOST_AUTO_TEST_CASE(in_flight_success_is_processing_not_charged) {
    cg::stripe::charge_outcome out;
    out.cls = outcome_class::succeeded;
    BOOST_TEST((step_for(out) == charge_step::mark_charged));
    for (const char* s : {"processing", "requires_capture", "pending"}) {
        out.in_flight_status = s;
        BOOST_TEST((step_for(out) == charge_step::mark_processing), s);
    }
    out.cls = outcome_class::declined;
    BOOST_TEST((step_for(out) == charge_step::mark_declined));
    BOOST_TEST(!cg::stripe::intent_succeeded("processing"));
    BOOST_TEST(cg::stripe::intent_in_flight("requires_capture"));
}
