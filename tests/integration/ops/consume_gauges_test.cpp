// ops_e2e: what `consume` exports about its work: the age of the oldest pending row, `chargeguard probe`
// against it, and the channel-depth gauge read from fake-nsqd, through nsqlookupd and from the real nsqd.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

// consume exports the age of the oldest pending ledger row (a row left pending two minutes ago by a worker
// that died) and how many are pending; `chargeguard probe` is 0 on /healthz, 1 on a 404 and on a closed port.
BOOST_FIXTURE_TEST_CASE(consume_exports_oldest_pending_age_and_probe_answers, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, lease_until, created_at) VALUES ('" +
            key_of("stuck", "2026-09") +
            "', 'stuck', '2026-09', 700, 'usd', 'cus_s', 'pending', now() + interval '1 hour', "
            "now() - interval '120 seconds')");
        auto& consumer = spawn_consume(nsqd->tcp_address());
        std::optional<unsigned short> port;
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return (port = consumer.logged_port()).has_value(); }, seconds(20)),
            consumer.err());
        auto base = "http://127.0.0.1:" + std::to_string(*port);
        auto cl = http::client::create(io.get_executor(), base, {}, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        double age = -1, pending = -1;
        auto gauge = [](const std::string& text, const std::string& name) {
            auto at = text.find("\n" + name + " ");
            return at == std::string::npos ? -1.0 : std::stod(text.substr(at + name.size() + 2));
        };
        for (int i = 0; i < 200 && !(age >= 120 && pending == 1); ++i) {
            http::request req;
            req.target = "/metrics";
            auto r = co_await (*cl)->request(std::move(req));
            BOOST_TEST_REQUIRE(r.ok());
            age = gauge(r.resp.body, "chargeguard_billing_oldest_pending_age_seconds");
            pending = gauge(r.resp.body, "chargeguard_billing_pending_records");
            if (!(age >= 120 && pending == 1)) co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(age >= 120);
        BOOST_TEST(age < 600);
        BOOST_TEST(pending == 1);

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, argv("probe", base + "/healthz")) == 0, c->out());
        BOOST_TEST(c->out().find("/healthz: 200\n") != std::string::npos,
                   c->out());  // the status, then the body
        BOOST_TEST(co_await run_cmd(c, argv("probe", base + "/no-such-path")) == 1, c->out());
        co_await stop_cleanly(consumer);
        BOOST_TEST(co_await run_cmd(c, argv("probe", "--timeout", "1", base + "/healthz")) == 1, c->out());
        BOOST_TEST(co_await run_cmd(c, argv("probe", "not-a-url")) == 1, c->out());
    });
}

namespace {

// chargeguard_nsq_channel_depth's value for this nsqd in a /metrics text; -1 when the series is absent.
double channel_depth(const std::string& metrics, const std::string& nsqd_http) {
    const std::string series = "chargeguard_nsq_channel_depth{channel=\"" + channel + "\",nsqd=\"" +
                               nsqd_http + "\",topic=\"" + topic + "\"} ";
    auto at = metrics.find("\n" + series);
    return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + 1 + series.size()));
}

// An nsqd either way: its addresses, and the steps the test takes on it. `lookupd`: consume is given no
// --nsqd-http-address, and finds the nsqd's HTTP address through this nsqlookupd's /lookup
// (broadcast_address and http_port).
struct depth_nsqd {
    std::string tcp, http, lookupd;
    std::function<net::awaitable<void>(bool)> pause;  // the consume's channel paused, or not
    std::function<net::awaitable<void>(std::string)> publish;
};

// Three events wait in a paused channel: consume reads depth 3 from nsqd's /stats; unpaused, it charges
// them and the depth falls to 0. A consume without --nsqd-http-address says why it has no series.
net::awaitable<void> depth_follows_stats(ops& t, depth_nsqd n) {
    co_await n.pause(true);
    for (int i = 0; i < 3; ++i)
        co_await n.publish(event_json("depth-" + std::to_string(i), "2026-09", 100 + i));
    auto& consumer = t.spawn_consume(
        n.tcp, n.lookupd.empty()
                   ? std::vector<std::string>{"--nsqd-http-address", n.http, "--channel-depth-interval", "1s"}
                   : std::vector<std::string>{"--lookupd-http-address", n.lookupd, "--lookupd-poll-interval",
                                              "1s", "--channel-depth-interval", "1s"});
    std::optional<unsigned short> port;
    BOOST_TEST_REQUIRE(
        co_await eventually([&] { return (port = consumer.logged_port()).has_value(); }, seconds(20)),
        consumer.err());
    auto cl =
        http::client::create(t.io.get_executor(), "http://127.0.0.1:" + std::to_string(*port), {}, logger());
    BOOST_TEST_REQUIRE(cl.has_value());
    auto depth = [&]() -> net::awaitable<double> {
        http::request req;
        req.target = "/metrics";
        auto r = co_await (*cl)->request(std::move(req));
        BOOST_TEST_REQUIRE(r.ok());
        co_return channel_depth(r.resp.body, n.http);
    };
    double d = -1;
    for (int i = 0; i < 300 && d != 3; ++i) {
        d = co_await depth();
        if (d != 3) co_await net::sleep_for(milliseconds(50));
    }
    BOOST_TEST_REQUIRE(d == 3, consumer.err());
    BOOST_TEST(t.fake->charges().empty());
    co_await n.pause(false);
    BOOST_TEST_REQUIRE(co_await eventually([&] { return t.fake->charges().size() == 3u; }, seconds(40)),
                       consumer.err());
    for (int i = 0; i < 300 && d != 0; ++i) {
        d = co_await depth();
        if (d != 0) co_await net::sleep_for(milliseconds(50));
    }
    BOOST_TEST(d == 0, consumer.err());
    co_await t.stop_cleanly(consumer);
    if (!n.lookupd.empty()) co_return;
    auto& blind = t.spawn_consume(n.tcp);
    BOOST_TEST(co_await eventually(
                   [&] {
                       return blind.err().find(
                                  "chargeguard_nsq_channel_depth is not read for the nsqds given "
                                  "with --nsqd-tcp-address") != std::string::npos;
                   },
                   seconds(20)),
               blind.err());
    co_await t.stop_cleanly(blind);
}

}  // namespace

// The gauge against fake-nsqd, whose /stats answers as nsqd 1.3.0's does.
BOOST_FIXTURE_TEST_CASE(channel_depth_gauge_reads_fake_nsqd_stats, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        depth_nsqd n;
        n.tcp = nsqd->tcp_address();
        n.http = "127.0.0.1:" + std::to_string(nsqd->http_port());
        n.pause = [this](bool on) -> net::awaitable<void> {
            nsqd->pause_channel(topic, channel, on);
            co_return;
        };
        n.publish = [this](std::string body) -> net::awaitable<void> {
            nsqd->publish(topic, std::move(body));
            co_return;
        };
        co_await depth_follows_stats(*this, n);
    });
}

// The nsqd's HTTP address as fake-nsqlookupd lists it, with no --nsqd-http-address.
BOOST_FIXTURE_TEST_CASE(channel_depth_gauge_finds_nsqd_through_lookupd, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        test::nsq::fake_nsqlookupd lookupd(io.get_executor());
        BOOST_TEST_REQUIRE(lookupd.start().has_value());
        lookupd.add_producer(topic, nsqd->producer());
        depth_nsqd n;
        n.tcp = nsqd->tcp_address();
        n.http = "127.0.0.1:" + std::to_string(nsqd->http_port());
        n.lookupd = lookupd.http_address();
        n.pause = [this](bool on) -> net::awaitable<void> {
            nsqd->pause_channel(topic, channel, on);
            co_return;
        };
        n.publish = [this](std::string body) -> net::awaitable<void> {
            nsqd->publish(topic, std::move(body));
            co_return;
        };
        co_await depth_follows_stats(*this, n);
        BOOST_TEST(lookupd.lookups() > 0u);
    });
}

// The same against the real nsqd 1.3.0, driven over its HTTP API.
BOOST_FIXTURE_TEST_CASE(channel_depth_gauge_reads_real_nsqd_stats, ops) {
    const char* bin = std::getenv("NSQD_BIN");
    if (!bin) {
        BOOST_TEST_MESSAGE("skipped: NSQD_BIN is not set (the real nsqd 1.3.0 is not on this machine)");
        return;
    }
    real_nsqd real(bin);
    run(*this, [&]() -> net::awaitable<void> {
        co_await migrate();
        const std::string http_address = "127.0.0.1:" + std::to_string(real.http);
        auto cl = http::client::create(io.get_executor(), "http://" + http_address, {}, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        auto post = [&](std::string target, std::string body) -> net::awaitable<bool> {
            http::request req;
            req.method = "POST";
            req.target = std::move(target);
            req.body = std::move(body);
            auto r = co_await (*cl)->request(std::move(req));
            co_return r.ok() && r.resp.status == 200;
        };
        // nsqd is up once it answers.
        bool up = false;
        for (int i = 0; i < 100 && !up; ++i) {
            up = co_await post("/topic/create?topic=" + topic, "");
            if (!up) co_await net::sleep_for(milliseconds(100));
        }
        BOOST_TEST_REQUIRE(up);
        bool created = co_await post("/channel/create?topic=" + topic + "&channel=" + channel, "");
        BOOST_TEST_REQUIRE(created);
        depth_nsqd n;
        n.tcp = real.tcp_address();
        n.http = http_address;
        n.pause = [&](bool on) -> net::awaitable<void> {
            bool ok = co_await post(std::string(on ? "/channel/pause" : "/channel/unpause") +
                                        "?topic=" + topic + "&channel=" + channel,
                                    "");
            BOOST_TEST_REQUIRE(ok);
        };
        n.publish = [&](std::string body) -> net::awaitable<void> {
            bool ok = co_await post("/pub?topic=" + topic, std::move(body));
            BOOST_TEST_REQUIRE(ok);
        };
        co_await depth_follows_stats(*this, n);
    });
}
