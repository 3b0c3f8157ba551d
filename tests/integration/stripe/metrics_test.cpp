// stripe::client's Prometheus metrics against fake-stripe: every figure is read back from the rendered
// text format, as a scrape of /metrics would see it.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "fake_fixture.hpp"
#include "metrics/registry.hpp"
#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::cert;
using cg::test::charge_into;
using cg::test::charge_req;
using cg::test::cls;
using cg::test::run_async;
using stripe::outcome_class;

namespace {

using label_map = std::map<std::string, std::string>;

// The shared fake-stripe fixture, plus a scrape of the registry its clients record into.
struct metrics_fixture : test::fake_stripe_fixture {
    std::map<std::string, test::prom_family> scrape() const { return test::parse_prometheus(reg.render()); }
};

// The value of the sample `name` (the family's own name unless given) with exactly `labels`; throws
// when the series is missing, so an unrecorded metric fails loudly.
double value(const std::map<std::string, test::prom_family>& fams, const std::string& family,
             const label_map& labels, std::string name = {}) {
    if (name.empty()) name = family;
    auto f = fams.find(family);
    if (f == fams.end()) throw std::runtime_error("no metric family " + family);
    for (const auto& s : f->second.samples)
        if (s.name == name && s.labels == labels) return s.value;
    throw std::runtime_error("no sample " + name + " with the given labels");
}

// Sum over every series of a family (the sample named like the family, or `name`).
double total(const std::map<std::string, test::prom_family>& fams, const std::string& family,
             std::string name = {}) {
    if (name.empty()) name = family;
    auto f = fams.find(family);
    if (f == fams.end()) throw std::runtime_error("no metric family " + family);
    double sum = 0;
    for (const auto& s : f->second.samples)
        if (s.name == name) sum += s.value;
    return sum;
}

const std::string requests = "chargeguard_stripe_requests_total";
const std::string duration = "chargeguard_stripe_request_duration_seconds";
const std::string attempts = "chargeguard_stripe_attempts_total";
const std::string retries = "chargeguard_stripe_retries_total";
const std::string replays = "chargeguard_stripe_idempotent_replays_total";
const std::string handshakes = "chargeguard_stripe_tls_handshakes_total";
const std::string conn_open = "chargeguard_stripe_connections_open";
const std::string conn_idle = "chargeguard_stripe_connections_idle";
const std::string held = "chargeguard_stripe_pool_held_total";

label_map op_outcome(const std::string& op, const std::string& outcome) {
    return {{"operation", op}, {"outcome", outcome}};
}
label_map op(const std::string& o) {
    return {{"operation", o}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(client_metrics)

BOOST_AUTO_TEST_CASE(outcomes_attempts_retries_replays_and_connections_are_exported) {
    metrics_fixture f;
    f.fake->decline("cus_broke", {"card_declined", "insufficient_funds"});
    auto c = f.client(&f.reg);
    auto before = f.scrape();  // every series exists at zero before the first call
    BOOST_TEST(value(before, requests, op_outcome("create_charge", "succeeded")) == 0);
    BOOST_TEST(value(before, attempts, op("list_charges")) == 0);

    auto o = run_async(f.io, [&]() -> asio::awaitable<std::vector<stripe::charge_outcome>> {
        std::vector<stripe::charge_outcome> out;
        out.push_back(co_await c->create_charge(charge_req("m-ok")));
        out.push_back(co_await c->create_charge(charge_req("m-dec", "cus_broke")));
        f.fake->faults().rate_limit = 1;  // one 429, then the retry with the same key succeeds
        out.push_back(co_await c->create_charge(charge_req("m-429")));
        out.push_back(co_await c->create_charge(charge_req("m-ok")));  // replayed
        auto got = co_await c->retrieve_charge(out[0].charge_id);
        BOOST_TEST(got.has_value());
        co_return out;
    });
    BOOST_TEST_REQUIRE(o.size() == 4u);
    BOOST_TEST(cls(o[0].cls) == "succeeded", o[0].message);
    BOOST_TEST(cls(o[1].cls) == "declined", o[1].message);
    BOOST_TEST(cls(o[2].cls) == "succeeded", o[2].message);
    BOOST_TEST(o[2].attempts == 2u);
    BOOST_TEST(o[3].replayed);

    auto m = f.scrape();
    BOOST_TEST(m.at(requests).type == "counter");
    BOOST_TEST(value(m, requests, op_outcome("create_charge", "succeeded")) == 3);
    BOOST_TEST(value(m, requests, op_outcome("create_charge", "declined")) == 1);
    BOOST_TEST(value(m, requests, op_outcome("create_charge", "retry_same_key")) == 0);
    BOOST_TEST(value(m, requests, op_outcome("retrieve_charge", "succeeded")) == 1);
    BOOST_TEST(total(m, requests) == 5);  // nothing counted twice or under another label

    // Four charges took five HTTP attempts: the retried call is visible.
    BOOST_TEST(value(m, attempts, op("create_charge")) == 5);
    BOOST_TEST(value(m, attempts, op("create_charge")) >
               value(m, requests, op_outcome("create_charge", "succeeded")) +
                   value(m, requests, op_outcome("create_charge", "declined")));
    BOOST_TEST(value(m, attempts, op("retrieve_charge")) == 1);
    BOOST_TEST(value(m, retries, {{"operation", "create_charge"}, {"reason", "rate_limited"}}) == 1);
    BOOST_TEST(total(m, retries) == 1);
    BOOST_TEST(value(m, replays, op("create_charge")) == 1);
    BOOST_TEST(total(m, replays) == 1);

    BOOST_TEST(m.at(duration).type == "histogram");
    BOOST_TEST(value(m, duration, op("create_charge"), duration + "_count") == 4);
    BOOST_TEST(value(m, duration, op("retrieve_charge"), duration + "_count") == 1);
    BOOST_TEST(value(m, duration, op("create_charge"), duration + "_sum") > 0);
    // The retried call waited at least its 10 ms backoff: one observation lies above 10 ms.
    BOOST_TEST(test::bucket_count(m.at(duration), "0.01", op("create_charge")) <= 3);

    auto s = c->http_stats();
    BOOST_TEST(s.handshakes == 1u);  // keep-alive: one connection for everything
    BOOST_TEST(value(m, handshakes, {}) == static_cast<double>(s.handshakes));
    BOOST_TEST(m.at(conn_open).type == "gauge");
    BOOST_TEST(value(m, conn_open, {}) == static_cast<double>(s.open));
    BOOST_TEST(value(m, conn_idle, {}) == static_cast<double>(s.idle));
    BOOST_TEST(value(m, conn_idle, {}) == 1);
}

BOOST_AUTO_TEST_CASE(clients_sharing_a_registry_add_up_and_give_back_their_connections) {
    metrics_fixture f;
    auto a = f.client(&f.reg);
    auto b = f.client(&f.reg);
    auto quiet = f.client(nullptr);  // no registry: its calls appear nowhere
    run_async(f.io, [&]() -> asio::awaitable<void> {
        (void)co_await a->create_charge(charge_req("s-a"));
        (void)co_await b->create_charge(charge_req("s-b"));
        (void)co_await quiet->create_charge(charge_req("s-q"));
        auto r = co_await b->call("POST", "/v1/charges", "amount=1", "s-bad");  // validation error
        BOOST_TEST(cls(r.cls) == "rejected", r.message);
    });
    auto m = f.scrape();
    BOOST_TEST(value(m, requests, op_outcome("create_charge", "succeeded")) == 2);
    BOOST_TEST(value(m, requests, op_outcome("call", "rejected")) == 1);
    BOOST_TEST(value(m, attempts, op("call")) == 1);
    BOOST_TEST(value(m, handshakes, {}) == 2);
    BOOST_TEST(value(m, conn_open, {}) == 2);
    BOOST_TEST(value(m, conn_idle, {}) == 2);
    b.reset();  // its pooled connection closes with it
    m = f.scrape();
    BOOST_TEST(value(m, conn_open, {}) == 1);
    BOOST_TEST(value(m, conn_idle, {}) == 1);
    BOOST_TEST(value(m, handshakes, {}) == 2);  // a counter never goes back
    BOOST_TEST(value(m, requests, op_outcome("create_charge", "succeeded")) == 2);
}

// Past --stripe-eager-connections (here 1) the pool waits for an answer before it grows: of 4 charges sent
// at once, the first connects and the other 3 are held (counted), then served as answers come in.
BOOST_AUTO_TEST_CASE(requests_held_by_the_pool_are_counted) {
    metrics_fixture f;
    auto cfg = f.config();
    cfg.max_connections = 8;
    cfg.eager_connections = 1;
    auto c = f.client(cfg, &f.reg);
    BOOST_TEST(value(f.scrape(), held, {}) == 0);
    std::vector<stripe::charge_outcome> out(4);
    run_async(f.io, [&]() -> asio::awaitable<void> {
        int left = static_cast<int>(out.size());
        net::steady_timer done(f.io, net::steady_timer::time_point::max());
        for (std::size_t i = 0; i < out.size(); ++i)
            asio::co_spawn(
                f.io, charge_into(c.get(), charge_req("held-" + std::to_string(i)), &out[i], &left, &done),
                asio::detached);
        co_await done.async_wait();
    });
    for (const auto& o : out) BOOST_TEST(cls(o.cls) == "succeeded", o.message);
    auto m = f.scrape();
    BOOST_TEST(c->http_stats().held == 3u);
    BOOST_TEST(value(m, held, {}) == 3);
    BOOST_TEST(m.at(held).type == "counter");
}

BOOST_AUTO_TEST_SUITE_END()
