#include <boost/test/unit_test.hpp>

#include "billing/decision.hpp"

using namespace cg::billing;
using namespace std::chrono_literals;

namespace {
const sys_time now = sys_time(std::chrono::seconds(1'800'000'000));

billing_event event() {
    billing_event e;
    e.customer_id = "acme";
    e.billing_period = "2026-11";
    e.amount_cents = 1999;
    e.currency = "usd";
    e.stripe_customer_id = "cus_1";
    return e;
}

ledger_record record(record_status s) {
    ledger_record r;
    r.key = "k";
    r.customer_id = "acme";
    r.billing_period = "2026-11";
    r.amount_cents = 1999;
    r.currency = "usd";
    r.stripe_customer_id = "cus_1";
    r.status = s;
    return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(decision_table) {
    struct row {
        const char* name;
        ledger_record rec;
        existing_action want;
    };
    auto with = [](ledger_record r, auto f) {
        f(r);
        return r;
    };
    std::vector<row> rows{
        {"charged is a prevented duplicate", record(record_status::charged), existing_action::duplicate_finish},
        {"declined is final", record(record_status::declined), existing_action::duplicate_finish},
        {"cap_blocked is final", record(record_status::cap_blocked), existing_action::duplicate_finish},
        {"conflict is final", record(record_status::conflict), existing_action::duplicate_finish},
        {"other amount", with(record(record_status::charged), [](auto& r) { r.amount_cents = 2000; }),
         existing_action::payload_conflict},
        {"other currency", with(record(record_status::pending), [](auto& r) { r.currency = "eur"; }),
         existing_action::payload_conflict},
        {"other stripe customer", with(record(record_status::pending), [](auto& r) { r.stripe_customer_id = "cus_2"; }),
         existing_action::payload_conflict},
        {"lease held", with(record(record_status::pending), [](auto& r) { r.lease_until = now + 1s; }),
         existing_action::lease_held_requeue},
        {"lease expired, never tried", with(record(record_status::pending), [](auto& r) { r.lease_until = now - 1s; }),
         existing_action::recover_same_key},
        {"lease expired, tried 22h ago", with(record(record_status::pending),
                                              [](auto& r) {
                                                  r.lease_until = now - 1s;
                                                  r.first_stripe_attempt_at = now - 22h;
                                              }),
         existing_action::recover_same_key},
        {"tried 23h ago: past the window", with(record(record_status::pending),
                                                [](auto& r) { r.first_stripe_attempt_at = now - 23h; }),
         existing_action::recover_search},
        {"indeterminate answer", with(record(record_status::pending),
                                      [](auto& r) {
                                          r.first_stripe_attempt_at = now - 1min;
                                          r.indeterminate_since = now - 1min;
                                      }),
         existing_action::recover_search},
    };
    for (const auto& r : rows) BOOST_TEST((decide_existing(r.rec, event(), now) == r.want), r.name << ": got " << to_string(decide_existing(r.rec, event(), now)));
}

BOOST_AUTO_TEST_CASE(status_names_round_trip) {
    for (auto s : {record_status::pending, record_status::charged, record_status::declined, record_status::failed,
                   record_status::cap_blocked, record_status::conflict})
        BOOST_TEST((parse_record_status(to_string(s)) == s));
    BOOST_TEST(!parse_record_status("settled").has_value());
}

// The pipeline passes its configured window; the default stays same_key_window.
BOOST_AUTO_TEST_CASE(same_key_window_is_configurable) {
    auto r = record(record_status::pending);
    r.first_stripe_attempt_at = now - 2h;
    BOOST_TEST((decide_existing(r, event(), now) == existing_action::recover_same_key));
    BOOST_TEST((decide_existing(r, event(), now, 1h) == existing_action::recover_search));
    BOOST_TEST((decide_existing(r, event(), now, 3h) == existing_action::recover_same_key));
}
