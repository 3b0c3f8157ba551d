// The one reading of Stripe (stripe/fact.hpp), against every status API 2024-06-20 defines for charges,
// PaymentIntents, refunds and disputes and the payment_method_details.type values of bank debits. Each run
// prints the verdict table with its reasons (--log_level=message), the table docs/testing.md keeps.
#include "stripe/fact.hpp"

#include <boost/test/unit_test.hpp>
#include <iterator>
#include <sstream>
#include <string>

#include "stripe/json.hpp"

using namespace cg::stripe;

namespace {

struct fact_row {
    object_kind object;
    std::string status;
    movement want;
    bool final;
};

// Every status of the pinned version, and what money it says moved.
const fact_row fact_rows[] = {
    {object_kind::charge, "succeeded", movement::charged, true},
    {object_kind::charge, "pending", movement::in_flight, false},
    {object_kind::charge, "failed", movement::failed, true},
    {object_kind::payment_intent, "succeeded", movement::charged, true},
    {object_kind::payment_intent, "processing", movement::in_flight, false},
    {object_kind::payment_intent, "requires_capture", movement::authorised, false},
    {object_kind::payment_intent, "requires_payment_method", movement::failed, false},
    {object_kind::payment_intent, "requires_action", movement::needs_customer, false},
    {object_kind::payment_intent, "requires_confirmation", movement::not_tried, false},
    {object_kind::payment_intent, "canceled", movement::canceled, true},
    {object_kind::refund, "pending", movement::refund_pending, false},
    {object_kind::refund, "requires_action", movement::refund_pending, false},
    {object_kind::refund, "succeeded", movement::refunded, false},
    {object_kind::refund, "failed", movement::refund_undone, true},
    {object_kind::refund, "canceled", movement::refund_undone, true},
    {object_kind::dispute, "warning_needs_response", movement::inquiry, false},
    {object_kind::dispute, "warning_under_review", movement::inquiry, false},
    {object_kind::dispute, "warning_closed", movement::inquiry_closed, true},
    {object_kind::dispute, "needs_response", movement::disputed, false},
    {object_kind::dispute, "under_review", movement::disputed, false},
    {object_kind::dispute, "won", movement::dispute_won, true},
    {object_kind::dispute, "lost", movement::dispute_lost, true},
    // Not in the pinned version (or a typo): never read as moved or not moved.
    {object_kind::charge, "refunded", movement::unknown, false},
    {object_kind::payment_intent, "requires_source", movement::unknown, false},
    {object_kind::refund, "", movement::unknown, false},
    {object_kind::dispute, "charge_refunded", movement::unknown, false},
};

fact read_row(const fact_row& r) {
    switch (r.object) {
        case object_kind::charge: {
            charge c;
            c.id = "ch_1";
            c.payment_intent = "pi_1";
            c.status = r.status;
            c.amount = 1999;
            c.currency = "usd";
            c.payment_method_type = "card";
            return read(c, "acct_1A");
        }
        case object_kind::payment_intent: {
            payment_intent p;
            p.id = "pi_1";
            p.latest_charge = "ch_1";
            p.status = r.status;
            p.amount = 1999;
            p.currency = "usd";
            return read(p, "acct_1A");
        }
        case object_kind::refund: {
            refund x;
            x.id = "re_1";
            x.charge = "ch_1";
            x.payment_intent = "pi_1";
            x.status = r.status;
            x.amount = 500;
            x.currency = "usd";
            return read(x, "acct_1A");
        }
        case object_kind::dispute: {
            dispute d;
            d.id = "dp_1";
            d.charge = "ch_1";
            d.payment_intent = "pi_1";
            d.status = r.status;
            d.amount = 1999;
            d.currency = "usd";
            return read(d, "acct_1A");
        }
    }
    return {};
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_status_of_the_pinned_version_has_one_reading_and_a_reason) {
    std::ostringstream table;
    table << "| object | status | moved | final | reason |\n|---|---|---|---|---|\n";
    for (const auto& r : fact_rows) {
        auto f = read_row(r);
        BOOST_TEST_CONTEXT(to_string(r.object) << " " << r.status) {
            BOOST_TEST((f.object == r.object));
            BOOST_TEST(to_string(f.moved) == to_string(r.want));
            BOOST_TEST(f.final == r.final);
            BOOST_TEST(f.status == r.status);
            BOOST_TEST(!f.reason.empty());
            // The linked ids and the account travel with the fact.
            BOOST_TEST(f.charge_id == "ch_1");
            BOOST_TEST(f.payment_intent_id == "pi_1");
            BOOST_TEST(f.account == "acct_1A");
            if (r.want == movement::unknown)
                BOOST_TEST(f.reason.find("not one API 2024-06-20") != std::string::npos);
        }
        table << "| " << to_string(r.object) << " | `" << r.status << "` | " << to_string(f.moved) << " | "
              << (f.final ? "yes" : "no") << " | " << f.reason << " |\n";
    }
    BOOST_TEST_MESSAGE("\n" << table.str());
}

// The status-level readings the other modules use agree with the object readings.
BOOST_AUTO_TEST_CASE(status_helpers_are_the_fact_s_readings) {
    BOOST_TEST(intent_succeeded("succeeded"));
    BOOST_TEST(!intent_succeeded("processing"));
    BOOST_TEST(intent_in_flight("processing"));
    BOOST_TEST(intent_in_flight("requires_capture"));
    BOOST_TEST(!intent_in_flight("requires_action"));
    BOOST_TEST(charge_in_flight("pending"));
    BOOST_TEST(!charge_in_flight("failed"));
    BOOST_TEST(refund_undone("failed"));
    BOOST_TEST(refund_undone("canceled"));
    BOOST_TEST(!refund_undone("succeeded"));
    BOOST_TEST(!refund_undone("pending"));
    // What a spend cap keeps counting: money moved or that may move without a new request.
    for (auto m : {movement::charged, movement::in_flight, movement::authorised, movement::needs_customer,
                   movement::not_tried, movement::unknown})
        BOOST_TEST(money_may_move(m), to_string(m));
    for (auto m : {movement::failed, movement::canceled}) BOOST_TEST(!money_may_move(m), to_string(m));
}

// The order a dispute passes its statuses: an inquiry before the chargeback it may become, a decision after
// the review, a loss over a win; a status the version does not define below every defined one.
BOOST_AUTO_TEST_CASE(dispute_statuses_in_the_order_a_dispute_passes_them) {
    const char* order[] = {"warning_needs_response",
                           "warning_under_review",
                           "warning_closed",
                           "needs_response",
                           "under_review",
                           "won",
                           "lost"};
    BOOST_TEST(dispute_order("") == 0);
    BOOST_TEST(dispute_order("charge_refunded") == 1);
    BOOST_TEST(dispute_order("charge_refunded") < dispute_order(order[0]));
    for (std::size_t i = 1; i < std::size(order); ++i)
        BOOST_TEST(dispute_order(order[i - 1]) < dispute_order(order[i]), order[i - 1] << " < " << order[i]);
}

// payment_method_details.type: which methods settle later (a failed one failed after processing).
BOOST_AUTO_TEST_CASE(bank_debits_by_payment_method_type) {
    struct row {
        const char* type;
        bool debit;
        const char* why;
    };
    const row rows[] = {
        {"ach_debit", true, "an ACH debit made through /v1/charges with a bank account source"},
        {"us_bank_account", true, "an ACH debit through a PaymentMethod"},
        {"sepa_debit", true, "SEPA Direct Debit: the bank may return it for days"},
        {"bacs_debit", true, "Bacs Direct Debit: about three business days"},
        {"acss_debit", true, "Canadian pre-authorized debit"},
        {"au_becs_debit", true, "BECS Direct Debit"},
        {"nz_bank_account", true, "New Zealand BECS Direct Debit"},
        {"card", false, "a card: the charge succeeds or fails at once"},
        {"link", false, "Link: a card or an instant bank payment, settled when the charge succeeds"},
        {"card_present", false, "in person: at once"},
        {"ideal", false, "a bank redirect: at once"},
        {"", false, "no payment_method_details"},
    };
    std::ostringstream table;
    table << "| payment_method_details.type | bank debit | why |\n|---|---|---|\n";
    for (const auto& r : rows) {
        BOOST_TEST(bank_debit_type(r.type) == r.debit, r.type);
        BOOST_TEST(bank_debit(r.type) == r.debit, r.type);
        table << "| `" << r.type << "` | " << (r.debit ? "yes" : "no") << " | " << r.why << " |\n";
        charge c;
        c.id = "ch_1";
        c.status = "failed";
        c.failure_code = "debit_not_authorized";
        c.payment_method_type = r.type;
        auto f = read(c);
        BOOST_TEST(f.bank_debit == r.debit, r.type);
        BOOST_TEST((f.moved == movement::failed));
        BOOST_TEST((f.reason.find("after processing") != std::string::npos) == r.debit, f.reason);
        BOOST_TEST(f.reason.find("debit_not_authorized") != std::string::npos);
    }
    BOOST_TEST_MESSAGE("\n" << table.str());
}

// A PaymentIntent whose debit failed after processing says which method failed in last_payment_error: the
// fact reads it as a bank debit's failure, not a decline.
BOOST_AUTO_TEST_CASE(an_intent_names_the_method_of_its_failed_attempt) {
    auto p = parse_payment_intent(
        R"({"id":"pi_1","object":"payment_intent","status":"requires_payment_method","latest_charge":"ch_1",)"
        R"("last_payment_error":{"code":"insufficient_funds","payment_method":{"id":"pm_1","type":"us_bank_account"}}})");
    BOOST_TEST_REQUIRE(static_cast<bool>(p));
    BOOST_TEST(p->payment_method_type == "us_bank_account");
    auto f = read(*p);
    BOOST_TEST(f.bank_debit);
    BOOST_TEST((f.moved == movement::failed));
    BOOST_TEST(f.reason.find("after processing") != std::string::npos, f.reason);
    auto card = parse_payment_intent(
        R"({"id":"pi_2","object":"payment_intent","status":"requires_payment_method",)"
        R"("last_payment_error":{"code":"card_declined","payment_method":{"id":"pm_2","type":"card"}}})");
    BOOST_TEST_REQUIRE(static_cast<bool>(card));
    BOOST_TEST(!read(*card).bank_debit);
}
