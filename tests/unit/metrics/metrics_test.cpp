#include <boost/test/unit_test.hpp>

#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "support/prom_text.hpp"

using namespace cg;

BOOST_AUTO_TEST_CASE(render_parses_with_labels_and_histograms) {
    metrics::registry reg;
    reg.counter("cg_test_total", "a counter").Add({{"outcome", "ok"}}).Increment(3);
    reg.counter("cg_test_total", "a counter").Add({{"outcome", "fail"}}).Increment();
    reg.gauge("cg_test_gauge", "a gauge").Add({}).Set(2.5);
    auto& h = reg.histogram("cg_test_seconds", "a histogram").Add({{"op", "q"}}, metrics::latency_buckets());
    h.Observe(0.0004);
    h.Observe(0.3);
    h.Observe(20);
    auto text = reg.render();
    auto fams = test::parse_prometheus(text);
    BOOST_REQUIRE(fams.count("cg_test_total"));
    BOOST_TEST(fams["cg_test_total"].type == "counter");
    BOOST_TEST(fams["cg_test_total"].help == "a counter");
    BOOST_TEST(fams["cg_test_total"].samples.size() == 2u);
    BOOST_TEST(fams["cg_test_gauge"].samples.at(0).value == 2.5);
    auto& hist = fams["cg_test_seconds"];
    BOOST_TEST(hist.type == "histogram");
    BOOST_TEST(test::bucket_count(hist, "0.0005", {{"op", "q"}}) == 1);
    BOOST_TEST(test::bucket_count(hist, "0.5", {{"op", "q"}}) == 2);
    BOOST_TEST(test::bucket_count(hist, "+Inf", {{"op", "q"}}) == 3);
}

BOOST_AUTO_TEST_CASE(prom_reader_rejects_broken_text) {
    BOOST_CHECK_THROW(test::parse_prometheus("orphan_sample 1\n"), std::runtime_error);
    BOOST_CHECK_THROW(test::parse_prometheus("# TYPE x counter\nx one\n"), std::runtime_error);
    BOOST_CHECK_THROW(
        test::parse_prometheus("# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                               "h_count 1\nh_sum 0\n"),
        std::runtime_error);
}

BOOST_AUTO_TEST_CASE(health_checks) {
    metrics::health h;
    BOOST_TEST(!h.ready().ok);  // nothing registered yet: not ready
    bool nsq_up = false;
    h.add_readiness("nsq", [&] {
        return metrics::check_status{nsq_up, nsq_up ? "1 connection" : "no connection"};
    });
    h.add_readiness("postgres", [] { return metrics::check_status{true, "3 idle"}; });
    auto r = h.ready();
    BOOST_TEST(!r.ok);
    BOOST_TEST(r.body == "FAIL nsq: no connection\nok postgres: 3 idle\n");
    nsq_up = true;
    BOOST_TEST(h.ready().ok);
    BOOST_TEST(h.live().ok);
}
