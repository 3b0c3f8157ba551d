// The backfill (billing/backfill.hpp) against real PostgreSQL and fake-stripe: a ledger row lost entirely
// (a failover lost its insert) comes back from its Stripe charge, marked recovered. g++ 12 -O2 false
// positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include "billing/backfill.hpp"

#include <boost/test/unit_test.hpp>

#include "billing/outcome.hpp"
#include "fixture.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::key_of;
using cg::test::reason;

namespace {

using fixture = test::billing_fixture;

billing::backfill_config config() {
    billing::backfill_config c;
    c.key_namespace = test::key_namespace;
    c.window = 1h;
    c.page_size = 2;  // several pages for a handful of charges
    return c;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_backfill)

// The row is deleted after its charge succeeded (what a failover that lost the insert and the settle leaves):
// the backfill inserts it `charged` with the charge id, marked recovered; a second run and a late redelivery
// change nothing and POST nothing. A charge of another key namespace and a row that exists are left alone.
BOOST_AUTO_TEST_CASE(row_lost_after_its_charge_succeeded_comes_back) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("bf-1", "2026-11", 1999);
    auto key = key_of("bf-1", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "6a01"))) == "charged");
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("bf-2", "2026-11", 300), "6a02"))) == "charged");
    auto charge_id = f.row(key)->charge_id.value_or("");
    BOOST_TEST_REQUIRE(charge_id != "");
    // Another namespace's charge in the same account: not this sidecar's row to rebuild.
    auto other_ev = billing::parse_event(event_json("bf-3", "2026-11", 400));
    BOOST_TEST_REQUIRE(other_ev.has_value());
    auto other_key = billing::base_key("other", "bf-3", "2026-11");
    auto other = test::run_async(f.io, [&]() {
        return f.stripe->create_charge(billing::build_charge_request(*other_ev, other_key, 1));
    });
    BOOST_TEST_REQUIRE(other.charge_id != "");
    auto deleted = f.run(f.query("DELETE FROM billing_records WHERE key = $1", pg::params(key)));
    BOOST_TEST_REQUIRE(deleted.has_value());
    BOOST_TEST(!f.row(key).has_value());

    metrics::registry reg;
    billing::backfill b(config(), f.pg, *f.stripe, logger(), &reg);
    auto rep = f.run(b.run_once());
    BOOST_TEST_REQUIRE(rep.has_value(), (rep ? "" : rep.err().describe()));
    BOOST_TEST(rep->listed == 3u);
    BOOST_TEST(rep->ours == 2u);
    BOOST_TEST(rep->inserted == 1u);
    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == charge_id);
    BOOST_TEST(rec->amount_cents == 1999);
    BOOST_TEST(rec->customer_id == "bf-1");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND recovered_at IS NOT NULL",
                        key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE recovered_at IS NOT NULL") == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1", other_key) == 0);

    auto again = f.run(b.run_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->inserted == 0u);
    auto posts = f.fake->posts_for(key);
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "6a01", 2))) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == posts);
    BOOST_TEST(f.fake->charges().size() == 3u);
}

BOOST_AUTO_TEST_SUITE_END()
