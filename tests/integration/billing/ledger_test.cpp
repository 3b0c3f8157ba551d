// The lease token is an integer epoch (migration 0007), against the real server: it moves forward with every
// statement that writes lease_until, and a token from an older lease is refused even when the newer lease
// has exactly the same lease_until (the timestamp token it replaces could not tell the two apart).
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "fixture.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::event_json;

namespace {

using fixture = test::billing_fixture;

// The row's lease columns as the database holds them: lease_until as text (exact, microseconds) and the
// epoch.
std::pair<std::string, std::int64_t> lease_columns(fixture& f, const std::string& key) {
    auto r = f.run(f.query("SELECT lease_until::text, lease_epoch FROM billing_records WHERE key = $1",
                           pg::params(key)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST_REQUIRE(r->size() == 1u);
    return {(*r)[0].get<std::optional<std::string>>(0).value_or("NULL"), (*r)[0].get<std::int64_t>(1)};
}

// Lets the current lease lapse (as a crashed worker's would), keeping the epoch.
void expire(fixture& f, const std::string& key) {
    auto r =
        f.run(f.query("UPDATE billing_records SET lease_until = now() - interval '1 second' WHERE key = $1",
                      pg::params(key)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_ledger_lease_epoch)

// Insert, take, renew, record an attempt, release: each writes lease_until and moves the epoch by exactly
// one; the token each returns is the row's epoch.
BOOST_AUTO_TEST_CASE(every_lease_write_moves_the_epoch) {
    fixture f;
    auto rec = f.dead_workers_row(event_json("epoch-1", "2026-11", 2100), "3a01", 60s);
    BOOST_TEST(rec.lease_epoch == 1);
    BOOST_TEST(lease_columns(f, rec.key).second == 1);

    auto renewed = f.run(f.ledger->renew_lease(rec.key, 1, 60s));
    BOOST_TEST_REQUIRE(renewed.has_value());
    BOOST_TEST_REQUIRE(renewed->has_value());
    BOOST_TEST(**renewed == 2);

    auto att = f.run(f.ledger->record_attempt(rec.key, 2, 60s));
    BOOST_TEST_REQUIRE((att.has_value() && att->has_value()));
    BOOST_TEST((*att)->lease == 3);
    BOOST_TEST((*att)->stripe_attempts == 2);

    auto released = f.run(f.ledger->release_lease(rec.key, 3, "retry later"));
    BOOST_TEST_REQUIRE(released.has_value());
    BOOST_TEST(*released);
    BOOST_TEST(lease_columns(f, rec.key).second == 4);

    auto taken = f.run(f.ledger->take_expired_lease(rec.key, 60s, "3a02", 2));
    BOOST_TEST_REQUIRE((taken.has_value() && taken->has_value()));
    BOOST_TEST((*taken)->lease_epoch == 5);
    BOOST_TEST(lease_columns(f, rec.key).second == 5);

    // A released lease is not the releaser's any more: its token (4 was never handed out; 3 was) renews
    // nothing.
    auto stale = f.run(f.ledger->renew_lease(rec.key, 3, 60s));
    BOOST_TEST_REQUIRE(stale.has_value());
    BOOST_TEST(!stale->has_value());
}

// Two leases with the same lease_until (written within one microsecond, or a clock that stood still): the
// older holder's token is refused by every statement that needs the lease, the newer holder's accepted. With
// lease_until as the token both would have matched.
BOOST_AUTO_TEST_CASE(equal_lease_timestamps_still_differ_and_a_stale_epoch_is_refused) {
    fixture f;
    auto rec = f.dead_workers_row(event_json("epoch-2", "2026-11", 2100), "3b01", 60s);
    billing::lease_token old_token = rec.lease_epoch;
    auto [old_until, old_epoch] = lease_columns(f, rec.key);
    BOOST_TEST(old_epoch == old_token);

    // The first holder stalls, its lease lapses, a second worker takes the row.
    expire(f, rec.key);
    auto taken = f.run(f.ledger->take_expired_lease(rec.key, 60s, "3b01", 2));
    BOOST_TEST_REQUIRE((taken.has_value() && taken->has_value()));
    billing::lease_token new_token = (*taken)->lease_epoch;
    BOOST_TEST(new_token != old_token);
    // Make the new lease's expiry exactly the old one's: the timestamps are now equal to the microsecond.
    auto same = f.run(f.query("UPDATE billing_records SET lease_until = $2::timestamptz WHERE key = $1",
                              pg::params(rec.key, old_until)));
    BOOST_TEST_REQUIRE(same.has_value(), (same ? "" : same.err().describe()));
    auto [until, epoch] = lease_columns(f, rec.key);
    BOOST_TEST(until == old_until);
    BOOST_TEST(epoch == new_token);

    // The stale holder can do nothing that needs the lease.
    auto renew = f.run(f.ledger->renew_lease(rec.key, old_token, 60s));
    BOOST_TEST_REQUIRE(renew.has_value());
    BOOST_TEST(!renew->has_value());
    auto att = f.run(f.ledger->record_attempt(rec.key, old_token, 60s));
    BOOST_TEST_REQUIRE(att.has_value());
    BOOST_TEST(!att->has_value());
    auto bump = f.run(f.ledger->bump_generation(rec.key, old_token, 1));
    BOOST_TEST_REQUIRE(bump.has_value());
    BOOST_TEST(!bump->has_value());
    auto rel = f.run(f.ledger->release_lease(rec.key, old_token, "stale release"));
    BOOST_TEST_REQUIRE(rel.has_value());
    BOOST_TEST(!*rel);
    // An open answer is still recorded (it steers the holder to search), but the holder's lease stays.
    auto ind = f.run(f.ledger->mark_indeterminate(rec.key, old_token, "stale 500"));
    BOOST_TEST_REQUIRE(ind.has_value());
    BOOST_TEST(!*ind);
    auto after = f.row(rec.key);
    BOOST_TEST_REQUIRE(after.has_value());
    BOOST_TEST(after->indeterminate_since.has_value());
    BOOST_TEST(after->key_generation == 1);
    BOOST_TEST(after->stripe_attempts == 1);
    auto [until_now, epoch_now] = lease_columns(f, rec.key);
    BOOST_TEST(until_now == old_until);
    BOOST_TEST(epoch_now == new_token);

    // The current holder's token works, and releasing with it hands the row on.
    auto bumped = f.run(f.ledger->bump_generation(rec.key, new_token, 1));
    BOOST_TEST_REQUIRE((bumped.has_value() && bumped->has_value()));
    BOOST_TEST(**bumped == 2);
    auto mine = f.run(f.ledger->mark_indeterminate(rec.key, new_token, "our 500"));
    BOOST_TEST_REQUIRE(mine.has_value());
    BOOST_TEST(*mine);
    BOOST_TEST(lease_columns(f, rec.key).second == new_token + 1);
}

BOOST_AUTO_TEST_SUITE_END()
