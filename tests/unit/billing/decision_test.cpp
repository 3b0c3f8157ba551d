#include "billing/machine/decision.hpp"

#include <boost/test/unit_test.hpp>

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
        {"charged is a prevented duplicate", record(record_status::charged),
         existing_action::duplicate_finish},
        {"declined is final", record(record_status::declined), existing_action::duplicate_finish},
        {"cap_blocked is final", record(record_status::cap_blocked), existing_action::duplicate_finish},
        {"conflict is final", record(record_status::conflict), existing_action::duplicate_finish},
        {"other amount", with(record(record_status::charged), [](auto& r) { r.amount_cents = 2000; }),
         existing_action::payload_conflict},
        {"other currency", with(record(record_status::pending), [](auto& r) { r.currency = "eur"; }),
         existing_action::payload_conflict},
        {"other stripe customer",
         with(record(record_status::pending), [](auto& r) { r.stripe_customer_id = "cus_2"; }),
         existing_action::payload_conflict},
        {"lease held", with(record(record_status::pending), [](auto& r) { r.lease_until = now + 1s; }),
         existing_action::lease_held_requeue},
        {"lease expired, never tried",
         with(record(record_status::pending), [](auto& r) { r.lease_until = now - 1s; }),
         existing_action::recover_same_key},
        {"lease expired, tried 22h ago",
         with(record(record_status::pending),
              [](auto& r) {
                  r.lease_until = now - 1s;
                  r.first_stripe_attempt_at = now - 22h;
              }),
         existing_action::recover_same_key},
        {"tried 23h ago: past the window",
         with(record(record_status::pending), [](auto& r) { r.first_stripe_attempt_at = now - 23h; }),
         existing_action::recover_search},
        {"indeterminate answer",
         with(record(record_status::pending),
              [](auto& r) {
                  r.first_stripe_attempt_at = now - 1min;
                  r.indeterminate_since = now - 1min;
              }),
         existing_action::recover_search},
    };
    for (const auto& r : rows)
        BOOST_TEST((decide_existing(r.rec, event(), now) == r.want),
                   r.name << ": got " << to_string(decide_existing(r.rec, event(), now)));
}

BOOST_AUTO_TEST_CASE(status_names_round_trip) {
    for (auto s : {record_status::pending, record_status::charged, record_status::declined,
                   record_status::failed, record_status::cap_blocked, record_status::conflict})
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

// The database's view of the lease wins over the local clock (they can disagree by clock skew).
BOOST_AUTO_TEST_CASE(lease_remaining_from_the_database_decides_held) {
    auto r = record(record_status::pending);
    r.lease_until = now - 5s;    // the local clock says expired…
    r.lease_remaining = 2000ms;  // …the database says 2 s left
    BOOST_TEST((decide_existing(r, event(), now) == existing_action::lease_held_requeue));
    r.lease_until = now + 5s;
    r.lease_remaining = 0ms;
    BOOST_TEST((decide_existing(r, event(), now) == existing_action::recover_same_key));
}

// recovery_mode decides for a row this worker just leased: the lease itself does not matter any more.
BOOST_AUTO_TEST_CASE(recovery_mode_table) {
    struct row {
        const char* name;
        std::optional<sys_time> first_attempt;
        std::optional<sys_time> indeterminate;
        std::optional<sys_time> lease_until;
        existing_action want;
    };
    std::vector<row> rows{
        {"never tried", std::nullopt, std::nullopt, std::nullopt, existing_action::recover_same_key},
        {"tried 1 h ago", now - 1h, std::nullopt, std::nullopt, existing_action::recover_same_key},
        {"our fresh lease is ignored", now - 1h, std::nullopt, now + 60s, existing_action::recover_same_key},
        {"tried 22h59m ago", now - 22h - 59min, std::nullopt, std::nullopt,
         existing_action::recover_same_key},
        {"tried 23 h ago", now - 23h, std::nullopt, std::nullopt, existing_action::recover_search},
        {"indeterminate", now - 1min, now - 30s, std::nullopt, existing_action::recover_search},
        {"indeterminate, no attempt time", std::nullopt, now - 30s, std::nullopt,
         existing_action::recover_search},
    };
    for (const auto& t : rows) {
        auto r = record(record_status::pending);
        r.first_stripe_attempt_at = t.first_attempt;
        r.indeterminate_since = t.indeterminate;
        r.lease_until = t.lease_until;
        BOOST_TEST((recovery_mode(r, now) == t.want), t.name);
    }
}

// A requeue for a held lease waits until that lease can have expired, plus bounded jitter; never below the
// floor, never above nsqd's REQ cap.
BOOST_AUTO_TEST_CASE(lease_held_requeue_delay_table) {
    struct row {
        const char* name;
        std::optional<std::chrono::milliseconds> remaining;
        double unit;
        std::chrono::milliseconds want;
    };
    const auto lease = 60s, floor = 1s, cap = 3600s;
    std::vector<row> rows{
        {"55 s left, no jitter", 55'000ms, 0.0, 55'000ms},
        {"55 s left, full jitter (10 %)", 55'000ms, 1.0, 60'500ms},
        {"55 s left, half jitter", 55'000ms, 0.5, 57'750ms},
        {"1 s left (the floor): the floor", 1000ms, 0.0, 1000ms},
        {"1 s left (the floor): floor + floor-sized jitter", 1000ms, 1.0, 2000ms},
        {"300 ms left: the remaining time, not the floor", 300ms, 0.0, 300ms},
        {"300 ms left: + jitter under a tenth of the floor", 300ms, 1.0, 400ms},
        {"3 ms left (ends just after a redelivery): a tenth of the floor", 3ms, 0.0, 100ms},
        {"3 ms left: + jitter", 3ms, 0.5, 150ms},
        {"999 ms left: just under the floor", 999ms, 1.0, 1099ms},
        {"expired (0): a tenth of the floor", 0ms, 0.0, 100ms},
        {"unknown: a whole lease", std::nullopt, 0.0, 60'000ms},
        {"huge: capped", 7200'000ms, 0.0, 3600'000ms},
        {"out-of-range random clamps", 10'000ms, 7.0, 11'000ms},
    };
    for (const auto& t : rows)
        BOOST_TEST(lease_held_requeue_delay(t.remaining, lease, floor, cap, t.unit).count() == t.want.count(),
                   t.name);
}
