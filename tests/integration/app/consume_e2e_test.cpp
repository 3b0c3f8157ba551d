// `chargeguard consume` end to end: the real binary, spawned as a child process, against fake-nsqd (real
// socket) and fake-stripe over TLS, both running on this test's io_context, and a scratch PostgreSQL database
// the child migrates itself (--migrate). Everything is awaited on fake-nsqd counters, fake-stripe state or
// the child's own log and /metrics — never on sleeps. Skipped (exit 77) without PGHOST.
#define BOOST_TEST_MODULE consume_e2e
#define BOOST_TEST_NO_MAIN
#include <signal.h>
#include <simdjson.h>

#include <asio/ip/tcp.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <set>
#include <sstream>

#include "billing/machine/key.hpp"
#include "http/client.hpp"
#include "support/chargeguard_e2e.hpp"
#include "support/pg_main.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/integration/nsq/helpers.hpp"

using namespace cg;
using namespace std::chrono;
using nsqtest::eventually;

namespace {

const std::string topic = "billing", channel = "chargeguard", key_namespace = "e2e";
const std::string stripe_key = "sk_test_e2e_never_logged";

std::string event_json(int customer, const std::string& period, std::int64_t amount) {
    return R"({"customer_id":"cust-)" + std::to_string(customer) + R"(","billing_period":")" + period +
           R"(","amount_cents":)" + std::to_string(amount) +
           R"(,"currency":"usd","stripe_customer_id":"cus_e2e","description":"plan"})";
}

std::string key_of(int customer, const std::string& period) {
    return billing::base_key(key_namespace, "cust-" + std::to_string(customer), period);
}

// One `chargeguard consume` process: stderr (JSON log lines) goes to a file, stdout to /dev/null.
struct child : test::child_process {
    unsigned short health_port = 0;

    std::string log() const { return err(); }
};

// Test state on one io_context (inherited from the Stripe fixture, with fake-stripe already listening): the
// fake nsqd, the scratch database, a pool to read the ledger with, and the children started.
struct e2e : test::chargeguard_e2e<child> {
    // The file's constants (the base class has members of the same names).
    e2e() : chargeguard_e2e("consume", ::topic, ::channel, ::stripe_key) {}

    test::nsq::channel_counts counts() const { return nsqd->channel(topic, channel); }

    std::vector<std::string> base_args() const {
        return {"consume", "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd->tcp_address(),
                "--heartbeat-interval", "1s", "--pg-dsn", dsn(), "--migrate", "--stripe-api-base",
                "https://127.0.0.1:" + std::to_string(port), "--stripe-ca-file", test::cert("ca.pem"),
                "--stripe-retry-initial", "0.05", "--stripe-retry-max", "0.2", "--key-namespace",
                key_namespace, "--lease-held-delay", "200ms", "--retry-same-key-delay", "200ms",
                "--indeterminate-delay", "300ms", "--health-listen", "127.0.0.1:0", "--shutdown-timeout",
                "10",
                // An ASan build's loop can be late; liveness is not what these tests are about.
                "--max-loop-lag", "5"};
    }

    child& spawn(std::vector<std::string> extra) {
        auto args = base_args();
        args.insert(args.end(), extra.begin(), extra.end());
        return spawn_raw(args, true);
    }

    // `args` after the executable; `with_command` false: `args` lacks the leading "consume".
    child& spawn_raw(std::vector<std::string> args, bool with_command = false) {
        if (!with_command) args.insert(args.begin(), "consume");
        return children.spawn(std::move(args), false);
    }

    // Waits (on timers, the loop keeps serving the fakes) for the child to log its health port.
    net::awaitable<void> await_port(child& c) {
        bool up = co_await eventually([&] { return c.logged_port().has_value(); }, seconds(20));
        BOOST_TEST_REQUIRE(up, c.log());
        c.health_port = *c.logged_port();
    }

    net::awaitable<http::client_result> get(const child& c, std::string path) {
        auto cl = http::client::create(io.get_executor(), "http://127.0.0.1:" + std::to_string(c.health_port),
                                       {}, logger());
        BOOST_TEST_REQUIRE(cl.has_value());
        http::request req;
        req.target = std::move(path);
        co_return co_await (*cl)->request(std::move(req));
    }

    net::awaitable<std::map<std::string, test::prom_family>> scrape(const child& c) {
        auto r = co_await get(c, "/metrics");
        BOOST_TEST_REQUIRE(r.ok());
        BOOST_TEST_REQUIRE(r.resp.status == 200);
        co_return test::parse_prometheus(r.resp.body);
    }

    std::map<std::string, double> outcomes(const std::map<std::string, test::prom_family>& fams) const {
        std::map<std::string, double> out;
        auto it = fams.find("chargeguard_billing_messages_total");
        BOOST_TEST_REQUIRE((it != fams.end()));
        for (const auto& s : it->second.samples) out[s.labels.at("outcome")] += s.value;
        return out;
    }

    // SIGTERM: the consumer drains and the process exits 0, having logged a clean shutdown.
    net::awaitable<void> terminate_cleanly(child& c) {
        ::kill(c.pid, SIGTERM);
        int code = co_await wait_exit(c, seconds(20));
        BOOST_TEST(code == 0, c.log());
        // nsqd reads the last FINs and CLS before it sees the close.
        BOOST_TEST(co_await eventually([&] { return nsqd->client_count() == 0; }));
        auto text = c.log();
        BOOST_TEST(text.find("\"msg\":\"consumer stopped\"") != std::string::npos, text);
        BOOST_TEST(text.find("\"clean\":true") != std::string::npos, text);
        BOOST_TEST(text.find(stripe_key) == std::string::npos);  // the key is never logged
    }
};

template <typename F>
void run(e2e& f, F body, seconds limit = seconds(60)) {
    test::run_async(f.io, body, limit);
}

}  // namespace

// 150 (customer, period) pairs, 50 exact duplicates interleaved with their originals (so many arrive while
// the original's charge is in flight: "lease held" requeues), 3 invalid lines: every message FINed, exactly
// one charge per pair, the ledger matches fake-stripe, three dead letters, /metrics adds up, clean SIGTERM.
BOOST_FIXTURE_TEST_CASE(charges_each_pair_once_dead_letters_invalid_and_drains, e2e) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        fake->faults().latency_ms = 20;  // a duplicate right behind its original finds the row leased
        std::set<std::string> keys;
        const std::vector<std::string> invalid = {"not json at all", R"({"customer_id":"cust-1"})",
                                                  event_json(7, "2024-01", -5)};
        for (int i = 0; i < 150; ++i) {
            std::string period = i % 2 ? "2024-06" : "2024-05";
            nsqd->publish(topic, event_json(i / 2, period, 1000 + i));
            keys.insert(key_of(i / 2, period));
            if (i < 50) nsqd->publish(topic, event_json(i / 2, period, 1000 + i));  // exact duplicate
            if (i % 50 == 25) nsqd->publish(topic, invalid[static_cast<std::size_t>(i / 50)]);
        }
        BOOST_TEST_REQUIRE(keys.size() == 150u);
        const std::uint64_t published = 203;

        // Duplicates wait for their original's lease to be able to expire: keep it short here.
        auto& c = spawn({"--max-in-flight", "50", "--lease", "2s", "--lease-renew-interval", "500ms"});
        co_await await_port(c);
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return counts().finish_count == published; }, seconds(40)), c.log());
        // Readiness reports both dependencies.
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST_REQUIRE(ready.ok());
        BOOST_TEST(ready.resp.status == 200, ready.resp.body);
        BOOST_TEST(ready.resp.body.find("ok nsq") != std::string::npos, ready.resp.body);
        BOOST_TEST(ready.resp.body.find("ok postgres") != std::string::npos, ready.resp.body);

        auto ch = counts();
        BOOST_TEST(ch.depth == 0);
        BOOST_TEST(ch.in_flight == 0);
        BOOST_TEST(ch.deferred == 0);
        BOOST_TEST(ch.timeout_count == 0u);
        co_await expect_charged_once(keys);

        auto letters = co_await query(
            "SELECT convert_from(raw_body, 'UTF8'), reason, topic, channel, "
            "length(nsq_message_id) FROM dead_letters ORDER BY id");
        BOOST_TEST(letters.size() == 3u);
        std::set<std::string> bodies;
        for (std::size_t i = 0; i < letters.size(); ++i) {
            bodies.insert(std::string(letters.text(i, 0)));
            BOOST_TEST(!letters.text(i, 1).empty());
            BOOST_TEST(letters.text(i, 2) == topic);
            BOOST_TEST(letters.text(i, 3) == channel);
            BOOST_TEST(letters.text(i, 4) == "16");
        }
        BOOST_TEST((bodies == std::set<std::string>(invalid.begin(), invalid.end())));

        // Every delivery got exactly one verdict: FINs are charged + duplicates + dead letters, REQs are the
        // duplicates that found their original's lease held.
        auto fams = co_await scrape(c);
        auto out = outcomes(fams);
        BOOST_TEST(out["charged"] == 150);
        BOOST_TEST(out["duplicate_prevented"] == 50);
        BOOST_TEST(out["dead_lettered"] == 3);
        BOOST_TEST(out["requeued_lease_held"] == static_cast<double>(ch.requeue_count));
        double total = 0;
        for (const auto& [k, v] : out) total += v;
        BOOST_TEST(total == static_cast<double>(ch.finish_count + ch.requeue_count));
        // Group commit: every valid delivery's pre-flight insert and every charge's settle went through a
        // ledger batch, whatever their sizes (the invalid lines never reach the ledger).
        std::map<std::string, double> batch_rows;
        auto rows_it = fams.find("chargeguard_ledger_batch_rows");
        BOOST_TEST_REQUIRE((rows_it != fams.end()));
        for (const auto& s : rows_it->second.samples)
            if (s.name == "chargeguard_ledger_batch_rows_sum")
                batch_rows[s.labels.at("statement")] += s.value;
        BOOST_TEST(batch_rows["preflight"] == total - out["dead_lettered"]);
        BOOST_TEST(batch_rows["settle"] == out["charged"]);

        co_await terminate_cleanly(c);
        auto after = counts();
        BOOST_TEST(after.requeue_count == ch.requeue_count);  // the drain requeued nothing
        BOOST_TEST(after.timeout_count == 0u);
        BOOST_TEST(after.finish_count == published);
    });
}

// Started while PostgreSQL is not there yet (a pod whose database is still starting): consume does not exit
// 1 but waits, retrying with backoff and saying why in its log and on /readyz; once a server answers on that
// address it applies the migrations, starts consuming and charges.
BOOST_FIXTURE_TEST_CASE(startup_waits_for_postgres_then_migrates_and_charges, e2e) {
    const char* ctl = std::getenv("CHARGEGUARD_TEST_PG_CTL");
    if (!ctl) {
        BOOST_TEST_MESSAGE("skipped: CHARGEGUARD_TEST_PG_CTL not set (ci/test sets it)");
        return;
    }
    std::string dir = tmp + "-latepg";
    unsigned short pg_port = 0;
    {
        asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
        pg_port = a.local_endpoint().port();
    }
    run(*this, [&]() -> net::awaitable<void> {
        start_nsqd();
        nsqd->publish(topic, event_json(900, "2024-07", 4242));
        auto args = base_args();
        for (std::size_t i = 0; i + 1 < args.size(); ++i)
            if (args[i] == "--pg-dsn")
                args[i + 1] = "host=127.0.0.1 port=" + std::to_string(pg_port) +
                              " user=postgres dbname=chargeguard_test";
        args.erase(args.begin());  // "consume": spawn() puts the base args back; pass ours as the extras
        auto& c = spawn_raw(args);
        co_await await_port(c);
        BOOST_TEST_REQUIRE(
            co_await eventually(
                [&] { return c.log().find("waiting for PostgreSQL before starting") != std::string::npos; },
                seconds(20)),
            c.log());
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST_REQUIRE(ready.ok());
        BOOST_TEST(ready.resp.status == 503);
        BOOST_TEST(ready.resp.body.find("FAIL startup: waiting for PostgreSQL to apply migrations") !=
                       std::string::npos,
                   ready.resp.body);
        BOOST_TEST(::waitpid(c.pid, nullptr, WNOHANG) == 0);  // still running, not exited 1

        // The database arrives.
        std::string cmd =
            std::string(ctl) + " start " + dir + " " + std::to_string(pg_port) + " >" + dir + ".log 2>&1";
        BOOST_TEST_REQUIRE(std::system(cmd.c_str()) == 0);
        BOOST_TEST_REQUIRE(co_await eventually([&] { return counts().finish_count == 1; }, seconds(40)),
                           c.log());
        BOOST_TEST(fake->charges().size() == 1u);
        auto again = co_await get(c, "/readyz");
        BOOST_TEST(again.resp.body.find("ok startup") != std::string::npos, again.resp.body);
        BOOST_TEST(c.log().find("\"msg\":\"migrations up to date\"") != std::string::npos);
        co_await terminate_cleanly(c);
    });
    std::system((std::string(ctl) + " stop " + dir + " >/dev/null 2>&1; rm -rf " + dir).c_str());
}

// kill -9 while every charge is in flight at Stripe (the fake still completes them: Stripe got the POSTs);
// nsqd requeues the in-flight messages; a second consumer waits out the lease, recovers each pending row by
// charging under the same key, and Stripe replays the first charge: exactly one charge per pair, all charged.
BOOST_FIXTURE_TEST_CASE(crash_mid_charge_recovers_without_charging_twice, e2e) {
    run(*this, [this]() -> net::awaitable<void> {
        test::nsq::fake_nsqd_options o;
        o.requeue_on_disconnect = true;
        start_nsqd(o);
        fake->faults().latency_ms = 2000;
        std::set<std::string> keys;
        for (int i = 0; i < 40; ++i) {
            nsqd->publish(topic, event_json(i, "2024-07", 500 + i));
            keys.insert(key_of(i, "2024-07"));
        }
        // Every REQ while the dead worker's lease runs out is a delivery attempt: allow plenty, so the test
        // is about recovery and not about the give-up path.
        const std::vector<std::string> lease = {"--lease",         "2s", "--lease-renew-interval",   "500ms",
                                                "--max-in-flight", "40", "--stripe-max-connections", "64",
                                                "--max-attempts",  "50"};
        auto& first = spawn(lease);
        co_await await_port(first);
        BOOST_TEST_REQUIRE(co_await eventually([&] { return fake->requests() >= 40u; }, seconds(20)),
                           first.log());
        ::kill(first.pid, SIGKILL);
        BOOST_TEST(co_await wait_exit(first, seconds(10)) == 128 + SIGKILL);
        BOOST_TEST(fake->charges().size() < 40u);  // killed while charges were still in flight
        fake->faults().latency_ms = 0;             // (the calls already received keep their 2 s)
        // Rows in the crash window: pending, a Stripe attempt recorded, nobody to settle them. (All 40 on a
        // fast machine; a slow one may have settled the earliest before the last POST arrived.)
        auto pending = co_await query(
            "SELECT key FROM billing_records WHERE status = 'pending' AND stripe_attempts = 1");
        std::set<std::string> crashed;
        for (std::size_t i = 0; i < pending.size(); ++i) crashed.insert(std::string(pending.text(i, 0)));
        BOOST_TEST_REQUIRE(!crashed.empty());

        // Stripe completes the first process's calls; nobody records them. The second process must.
        auto& second = spawn(lease);
        co_await await_port(second);
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] {
                                   auto ch = counts();
                                   return ch.finish_count == 40 && ch.depth == 0 && ch.in_flight == 0 &&
                                          ch.deferred == 0;
                               },
                               seconds(40)),
                           second.log());
        co_await expect_charged_once(keys);
        // Each crashed row was asked of Stripe by both processes and charged once: the second got a replay.
        for (const auto& k : crashed) BOOST_TEST(fake->posts_for(k) >= 2, k);
        auto fams = co_await scrape(second);
        BOOST_TEST(outcomes(fams)["charged"] == static_cast<double>(crashed.size()));
        double replays = 0;
        for (const auto& s : fams.at("chargeguard_stripe_idempotent_replays_total").samples)
            replays += s.value;
        BOOST_TEST(replays >= static_cast<double>(crashed.size()));
        co_await terminate_cleanly(second);
    });
}

// Stripe slower than --msg-timeout: the keepalive TOUCHes the message while the charge is awaited, so nsqd
// never times it out and never redelivers it; one charge.
BOOST_FIXTURE_TEST_CASE(slow_stripe_is_kept_alive_by_touch, e2e) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        nsqd->record_commands(true);
        fake->faults().latency_ms = 2500;
        nsqd->publish(topic, event_json(1, "2024-08", 4200));
        auto& c = spawn({"--msg-timeout", "1s"});
        co_await await_port(c);
        BOOST_TEST_REQUIRE(co_await eventually([&] { return counts().finish_count == 1u; }, seconds(20)),
                           c.log());
        auto ch = counts();
        BOOST_TEST(ch.timeout_count == 0u);
        BOOST_TEST(ch.requeue_count == 0u);
        std::size_t touches = 0;
        for (const auto& line : nsqd->command_log()) touches += line.rfind("TOUCH ", 0) == 0;
        BOOST_TEST(touches >= 2u);
        std::set<std::string> keys{key_of(1, "2024-08")};  // (g++ 12: no braced list inside co_await)
        co_await expect_charged_once(keys);
        BOOST_TEST(fake->posts_for(key_of(1, "2024-08")) == 1);
        co_await terminate_cleanly(c);
    });
}

// Bad pipeline flags are refused before anything connects, naming the flag.
BOOST_FIXTURE_TEST_CASE(refuses_bad_lease_and_namespace_before_connecting, e2e) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        auto& a = spawn({"--lease", "2s", "--lease-renew-interval", "2s"});
        BOOST_TEST(co_await wait_exit(a, seconds(10)) > 0);
        BOOST_TEST(
            a.log().find("--lease-renew-interval: 2s must be shorter than --lease 2s") != std::string::npos,
            a.log());
        auto& b = spawn({"--key-namespace", "a:b"});
        BOOST_TEST(co_await wait_exit(b, seconds(10)) > 0);
        BOOST_TEST(b.log().find("--key-namespace") != std::string::npos, b.log());
        BOOST_TEST(nsqd->total_connections() == 0u);
    });
}
