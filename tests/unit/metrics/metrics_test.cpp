#include <boost/test/unit_test.hpp>

#include "metrics/health.hpp"
#include "metrics/process.hpp"
#include "metrics/registry.hpp"
#include "metrics/startup.hpp"
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

BOOST_AUTO_TEST_CASE(proc_stat_fields_survive_odd_command_names) {
    // pid (comm) state ppid ... utime(14) stime(15) ... starttime(22)
    std::string line = "4242 (a b) (c)) S 1 2 3 4 5 6 7 8 9 10 111 222 13 14 15 16 17 18 333 19 20\n";
    auto f = metrics::parse_proc_stat(line);
    BOOST_TEST_REQUIRE(f.has_value());
    BOOST_TEST(f->utime == 111u);
    BOOST_TEST(f->stime == 222u);
    BOOST_TEST(f->starttime == 333u);
    BOOST_TEST(!metrics::parse_proc_stat("4242 (x) S 1 2").has_value());
    BOOST_TEST(!metrics::parse_proc_stat("no parenthesis").has_value());
    auto self = metrics::read_process_sample();
    BOOST_TEST_REQUIRE(self.has_value());
    BOOST_TEST(self->resident_bytes > 0);
    BOOST_TEST(self->open_fds >= 3);
}

BOOST_AUTO_TEST_CASE(process_families_are_rendered_only_when_added) {
    metrics::registry reg;
    BOOST_TEST(reg.render().find("process_open_fds") == std::string::npos);
    reg.add_collectable(std::make_shared<metrics::process_collector>());
    auto fams = test::parse_prometheus(reg.render());
    BOOST_TEST(fams.count("process_open_fds") == 1u);
    BOOST_TEST(fams["process_cpu_seconds_total"].type == "counter");
    BOOST_TEST(fams["process_start_time_seconds"].type == "gauge");
}

BOOST_AUTO_TEST_CASE(startup_latches_once_every_condition_held) {
    metrics::startup s;
    bool seen = false;
    s.require("nsq", "first subscription", [&] { return seen; });
    s.require("schema", "database schema");
    auto r = s.report();
    BOOST_TEST(!r.ok);
    BOOST_TEST(r.body == "WAIT nsq: first subscription\nWAIT schema: database schema\n");
    s.waiting_for("schema", "database schema 0009, this binary needs 0010");
    s.mark("schema");
    BOOST_TEST(!s.started());
    seen = true;
    BOOST_TEST(s.started());
    seen = false;  // polled no more: started for good
    BOOST_TEST(s.report().body == "ok started\n");
    s.require("late", "added after start");
    BOOST_TEST(s.started());
    metrics::startup none;
    BOOST_TEST(none.started());  // no conditions: nothing to wait for
}

BOOST_AUTO_TEST_CASE(redacted_readiness_shows_public_detail_only) {
    metrics::health h;
    h.add_readiness("postgres", [] {
        return metrics::check_status{false, "host=db port=5432 user=cg refused"};
    });
    h.add_readiness("schema", [] { return metrics::check_status{false, "schema 9 at db", "schema 9"}; });
    BOOST_TEST(h.ready(false, true).body == "FAIL postgres\nFAIL schema: schema 9\n");
    BOOST_TEST(h.ready().body ==
               "FAIL postgres: host=db port=5432 user=cg refused\nFAIL schema: schema 9 at db\n");
}
