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
    auto bump = f.run(f.ledger->bump_generation(rec.key, old_token, 1, 0ms));
    BOOST_TEST_REQUIRE(bump.has_value());
    BOOST_TEST(!bump->generation.has_value());
    BOOST_TEST(bump->wait.count() == 0);
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
    auto bumped = f.run(f.ledger->bump_generation(rec.key, new_token, 1, 0ms));
    BOOST_TEST_REQUIRE((bumped.has_value() && bumped->generation.has_value()));
    BOOST_TEST(*bumped->generation == 2);
    auto mine = f.run(f.ledger->mark_indeterminate(rec.key, new_token, "our 500"));
    BOOST_TEST_REQUIRE(mine.has_value());
    BOOST_TEST(*mine);
    BOOST_TEST(lease_columns(f, rec.key).second == new_token + 1);
}

// A new generation waits out the old one's calls: the bump is refused (with the time left) while the last
// sign of life of a call under the current generation — its recorded attempt, a renewal, a note from a
// worker that lost its lease — is younger than the quiet period, and goes through once it is older.
BOOST_AUTO_TEST_CASE(a_new_generation_waits_until_no_call_under_the_old_one_shows_life) {
    fixture f;
    auto rec = f.dead_workers_row(event_json("quiet-1", "2026-11", 1000), "q1", 30s);
    auto token = rec.lease_epoch;
    // The attempt was recorded just now: a bump asking for 60 s of quiet must wait about that long.
    auto early = f.run(f.ledger->bump_generation(rec.key, token, 1, 60s));
    BOOST_TEST_REQUIRE(early.has_value(), (early ? "" : early.err().describe()));
    BOOST_TEST(!early->generation.has_value());
    BOOST_TEST(early->wait.count() > 55'000);
    BOOST_TEST(early->wait.count() <= 60'000);
    BOOST_TEST(f.row(rec.key)->key_generation == 1);
    // The call's last sign of life 61 s ago (a worker that died or whose call ended): the bump goes through.
    f.age_last_attempt(rec.key);
    // A worker that lost its lease notes its call is still awaited: the quiet period starts again.
    auto noted = f.run(f.ledger->note_in_flight(rec.key, 1));
    BOOST_TEST_REQUIRE((noted.has_value() && *noted));
    auto still = f.run(f.ledger->bump_generation(rec.key, token, 1, 60s));
    BOOST_TEST_REQUIRE(still.has_value());
    BOOST_TEST(!still->generation.has_value());
    BOOST_TEST(still->wait.count() > 55'000);
    // A note for another generation holds nothing back.
    f.age_last_attempt(rec.key);
    auto other = f.run(f.ledger->note_in_flight(rec.key, 7));
    BOOST_TEST_REQUIRE((other.has_value() && !*other));
    auto bumped = f.run(f.ledger->bump_generation(rec.key, token, 1, 60s));
    BOOST_TEST_REQUIRE((bumped.has_value() && bumped->generation.has_value()));
    BOOST_TEST(*bumped->generation == 2);
    BOOST_TEST(bumped->wait.count() == 0);
    // A renewal is a sign of life too.
    auto renewed = f.run(f.ledger->renew_lease(rec.key, token, 30s));
    BOOST_TEST_REQUIRE((renewed.has_value() && renewed->has_value()));
    auto after_renewal = f.run(f.ledger->bump_generation(rec.key, **renewed, 2, 60s));
    BOOST_TEST_REQUIRE(after_renewal.has_value());
    BOOST_TEST(!after_renewal->generation.has_value());
    BOOST_TEST(after_renewal->wait.count() > 55'000);
}

// A failed or cap_blocked row reopens for the replay of its dead letter: pending, no lease, marked to search
// first; any other state is left alone.
BOOST_AUTO_TEST_CASE(reopen_for_replay_reopens_only_failed_and_cap_blocked_rows) {
    fixture f;
    auto failed = f.dead_workers_row(event_json("reopen-1", "2026-11", 1000), "r1", 30s);
    auto capped = f.dead_workers_row(event_json("reopen-2", "2026-11", 1000), "r2", 30s);
    auto charged = f.dead_workers_row(event_json("reopen-3", "2026-11", 1000), "r3", 30s);
    auto letter = [](const std::string& id) {
        return billing::dead_letter{"billing", "chargeguard", id, 1, "{}", "stripe rejected", std::nullopt};
    };
    BOOST_TEST_REQUIRE(f.run(f.ledger->mark_failed(failed.key, "HTTP 400", letter("r1"))).has_value());
    BOOST_TEST_REQUIRE(f.run(f.ledger->mark_cap_blocked(capped.key, "cap", letter("r2"))).has_value());
    BOOST_TEST_REQUIRE(f.run(f.ledger->mark_charged(charged.key, "ch_reopen_3")).has_value());
    for (const auto* rec : {&failed, &capped}) {
        auto was = f.run(f.ledger->reopen_for_replay(rec->key, "replay of letter 1 by test"));
        BOOST_TEST_REQUIRE(was.has_value(), (was ? "" : was.err().describe()));
        BOOST_TEST_REQUIRE(was->has_value());
        BOOST_TEST(billing::to_string(**was) == (rec == &failed ? "failed" : "cap_blocked"));
        auto now_row = f.row(rec->key);
        BOOST_TEST(billing::to_string(now_row->status) == "pending");
        BOOST_TEST(!now_row->lease_until.has_value());
        BOOST_TEST(now_row->indeterminate_since.has_value());  // recovery searches before a new key
        BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND last_error = "
                            "'replay of letter 1 by test'",
                            rec->key) == 1);
        // Twice is a no-op.
        auto again = f.run(f.ledger->reopen_for_replay(rec->key, "again"));
        BOOST_TEST_REQUIRE(again.has_value());
        BOOST_TEST(!again->has_value());
    }
    auto left = f.run(f.ledger->reopen_for_replay(charged.key, "no"));
    BOOST_TEST_REQUIRE(left.has_value());
    BOOST_TEST(!left->has_value());
    BOOST_TEST(billing::to_string(f.row(charged.key)->status) == "charged");
}

BOOST_AUTO_TEST_SUITE_END()
