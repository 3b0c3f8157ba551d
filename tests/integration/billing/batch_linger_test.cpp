// The linger of the ledger's group commit (batch_options.linger), against the real server: a lingering slot
// gathers callers that arrive apart into one statement, a full batch ends the wait, and zero means none.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>
#include <functional>
#include <vector>

#include "batch_support.hpp"

using namespace std::chrono_literals;
using namespace cg;

namespace {

using namespace cg::test::batch;

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_ledger_batch)

// The linger (batch_options.linger, set by the pipeline from Stripe's pace): with both slots free, callers
// that arrive 5 ms apart within the wait share ONE statement (without it the first two would each go alone
// on a free slot), and every row is committed before any of them resumes.
BOOST_AUTO_TEST_CASE(a_lingering_slot_gathers_callers_that_arrive_apart) {
    fixture f;
    billing::ledger l(f.pg);  // default options: two slots
    l.set_linger(400ms);
    BOOST_TEST(l.linger() == std::chrono::microseconds(400ms));
    constexpr int n = 8;
    auto [recs, keys] = records_for("linger-", n, 500, "bl");
    std::vector<std::function<net::awaitable<seen>()>> ops;
    for (int i = 0; i < n; ++i)
        ops.push_back([&, i]() -> net::awaitable<seen> {
            net::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(5 * i));
            co_await t.async_wait();  // the arrival pattern under test, not synchronisation
            co_return co_await preflight_and_look(&f, &l, recs[i], keys);
        });
    auto t0 = std::chrono::steady_clock::now();
    auto out = run_all<seen>(f, std::move(ops));
    auto took = std::chrono::steady_clock::now() - t0;
    auto c = l.batch_counters().preflight;
    BOOST_TEST(c.statements == 1u);
    BOOST_TEST(c.rows == static_cast<std::uint64_t>(n));
    BOOST_TEST(took >= 400ms);  // the first caller waited out the linger
    for (int i = 0; i < n; ++i) {
        BOOST_TEST_REQUIRE(out[i].pf.has_value(), (out[i].pf ? "" : out[i].pf.err().describe()));
        BOOST_TEST(out[i].pf->inserted);
        BOOST_TEST(out[i].committed_when_resumed == n);
    }
    BOOST_TEST(count_leased(f, keys) == n);
}

// A lingering slot leaves as soon as max_rows callers queued (the wait is only for company), and with the
// linger set back to zero the next caller goes alone at once.
BOOST_AUTO_TEST_CASE(a_full_batch_ends_the_linger_and_zero_means_no_wait) {
    fixture f;
    billing::ledger_options o;
    o.batch.max_rows = 4;
    billing::ledger l(f.pg, std::move(o));
    l.set_linger(std::chrono::seconds(20));
    std::vector<billing::new_record> recs;
    for (int i = 0; i < 4; ++i)
        recs.push_back(
            record_for("linger-full-" + std::to_string(i), "2026-11", 700, "bf" + std::to_string(i)));
    std::vector<std::function<net::awaitable<seen>()>> ops;
    for (int i = 0; i < 4; ++i)
        ops.push_back([&, i]() { return preflight_and_look(&f, &l, recs[i], {recs[i].key}); });
    auto t0 = std::chrono::steady_clock::now();
    auto out = run_all<seen>(f, std::move(ops));
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 10s);  // not the 20 s linger
    BOOST_TEST(l.batch_counters().preflight.statements == 1u);
    for (auto& o2 : out) BOOST_TEST((o2.pf && o2.pf->inserted));

    l.set_linger(std::chrono::microseconds(0));
    auto lone = record_for("linger-lone", "2026-11", 701, "bf9");
    t0 = std::chrono::steady_clock::now();
    auto one = run_all<seen>(f, {[&]() { return preflight_and_look(&f, &l, lone, {lone.key}); }});
    BOOST_TEST((std::chrono::steady_clock::now() - t0) < 10s);
    BOOST_TEST(l.batch_counters().preflight.statements == 2u);
    BOOST_TEST((one[0].pf && one[0].pf->inserted));
}

BOOST_AUTO_TEST_SUITE_END()
