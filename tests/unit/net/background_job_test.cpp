// The one starter of background jobs (net/stoppable_task.hpp, start_job): passes at its interval until a
// stop, a job that says it is done ends, a pass that throws is counted and the job goes on, a computed wait
// replaces the interval, and the metrics count each pass by job.
#include <asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <memory>
#include <stdexcept>

#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "net/timeout.hpp"
#include "support/run_async.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

struct job_state {
    net::stoppable_task task;
    int passes = 0;
};

double sample(metrics::registry& reg, const std::string& family, const std::string& job) {
    for (const auto& f : reg.raw().Collect())
        if (f.name == family)
            for (const auto& m : f.metric)
                for (const auto& l : m.label)
                    if (l.name == "job" && l.value == job) return m.counter.value;
    return -1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(background_job)

BOOST_AUTO_TEST_CASE(passes_at_its_interval_until_stopped_and_counts_them) {
    asio::io_context io;
    metrics::registry reg;
    auto st = std::make_shared<job_state>();
    net::job_spec job;
    job.name = "ticker";
    job.interval = 10ms;
    job.first_after = 0ms;
    job.metrics = &reg;
    auto* raw = st.get();
    st->task.start_job(
        io.get_executor(), st, job,
        [raw]() -> net::awaitable<bool> {
            return [](job_state* s) -> net::awaitable<bool> {
                ++s->passes;
                if (s->passes == 2) throw std::runtime_error("second pass fails");
                co_return true;
            }(raw);
        },
        logger());
    cg::test::run_async(io, [&]() -> net::awaitable<void> {
        for (int i = 0; i < 200 && raw->passes < 5; ++i) co_await net::sleep_for(5ms);
        co_await raw->task.stop();
    });
    BOOST_TEST(raw->passes >= 5);  // the failed pass did not end it
    const int at_stop = raw->passes;
    BOOST_TEST(sample(reg, "chargeguard_background_job_passes_total", "ticker") == at_stop);
    BOOST_TEST(sample(reg, "chargeguard_background_job_failures_total", "ticker") == 1.0);
    cg::test::run_async(io, [&]() -> net::awaitable<void> { co_await net::sleep_for(50ms); });
    BOOST_TEST(raw->passes == at_stop);  // none after the stop
}

BOOST_AUTO_TEST_CASE(a_job_that_is_done_ends_and_a_computed_wait_replaces_the_interval) {
    asio::io_context io;
    auto st = std::make_shared<job_state>();
    net::job_spec job;
    job.name = "once-done";
    job.interval = 1h;  // never waited: the computed wait is used
    job.first_after = 0ms;
    job.next_wait = [] { return std::chrono::steady_clock::duration(1ms); };
    auto* raw = st.get();
    st->task.start_job(
        io.get_executor(), st, job,
        [raw]() -> net::awaitable<bool> {
            return [](job_state* s) -> net::awaitable<bool> { co_return ++s->passes < 3; }(raw);
        },
        logger());
    cg::test::run_async(
        io,
        [&]() -> net::awaitable<void> {
            for (int i = 0; i < 200 && raw->passes < 3; ++i) co_await net::sleep_for(5ms);
            co_await net::sleep_for(20ms);
            co_await raw->task.stop();  // already ended: returns at once
        },
        5s);
    BOOST_TEST(raw->passes == 3);
}

BOOST_AUTO_TEST_SUITE_END()
