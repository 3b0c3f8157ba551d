// billing::pace_peers against a real PostgreSQL: sidecars sharing stripe_pace_peers see each other, split an
// account's rate (one leads the law, the other follows it), hear each other's 429 episodes, and forget a
// peer that stopped heartbeating once its rows expire.
#include "billing/flow/pace_peers.hpp"

#include <boost/test/unit_test.hpp>
#include <chrono>

#include "net/timeout.hpp"
#include "stripe/rate_control.hpp"
#include "tests/integration/billing/fixture.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

stripe::client::pace_report pace_row(bool pressed, double limit, std::uint64_t episodes,
                                     std::string account = "") {
    stripe::client::pace_report r;
    r.account = std::move(account);
    r.report.load = {pressed, 10};
    r.report.account_limit = limit;
    r.report.episodes = episodes;
    return r;
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(pace_peers_suite, cg::test::billing_fixture)

BOOST_AUTO_TEST_CASE(two_peers_split_the_rate_and_a_silent_one_is_forgotten) {
    billing::pace_peers a(pg, "peer-a", 1500ms), b(pg, "peer-b", 1500ms);
    auto va = run(a.exchange({pace_row(true, 20, 0)}));
    BOOST_TEST_REQUIRE(va.has_value(), (va ? "" : va.err().describe()));
    BOOST_TEST_REQUIRE(va->size() == 1u);
    BOOST_TEST((*va)[0].peers.size() == 1u);  // alone so far
    auto vb = run(b.exchange({pace_row(true, 20, 0), pace_row(false, 5, 0, "acct_1")}));
    BOOST_TEST_REQUIRE(vb.has_value());
    BOOST_TEST_REQUIRE(vb->size() == 2u);
    const auto& platform_b = (*vb)[0].account.empty() ? (*vb)[0] : (*vb)[1];
    BOOST_TEST_REQUIRE(platform_b.peers.size() == 2u);  // a, then b (by id)
    BOOST_TEST(platform_b.self == 1u);
    BOOST_TEST(platform_b.peers[0].account_limit == 20.0);
    BOOST_TEST(platform_b.peers[0].load.pressed);
    va = run(a.exchange({pace_row(true, std::numeric_limits<double>::infinity(), 0)}));
    BOOST_TEST_REQUIRE(va.has_value());
    BOOST_TEST_REQUIRE((*va)[0].peers.size() == 2u);  // a does not pace acct_1: it sees only the platform's
    BOOST_TEST(va->size() == 1u);
    BOOST_TEST((*va)[0].self == 0u);
    BOOST_TEST((*va)[0].peers[1].account_limit == 20.0);

    // The views split the rate: a leads at half of its limit, b follows a's limit at half of it.
    auto now = std::chrono::steady_clock::now();
    stripe::rate_config c;
    c.initial_rps = 30;
    stripe::rate_control ra(c, now), rb(c, now);
    stripe::apply_peers(ra, (*va)[0].peers.data(), (*va)[0].peers.size(), (*va)[0].self, now);
    stripe::apply_peers(rb, platform_b.peers.data(), platform_b.peers.size(), platform_b.self, now);
    BOOST_TEST(!ra.following());
    BOOST_TEST(ra.limit() == 15.0, boost::test_tools::tolerance(1e-9));
    BOOST_TEST(rb.following());
    BOOST_TEST(rb.limit() == 10.0, boost::test_tools::tolerance(1e-9));  // half of a's 20 as b read it

    // b's own 429 episode reaches a once.
    vb = run(b.exchange({pace_row(true, 20, 1)}));
    BOOST_TEST_REQUIRE(vb.has_value());
    va = run(a.exchange({pace_row(true, 20, 0)}));
    BOOST_TEST_REQUIRE(va.has_value());
    BOOST_TEST((*va)[0].peers[1].throttled_since);
    va = run(a.exchange({pace_row(true, 20, 0)}));
    BOOST_TEST_REQUIRE(va.has_value());
    BOOST_TEST(!(*va)[0].peers[1].throttled_since);

    // b stops heartbeating: a sees it until its rows expire (1.5 s), then alone, and the rows are gone.
    auto silent_from = std::chrono::steady_clock::now();
    std::size_t seen = 2;
    while (seen == 2 && std::chrono::steady_clock::now() - silent_from < 20s) {
        test::run_async(io, []() -> net::awaitable<void> { co_await net::sleep_for(100ms); });
        va = run(a.exchange({pace_row(true, 20, 0)}));
        BOOST_TEST_REQUIRE(va.has_value());
        seen = (*va)[0].peers.size();
    }
    auto forgotten_after = std::chrono::steady_clock::now() - silent_from;
    BOOST_TEST(seen == 1u);
    BOOST_TEST(forgotten_after >= 1400ms);
    auto rows_of = [&](std::string peer) {
        return run([](std::shared_ptr<pg::pool> p, std::string peer) -> net::awaitable<std::int64_t> {
            auto conn = co_await p->acquire();
            BOOST_TEST_REQUIRE(conn.has_value());
            auto r = co_await (*conn)->query("SELECT count(*) FROM stripe_pace_peers WHERE peer = $1", peer);
            BOOST_TEST_REQUIRE(r.has_value());
            co_return (*r)[0].get<std::int64_t>(0);
        }(pg, std::move(peer)));
    };
    BOOST_TEST(rows_of("peer-b") == 0);  // the platform's and acct_1's, deleted by a's exchange
    BOOST_TEST(rows_of("peer-a") == 1);
    auto left = run(a.leave());
    BOOST_TEST(left.has_value());
    BOOST_TEST(rows_of("peer-a") == 0);
}

BOOST_AUTO_TEST_SUITE_END()
