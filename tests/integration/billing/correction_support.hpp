// Helpers for the correction tests: the events of a correction, the state of its rows in the ledger and
// of its refunds at fake-stripe.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>

#include "fixture.hpp"

namespace cg::test::correction_support {

using namespace std::chrono_literals;
using fixture = test::billing_fixture;

// A correction: the period's new total as revision N.
inline std::string correction_json(const std::string& customer, const std::string& period, std::int64_t total,
                                   int revision) {
    auto body = event_json(customer, period, total);
    body.pop_back();
    return body + ",\"revision\":" + std::to_string(revision) + "}";
}

// The sum of the fake's refunds that stand (not failed or canceled) on one charge.
inline std::int64_t refunded_on(const fixture& f, const std::string& charge) {
    std::int64_t sum = 0;
    for (const auto& r : f.fake->refunds())
        if (r.charge == charge && !stripe::refund_undone(r.status)) sum += r.amount;
    return sum;
}

inline std::string status_of(fixture& f, const std::string& correction_key) {
    auto r =
        f.run(f.query("SELECT status FROM billing_corrections WHERE key = $1", pg::params(correction_key)));
    BOOST_TEST_REQUIRE(r.has_value());
    if (r->size() == 0) return "absent";
    return r->get<std::string>(0, 0);
}

// Charges the original (1000) and returns its charge id.
inline std::string charge_original(fixture& f, billing::charge_flow& p, const std::string& customer,
                                   std::int64_t amount = 1000) {
    auto v = f.handle(p, delivery_of(event_json(customer, "2026-11", amount), customer + "-orig"));
    BOOST_TEST_REQUIRE(reason(v) == "charged", v.detail);
    return v.detail;
}

}  // namespace cg::test::correction_support
