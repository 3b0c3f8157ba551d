// Corrections in the event format and their keys (docs/design.md §4a). Pure.
#include <boost/test/unit_test.hpp>

#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/report/expected_run.hpp"
#include "billing/store/correction_ledger.hpp"

using namespace cg::billing;

namespace {
const std::string head =
    R"({"customer_id":"acme-42","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1")";
}

// "revision" makes a correction whose amount is the period's new total, 0 (a full refund) included; without
// it (or with 0) a zero amount stays refused, as for every original charge.
BOOST_AUTO_TEST_CASE(revision_parses_and_allows_a_zero_total) {
    auto e = parse_event(head + R"(,"amount_cents":0,"revision":3})");
    BOOST_REQUIRE_MESSAGE(e.has_value(), (e ? "" : e.err().describe()));
    BOOST_TEST(e->revision == 3);
    BOOST_TEST(e->is_correction());
    BOOST_TEST(e->amount_cents == 0);
    auto back = parse_event(to_json(*e));
    BOOST_REQUIRE(back.has_value());
    BOOST_TEST(back->revision == 3);

    auto original = parse_event(head + R"(,"amount_cents":500,"revision":0})");
    BOOST_REQUIRE(original.has_value());
    BOOST_TEST(!original->is_correction());
    BOOST_TEST(to_json(*original).find("revision") == std::string::npos);

    BOOST_TEST(!parse_event(head + R"(,"amount_cents":0})").has_value());
    BOOST_TEST(!parse_event(head + R"(,"amount_cents":0,"revision":0})").has_value());
    BOOST_TEST(!parse_event(head + R"(,"amount_cents":5,"revision":-1})").has_value());
    BOOST_TEST(!parse_event(head + R"(,"amount_cents":5,"revision":1.5})").has_value());
    BOOST_TEST(!parse_event(head + R"(,"amount_cents":5,"revision":"2"})").has_value());
}

// A correction's keys derive from the original key and the revision (and a refund's further parts); the
// original's key is the same whatever revisions follow.
BOOST_AUTO_TEST_CASE(correction_keys_derive_from_the_original_key) {
    auto base = base_key("ns", "acme-42", "2026-11");
    BOOST_TEST(correction_key(base, 2) == base + "-r2");
    BOOST_TEST(correction_move_key(base, 2, 1) == base + "-r2");
    BOOST_TEST(correction_move_key(base, 2, 3) == base + "-r2-p3");
    BOOST_TEST(stripe_idempotency_key(correction_move_key(base, 2, 1), 2) == base + "-r2-g2");
    BOOST_TEST(correction_key(base, 2) != correction_key(base, 12));
    BOOST_TEST(base.size() == 32u);
}

// The cap a run needs with corrections: the original plus each rise over the total before it, in revision
// order whatever the line order (1000 → 1500 → 700 → 1200: 1000 + 500 + 0 + 500); a correction of a customer
// the run does not charge is skipped, said why.
BOOST_AUTO_TEST_CASE(expected_total_counts_each_rise_of_a_corrected_period) {
    auto line = [](const std::string& customer, std::int64_t amount, int revision) {
        std::string b =
            R"({"customer_id":")" + customer +
            R"(","billing_period":"2026-11","currency":"usd","stripe_customer_id":"cus_1","amount_cents":)" +
            std::to_string(amount);
        if (revision > 0) b += ",\"revision\":" + std::to_string(revision);
        return b + "}\n";
    };
    auto run = line("a", 1200, 3) + line("a", 1000, 0) + line("a", 700, 2) + line("a", 1500, 1) +
               line("b", 400, 0) + line("z", 999, 1);
    auto t = sum_expected(run, "2026-11", "usd");
    BOOST_TEST(t.total_cents == 1000 + 500 + 500 + 400);
    BOOST_TEST(t.counted == 5u);
    BOOST_TEST(t.skipped["correction of a customer the run does not charge"] == 1u);
}
