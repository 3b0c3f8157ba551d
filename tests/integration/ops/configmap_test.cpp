// ops_e2e: the operator's tools (tail, dead-letters, reconcile) run beside `consume` with the ConfigMap's
// variables exported take no billing event from it.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

namespace {

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (!line.empty()) out.push_back(line);
    return out;
}

// The shipped ConfigMap's data (deploy/kubernetes/chargeguard.yaml), as a debug pod with the same envFrom has
// it — except PG*, which stay this test's server's (the ConfigMap's name the cluster's PostgreSQL), and the
// key file, which `key_file` replaces. Set for the life of the object, then restored.
struct configmap_env {
    std::vector<std::pair<std::string, std::optional<std::string>>> saved;
    explicit configmap_env(const std::string& key_file, std::map<std::string, std::string> more = {}) {
        std::map<std::string, std::string> vars = {
            {"CHARGEGUARD_TOPIC", "billing"},
            {"CHARGEGUARD_CHANNEL", "chargeguard"},
            {"CHARGEGUARD_LOOKUPD_HTTP_ADDRESS", "nsqlookupd.billing.svc.cluster.local:4161"},
            {"CHARGEGUARD_MAX_IN_FLIGHT", "200"},
            {"CHARGEGUARD_MSG_TIMEOUT", "60s"},
            {"CHARGEGUARD_SHUTDOWN_TIMEOUT", "30"},
            {"CHARGEGUARD_KEY_NAMESPACE", "billing-prod"},
            {"CHARGEGUARD_HEALTH_LISTEN", "0.0.0.0:9180"},
            {"CHARGEGUARD_STRIPE_KEY_FILE", key_file},
        };
        for (auto& [k, v] : more) vars[k] = v;
        for (const auto& [k, v] : vars) {
            const char* old = std::getenv(k.c_str());
            saved.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
            ::setenv(k.c_str(), v.c_str(), 1);
        }
    }
    ~configmap_env() {
        for (const auto& [k, v] : saved) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
    }
};

}  // namespace

// The scenario on the real nsqd 1.3.0: events wait in `consume`'s channel `chargeguard`; with the
// ConfigMap's variables exported, an operator runs tail (the sidecar's channel refused; --max-messages 5 on
// its own ephemeral channel prints 5 and exits), dead-letters (a replay with CHARGEGUARD_REASON set does not
// become a bulk replay) and reconcile (CHARGEGUARD_PUBLISH set publishes nothing). Every event is still
// charged exactly once.
BOOST_FIXTURE_TEST_CASE(configmap_environment_tools_beside_consume_take_no_billing_event, ops) {
    const char* bin = std::getenv("NSQD_BIN");
    if (!bin) {
        BOOST_TEST_MESSAGE("skipped: NSQD_BIN is not set (the real nsqd 1.3.0 is not on this machine)");
        return;
    }
    real_nsqd real(bin);
    run(
        *this,
        [&]() -> net::awaitable<void> {
            co_await migrate();
            const std::string p = "2026-07";
            std::set<std::string> keys;
            std::string all_events;
            int published = 0;
            auto batch = [&](int n) {
                std::string lines;
                for (int i = 0; i < n; ++i, ++published) {
                    auto cust = "env-" + std::to_string(published);
                    lines += event_json(cust, p, 700 + published, "cus_env") + "\n";
                    keys.insert(key_of(cust, p));
                }
                all_events += lines;
                return write_file("batch-" + std::to_string(published) + ".jsonl", lines);
            };
            auto publish = [&](const std::string& file) {
                return argv("publish", "--nsqd-tcp-address", real.tcp_address(), "--topic", topic, file);
            };
            // consume first, configured on its command line (the ConfigMap is not exported yet).
            auto& consumer = spawn_consume(real.tcp_address());
            // Publish only once consume's SUB has created its channel: nsqd hands a topic's messages
            // published before any channel exists to the first channel created — tail's own, below, if
            // consume were still starting — and consume's channel would never see them.
            // (Every argument named before the co_await: g++ 12 destroys some temporaries in a co_await's
            // arguments twice — a heap-allocated string's a double free; docs/contributing.md "Toolchain
            // facts".)
            net::host_port stats_at;
            stats_at.host = "127.0.0.1";
            stats_at.port = real.http;
            const std::string stats_target = "/stats?format=json&topic=" + topic + "&channel=" + channel;
            const std::string json_type = "application/json";
            const milliseconds stats_limit = seconds(2);
            bool subscribed = false;
            for (int i = 0; i < 600 && !subscribed; ++i) {
                auto stats = co_await nsq::http_get(stats_at, stats_target, json_type, stats_limit);
                subscribed = stats && stats->status == 200 &&
                             stats->body.find("\"channel_name\":\"" + channel + "\"") != std::string::npos &&
                             stats->body.find("\"client_count\":0") == std::string::npos;
                if (!subscribed) co_await net::sleep_for(milliseconds(100));
            }
            BOOST_TEST_REQUIRE(subscribed, consumer.err());
            child* c = nullptr;
            auto first = batch(20);
            bool ok = false;
            for (int i = 0; i < 100 && !ok; ++i) {  // nsqd is starting: publish retries until it answers
                ok = co_await run_cmd(c, publish(first)) == 0;
                if (!ok) co_await net::sleep_for(milliseconds(100));
            }
            BOOST_TEST_REQUIRE(ok, c->err());

            auto key_file = write_file("stripe_api_key", stripe_key + "\n");
            {
                configmap_env env(key_file,
                                  {{"CHARGEGUARD_REASON", "stripe"}, {"CHARGEGUARD_PUBLISH", "true"}});
                BOOST_TEST(co_await run_cmd(c, argv("tail", "--topic", topic, "--channel", channel,
                                                    "--nsqd-tcp-address", real.tcp_address())) == 64);
                BOOST_TEST(c->err().find("the sidecar's channel") != std::string::npos, c->err());
                // tail's channel only sees what is published after it subscribed: publish one event at a
                // time until it has printed its 5 and exited.
                auto& tail = spawn(argv("tail", "--topic", topic, "--nsqd-tcp-address", real.tcp_address(),
                                        "--max-messages", "5", "--health-listen", "127.0.0.1:0"));
                int status = 0;
                bool exited = false;
                for (int i = 0; i < 200 && !exited; ++i) {
                    BOOST_TEST_REQUIRE(co_await run_cmd(c, publish(batch(1))) == 0, c->err());
                    exited = ::waitpid(tail.pid, &status, WNOHANG) == tail.pid;
                }
                if (exited) tail.pid = -1;
                BOOST_TEST_REQUIRE(exited, tail.err());
                BOOST_TEST(WIFEXITED(status));
                BOOST_TEST(WEXITSTATUS(status) == 0, tail.err());
                BOOST_TEST(lines_of(tail.out()).size() == 5u, tail.out());
                BOOST_TEST(tail.err().find("\"channel\":\"chargeguard\"") == std::string::npos, tail.err());

                BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "list", "--pg-dsn", dsn())) == 0,
                           c->err());
                BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "replay", "--pg-dsn", dsn(),
                                                    "--nsqd-tcp-address", real.tcp_address())) == 64);
                BOOST_TEST(c->err().find("give letter IDs or --reason") != std::string::npos, c->err());
            }
            const auto total = static_cast<std::size_t>(published);
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return fake->charges().size() >= total; }, seconds(60)),
                consumer.err());
            co_await stop_cleanly(consumer);
            co_await expect_charged_once(keys);

            auto expected = write_file("all.jsonl", all_events);
            {
                configmap_env env(key_file, {{"CHARGEGUARD_PUBLISH", "true"}});
                auto a = argv("reconcile", "--expected", expected, "--period", p, "--key-namespace",
                              key_namespace, "--pg-dsn", dsn(), "--json");
                auto s = stripe_args();
                a.insert(a.end(), s.begin(), s.end());
                BOOST_TEST(co_await run_cmd(c, a) == 0, c->out() + c->err());
                auto r = parse_report(c->out());
                BOOST_TEST(r.republished == 0);
                BOOST_TEST(r.unexplained == 0);
            }
            co_await expect_charged_once(keys);
        },
        seconds(180));
}
