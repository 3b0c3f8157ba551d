// Operating chargeguard end to end: `dead-letters` and `reconcile` as the built binary, against fake-nsqd (or
// the real nsqd when NSQD_BIN is set) and fake-stripe over TLS on this test's io_context, a scratch
// PostgreSQL database, and `consume` running beside them. Every wait polls a condition (fake-nsqd counters,
// fake-stripe state, the child's exit) with a deadline. Skipped (exit 77) without PGHOST.
#define BOOST_TEST_MODULE ops_e2e
#define BOOST_TEST_NO_MAIN
#include <netinet/in.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "billing/machine/key.hpp"
#include "http/client.hpp"
#include "nsq/http_get.hpp"
#include "support/chargeguard_e2e.hpp"
#include "support/pg_main.hpp"
#include "support/run_async.hpp"
#include "tests/integration/nsq/helpers.hpp"

using namespace cg;
using namespace std::chrono;
using nsqtest::eventually;
using test::child_process;

namespace {

const std::string topic = "billing", channel = "chargeguard", key_namespace = "ops";
const std::string stripe_key = "sk_test_ops_never_logged";

std::string event_json(const std::string& customer, const std::string& period, std::int64_t amount,
                       const std::string& stripe_customer = "cus_ops") {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","description":"plan"})";
}

std::string key_of(const std::string& customer, const std::string& period) {
    return billing::base_key(key_namespace, customer, period);
}

// argv for a subcommand, built outside co_await expressions (g++ 12: no braced list inside co_await).
template <typename... A>
std::vector<std::string> argv(A&&... a) {
    return std::vector<std::string>{std::string(std::forward<A>(a))...};
}

unsigned short free_port() {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t n = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(s);
    return ntohs(a.sin_port);
}

using child = child_process;

struct ops : test::chargeguard_e2e<> {
    std::vector<std::string> files;

    // The file's constants (the base class has members of the same names).
    ops() : chargeguard_e2e("ops", ::topic, ::channel, ::stripe_key) {}
    ~ops() {
        for (const auto& f : files) ::unlink(f.c_str());
    }

    std::string write_file(const std::string& name, const std::string& text) {
        auto path = tmp + "-" + name;
        std::ofstream(path) << text;
        files.push_back(path);
        return path;
    }

    std::string stripe_base() const { return "https://127.0.0.1:" + std::to_string(port); }
    std::vector<std::string> stripe_args() const {
        return {"--stripe-api-base",      stripe_base(), "--stripe-ca-file",   test::cert("ca.pem"),
                "--stripe-retry-initial", "0.05",        "--stripe-retry-max", "0.2"};
    }

    child& spawn(std::vector<std::string> args) { return children.spawn(std::move(args)); }

    // Runs a one-shot subcommand to completion: its exit code; its output stays in the child.
    net::awaitable<int> run_cmd(child*& c, std::vector<std::string> args, milliseconds limit = seconds(60)) {
        c = &spawn(std::move(args));
        co_return co_await wait_exit(*c, limit);
    }

    child& spawn_consume(const std::string& nsqd_address, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> a = {
            "consume", "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd_address,
            "--heartbeat-interval", "1s", "--pg-dsn", dsn(), "--migrate", "--key-namespace", key_namespace,
            // A duplicate waits for its original's lease: keep the lease short.
            "--lease", "2s", "--lease-renew-interval", "500ms", "--lease-held-delay", "200ms",
            "--retry-same-key-delay", "200ms", "--indeterminate-delay", "300ms", "--new-key-quiet", "1s",
            "--health-listen", "127.0.0.1:0", "--shutdown-timeout", "10", "--max-loop-lag", "5",
            "--max-in-flight", "50"};
        auto s = stripe_args();
        a.insert(a.end(), s.begin(), s.end());
        a.insert(a.end(), extra.begin(), extra.end());
        // Discovery through nsqlookupd instead (the two exclude each other).
        if (std::find(extra.begin(), extra.end(), "--lookupd-http-address") != extra.end()) {
            auto at = std::find(a.begin(), a.end(), "--nsqd-tcp-address");
            a.erase(at, at + 2);
        }
        return spawn(a);
    }

    net::awaitable<void> stop_cleanly(child& c) {
        ::kill(c.pid, SIGTERM);
        int code = co_await wait_exit(c, seconds(20));
        BOOST_TEST(code == 0, c.err());
        BOOST_TEST(c.err().find(stripe_key) == std::string::npos);
    }

    net::awaitable<void> migrate() {
        child* c = nullptr;
        int rc = co_await run_cmd(c, argv("migrate", "--pg-dsn", dsn()));
        BOOST_TEST_REQUIRE(rc == 0, c->err());
    }

    net::awaitable<std::int64_t> add_letter(const std::string& body, const std::string& reason) {
        std::string b;
        for (char ch : body) b += ch == '\'' ? std::string("''") : std::string(1, ch);
        auto r = co_await query(
            "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason) "
            "VALUES ('" +
            topic + "', '" + channel + "', '0a1b2c3d4e5f6071', 1, convert_to('" + b + "', 'UTF8'), '" +
            reason + "') RETURNING id");
        co_return r.get<std::int64_t>(0, 0);
    }

    std::vector<std::string> reconcile_args(const std::string& expected, const std::string& period) {
        std::vector<std::string> a = {
            "reconcile",       "--expected",  expected, "--period",  period,          "--pg-dsn", dsn(),
            "--key-namespace", key_namespace, "--json", "--show-ok", "--stripe-rate", "50"};
        auto s = stripe_args();
        a.insert(a.end(), s.begin(), s.end());
        return a;
    }
};

// `reconcile --json` output, parsed.
struct recon_report {
    std::map<std::string, std::int64_t> classes;
    std::map<std::string, std::string> class_of;  // customer_id → class
    std::map<std::string, std::string> action_of;
    std::int64_t unexplained = -1, republished = -1, stripe_requests = -1;
};

recon_report parse_report(const std::string& out) {
    recon_report r;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    r.unexplained = doc["unexplained"].get_int64().value();
    r.republished = doc["republished"].get_int64().value();
    r.stripe_requests = doc["stripe_requests"].get_int64().value();
    simdjson::dom::object classes = doc["classes"].get_object().value();
    for (auto [k, v] : classes) r.classes[std::string(k)] = v.get_int64().value();
    simdjson::dom::array items = doc["items"].get_array().value();
    for (auto it : items) {
        std::string c(it["customer_id"].get_string().value());
        r.class_of[c] = std::string(it["class"].get_string().value());
        r.action_of[c] = std::string(it["action"].get_string().value());
    }
    return r;
}

// `reconcile --json`'s class of each entry, keyed "customer@account" ("customer@-" for the platform's).
std::map<std::string, std::string> classes_by_account(const std::string& out) {
    std::map<std::string, std::string> r;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    simdjson::dom::array items = doc["items"].get_array().value();
    for (auto it : items) {
        std::string_view account = "-";
        if (!it["stripe_account"].is_null()) account = it["stripe_account"].get_string().value();
        r[std::string(it["customer_id"].get_string().value()) + "@" + std::string(account)] =
            std::string(it["class"].get_string().value());
    }
    return r;
}

template <typename F>
void run(ops& f, F body, seconds limit = seconds(120)) {
    test::run_async(f.io, body, limit);
}

// A real nsqd 1.3.0 on loopback ports with a fresh data path; stopped by the destructor.
struct real_nsqd {
    pid_t pid = -1;
    unsigned short tcp = 0, http = 0;
    std::string dir;
    explicit real_nsqd(const std::string& bin) {
        char tmpl[] = "/tmp/cg-ops-nsqd.XXXXXX";
        dir = ::mkdtemp(tmpl);
        tcp = free_port();
        http = free_port();
        std::vector<std::string> args = {bin, "--tcp-address=127.0.0.1:" + std::to_string(tcp),
                                         "--http-address=127.0.0.1:" + std::to_string(http),
                                         "--data-path=" + dir, "--log-level=warn"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        BOOST_TEST_REQUIRE(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    }
    ~real_nsqd() {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            ::waitpid(pid, nullptr, 0);
        }
        std::system(("rm -rf " + dir).c_str());
    }
    std::string tcp_address() const { return "127.0.0.1:" + std::to_string(tcp); }
};

}  // namespace

// Letters as the pipeline stores them; list/show; replay publishes the raw body once and records who/when;
// a second replay is skipped, --reason picks the open letters by reason, an invalid body is refused, --force
// publishes again; then `consume` charges each replayed event exactly once (the forced duplicate included).
BOOST_FIXTURE_TEST_CASE(dead_letters_list_show_replay_then_charged_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string a = event_json("cust-a", "2026-10", 1500, "cus_a");
        const std::string b = event_json("cust-b", "2026-10", 2500, "cus_b");
        auto id_a = co_await add_letter(a, "stripe rejected: No such customer");
        auto id_b = co_await add_letter(b, "stripe rejected: No such customer");
        auto id_bad = co_await add_letter("{\"customer_id\":\"cust-c\"}", "billing_period: missing");

        child* c = nullptr;
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "list", "--json", "--pg-dsn", dsn())) == 0, c->err());
        {
            std::istringstream in(c->out());
            std::string line;
            std::vector<std::int64_t> ids;
            simdjson::dom::parser p;
            while (std::getline(in, line)) {
                simdjson::dom::element doc;
                BOOST_TEST_REQUIRE(p.parse(line).get(doc) == simdjson::SUCCESS, line);
                ids.push_back(doc["id"].get_int64().value());
                BOOST_TEST(doc["topic"].get_string().value() == topic);
                BOOST_TEST(doc["replayed_at"].is_null());
            }
            BOOST_TEST((ids == std::vector<std::int64_t>{id_a, id_b, id_bad}));
        }
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "show", std::to_string(id_a), "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find(a) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("stripe rejected: No such customer") != std::string::npos);
        BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "show", "999999", "--pg-dsn", dsn())) == 2);

        auto replay = [&](auto... extra) {
            return argv("dead-letters", "replay", "--pg-dsn", dsn(), "--nsqd-tcp-address",
                        nsqd->tcp_address(), "--by", "alice", extra...);
        };
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a))) == 0, c->err());
        BOOST_TEST(nsqd->topic_message_count(topic) == 1u);
        auto marked = co_await query(
            "SELECT replayed_by, replayed_at IS NOT NULL, replay_count FROM dead_letters "
            "WHERE id = " +
            std::to_string(id_a));
        BOOST_TEST(marked.text(0, 0) == "alice");
        BOOST_TEST(marked.text(0, 1) == "t");
        BOOST_TEST(marked.text(0, 2) == "1");

        // Idempotent: replayed already → nothing published.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a))) == 0, c->err());
        BOOST_TEST(c->out().find("already replayed by alice") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 1u);

        // By reason: only the open letter with that reason (a is replayed already).
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay("--reason", "stripe rejected")) == 0, c->err());
        BOOST_TEST(c->out().find("1 replayed, 0 skipped") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        // A body consume would dead-letter again is refused, left open, not published.
        BOOST_TEST(co_await run_cmd(c, replay(std::to_string(id_bad))) == 1);
        BOOST_TEST(c->out().find("not a valid billing event") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        // --force publishes again and counts the replay.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(std::to_string(id_a), "--force")) == 0, c->err());
        BOOST_TEST(nsqd->topic_message_count(topic) == 3u);
        auto twice =
            co_await query("SELECT replay_count FROM dead_letters WHERE id = " + std::to_string(id_a));
        BOOST_TEST(twice.text(0, 0) == "2");

        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "list", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("1 letter(s) open") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("billing_period: missing") != std::string::npos, c->out());

        // The replayed raw bodies are billing events: charged once each, the forced duplicate prevented.
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 3u; }, seconds(40)),
                           consumer.err());
        std::set<std::string> keys{key_of("cust-a", "2026-10"), key_of("cust-b", "2026-10")};
        co_await expect_charged_once(keys);
        co_await stop_cleanly(consumer);
    });
}

// A letter whose ledger row is final-but-uncharged — `failed` (Stripe refused the request as sent, since
// fixed) or `cap_blocked` (the cap, since raised) — is charged by its replay: the replay reopens the row,
// and consume searches Stripe, finds nothing and charges it under a new key generation, once. Without the
// reopen the replayed message would meet a final row and be finished as a duplicate: never charged.
BOOST_FIXTURE_TEST_CASE(a_replay_reopens_failed_and_cap_blocked_rows_and_charges_them, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-09";
        struct one {
            std::string customer, status;
        };
        std::vector<std::int64_t> ids;
        std::set<std::string> keys;
        for (const one& o : {one{"cust-f", "failed"}, one{"cust-g", "cap_blocked"}}) {
            auto key = key_of(o.customer, p);
            keys.insert(key);
            co_await query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status, last_error, stripe_attempts, first_stripe_attempt_at, "
                "last_stripe_attempt_at) VALUES ('" +
                key + "', '" + o.customer + "', '" + p + "', 3100, 'usd', 'cus_f', '" + o.status +
                "', 'refused', 1, now() - interval '10 minutes', now() - interval '10 minutes')");
            auto body = event_json(o.customer, p, 3100, "cus_f");
            auto r = co_await query(
                "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, "
                "billing_key) VALUES ('" +
                topic + "', '" + channel + "', '0a1b2c3d4e5f6072', 1, convert_to('" + body + "', 'UTF8'), '" +
                (o.status == "failed" ? "stripe rejected" : "spend cap exceeded") + "', '" + key +
                "') RETURNING id");
            ids.push_back(r.get<std::int64_t>(0, 0));
        }
        child* c = nullptr;
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("dead-letters", "replay", std::to_string(ids[0]), std::to_string(ids[1]),
                                     "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address())) == 0,
            c->err());
        BOOST_TEST(c->out().find("reopened (was failed)") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("reopened (was cap_blocked)") != std::string::npos, c->out());
        auto open = co_await query(
            "SELECT count(*) FROM billing_records WHERE status = 'pending' AND "
            "indeterminate_since IS NOT NULL AND lease_until IS NULL");
        BOOST_TEST(open.text(0, 0) == "2");
        BOOST_TEST(nsqd->topic_message_count(topic) == 2u);

        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 2u; }, seconds(40)),
                           consumer.err());
        co_await expect_charged_once(keys);
        auto gens = co_await query(
            "SELECT count(*) FROM billing_records WHERE status = 'charged' AND key_generation = 2");
        BOOST_TEST(gens.text(0, 0) == "2");
        co_await stop_cleanly(consumer);
    });
}

// The same replay through the real nsqd 1.3.0: the body it delivers to `consume` is charged.
BOOST_FIXTURE_TEST_CASE(dead_letter_replay_through_real_nsqd, ops) {
    const char* bin = std::getenv("NSQD_BIN");
    if (!bin) {
        BOOST_TEST_MESSAGE("skipped: NSQD_BIN is not set (the real nsqd 1.3.0 is not on this machine)");
        return;
    }
    real_nsqd real(bin);
    run(*this, [&]() -> net::awaitable<void> {
        co_await migrate();
        // nsqd is up once a publish succeeds; the replay's producer retries its connect meanwhile.
        auto id =
            co_await add_letter(event_json("cust-r", "2026-10", 4100, "cus_r"), "stripe rejected: test");
        auto& consumer = spawn_consume(real.tcp_address());
        child* c = nullptr;
        bool published = false;
        for (int i = 0; i < 50 && !published; ++i) {
            published =
                co_await run_cmd(c, argv("dead-letters", "replay", std::to_string(id), "--pg-dsn", dsn(),
                                         "--nsqd-tcp-address", real.tcp_address(), "--by", "bob")) == 0;
            if (!published) co_await net::sleep_for(milliseconds(100));
        }
        BOOST_TEST_REQUIRE(published, c->err());
        BOOST_TEST_REQUIRE(co_await eventually([&] { return fake->charges().size() == 1u; }, seconds(40)),
                           consumer.err());
        std::set<std::string> keys{key_of("cust-r", "2026-10")};
        BOOST_TEST_REQUIRE(co_await eventually([&] { return charges_by_key().count(*keys.begin()) == 1u; }));
        auto rows = co_await query("SELECT replayed_by FROM dead_letters WHERE id = " + std::to_string(id));
        BOOST_TEST(rows.text(0, 0) == "bob");
        co_await stop_cleanly(consumer);
        co_await expect_charged_once(keys);
    });
}

// The issue's scenario: only 90 % of a 120-customer run reaches NSQ; consume charges those; one charged row
// is set back to pending as if a crash lost the answer. reconcile finds 12 missing and settles the pending
// row from Stripe (the recovery search); --publish re-publishes the 12; consume charges them; every customer
// is charged exactly once and a last reconcile exits 0, reading Stripe in two pages and nothing else.
BOOST_FIXTURE_TEST_CASE(reconcile_publish_recovers_a_lost_tenth, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string period = "2026-11";
        std::string expected;
        std::set<std::string> keys;
        for (int i = 0; i < 120; ++i) {
            auto body = event_json("cust-" + std::to_string(i), period, 1000 + i);
            expected += body + "\n";
            keys.insert(key_of("cust-" + std::to_string(i), period));
            if (i % 10 != 7) nsqd->publish(topic, body);  // 108 published, 12 lost
        }
        auto file = write_file("run.jsonl", expected);
        // The consumer's backfill lists the account's charges soon after it starts, at a moment that
        // depends on the machine's speed; off here, so that the fake's request count below is reconcile's.
        auto& consumer = spawn_consume(nsqd->tcp_address(), {"--backfill-window", "0"});
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 108u; },
                                seconds(60)),
            consumer.err());
        // A crash between Stripe's answer and the ledger write: charged at Stripe, pending in the ledger.
        const std::string crashed = key_of("cust-3", period);
        auto before = co_await query("SELECT charge_id FROM billing_records WHERE key = '" + crashed + "'");
        std::string charge_id(before.text(0, 0));
        co_await query(
            "UPDATE billing_records SET status = 'pending', charge_id = NULL, stripe_attempts = 1, "
            "first_stripe_attempt_at = now(), lease_until = now() - interval '1 second' WHERE key = '" +
            crashed + "'");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, period)) == 2, c->err());
        auto first = parse_report(c->out());
        BOOST_TEST(first.classes["missing"] == 12);
        BOOST_TEST(first.classes["ok"] == 108);
        BOOST_TEST(first.classes["pending"] == 0);
        BOOST_TEST(first.unexplained == 12);
        BOOST_TEST(first.republished == 0);
        BOOST_TEST(first.class_of["cust-7"] == "missing");
        BOOST_TEST(first.action_of["cust-3"] == "settled charged " + charge_id, first.action_of["cust-3"]);
        auto settled =
            co_await query("SELECT status, charge_id FROM billing_records WHERE key = '" + crashed + "'");
        BOOST_TEST(settled.text(0, 0) == "charged");
        BOOST_TEST(settled.text(0, 1) == charge_id);
        BOOST_TEST(nsqd->topic_message_count(topic) == 108u);  // without --publish nothing is published

        auto args = reconcile_args(file, period);
        for (const char* a : {"--publish", "--nsqd-tcp-address"}) args.push_back(a);
        args.push_back(nsqd->tcp_address());
        args.push_back("--topic");
        args.push_back(topic);
        BOOST_TEST(co_await run_cmd(c, args) == 2,
                   c->err());  // re-published, not yet charged: still unexplained
        auto second = parse_report(c->out());
        BOOST_TEST(second.republished == 12);
        BOOST_TEST(second.action_of["cust-17"] == "re-published to " + topic);
        BOOST_TEST(nsqd->topic_message_count(topic) == 120u);

        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 120u; },
                                seconds(60)),
            consumer.err());
        co_await expect_charged_once(keys);

        auto before_requests = fake->requests();
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, period)) == 0, c->out() + c->err());
        auto last = parse_report(c->out());
        BOOST_TEST(last.classes["ok"] == 120);
        BOOST_TEST(last.unexplained == 0);
        // 120 charges, 100 a page: two list requests, no per-charge retrieve.
        BOOST_TEST(last.stripe_requests == 2);
        BOOST_TEST(fake->requests() - before_requests == 2u);
        co_await stop_cleanly(consumer);
    });
}

// One row tampered into each class, from a CSV run: ok, missing, pending (no charge anywhere), charged but
// absent at Stripe, at Stripe but not in the ledger, amount mismatch, declined, dead-lettered, cap_blocked.
BOOST_FIXTURE_TEST_CASE(reconcile_classifies_each_tampered_row, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string p = "2026-12";
        std::string csv = "customer_id,billing_period,amount_cents,currency,stripe_customer_id\n";
        for (int i = 0; i < 9; ++i) {
            auto amount = i == 5 ? 9999 : 1000 + i;  // c5: the run now says 9999; 1005 was charged
            csv += "c" + std::to_string(i) + "," + p + "," + std::to_string(amount) + ",usd,cus_" +
                   std::to_string(i) + "\n";
        }
        auto file = write_file("run.csv", csv);
        fake->decline("cus_6");
        for (int i : {0, 3, 4, 5, 6})
            nsqd->publish(topic,
                          event_json("c" + std::to_string(i), p, 1000 + i, "cus_" + std::to_string(i)));
        nsqd->publish(topic, event_json("c7", p, 0, "cus_7"));  // invalid amount: dead-lettered
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 6u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        co_await query("UPDATE billing_records SET charge_id = 'ch_gone' WHERE key = '" + key_of("c3", p) +
                       "'");
        co_await query("DELETE FROM billing_records WHERE key = '" + key_of("c4", p) + "'");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, lease_until) VALUES ('" +
            key_of("c2", p) + "', 'c2', '" + p +
            "', 1002, 'usd', 'cus_2', 'pending', now() - interval '1 minute')");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, status, last_error) VALUES ('" +
            key_of("c8", p) + "', 'c8', '" + p +
            "', 1008, 'usd', 'cus_8', 'cap_blocked', 'spend cap exceeded')");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, p)) == 2, c->err());
        auto r = parse_report(c->out());
        const std::map<std::string, std::string> want = {
            {"c0", "ok"},
            {"c1", "missing"},
            {"c2", "pending"},
            {"c3", "charged_absent_at_stripe"},
            {"c4", "at_stripe_not_in_ledger"},
            {"c5", "amount_currency_mismatch"},
            {"c6", "declined"},
            {"c7", "dead_lettered"},
            {"c8", "cap_blocked"},
        };
        for (const auto& [cust, cls] : want) BOOST_TEST(r.class_of[cust] == cls, cust + ": " + c->out());
        BOOST_TEST(r.class_of.size() == want.size());
        BOOST_TEST(r.unexplained == 5);  // missing, pending, absent, not in ledger, mismatch
        BOOST_TEST(r.action_of["c2"] == "no charge carries the key");

        // The table names the same classes for a human.
        auto args = reconcile_args(file, p);
        args.erase(std::find(args.begin(), args.end(), "--json"));
        BOOST_TEST(co_await run_cmd(c, args) == 2);
        BOOST_TEST(c->out().find("5 unexplained, 0 re-published") != std::string::npos, c->out());
        BOOST_TEST(c->out().find("charge ch_gone does not exist at Stripe") != std::string::npos, c->out());
    });
}

// Stripe Connect: an entry of the run is a (customer, period, account). The same customer id on the platform
// and on two connected accounts is three entries, each matched with its own ledger row and its own charge,
// listed in its account (Stripe-Account). A run's event never published in one account is missing there
// (while the platform's is ok); a charge whose ledger row was lost in another account is reported there; an
// event charged in another account than the run's is missing in the run's and unexpected in the other.
BOOST_FIXTURE_TEST_CASE(reconcile_matches_each_connected_account_apart, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        const std::string p = "2026-10", a = "acct_1ReconA", b = "acct_1ReconB";
        fake->add_account(a, {"cus_ops"});
        fake->add_account(b, {"cus_ops"});
        auto body = [&](const std::string& customer, std::int64_t amount, const std::string& account) {
            auto e = event_json(customer, p, amount);
            if (account.empty()) return e;
            e.pop_back();
            return e + R"(,"stripe_account":")" + account + "\"}";
        };
        struct entry {
            std::string customer;
            std::int64_t amount;
            std::string account;
        };
        const std::vector<entry> run_events = {
            {"shop-1", 1100, ""}, {"shop-1", 1101, a},  {"shop-1", 1102, b}, {"shop-2", 1200, a},
            {"shop-2", 1201, b},  {"shop-3", 1300, ""}, {"shop-3", 1301, a}, {"shop-4", 1400, a}};
        std::string expected;
        for (const auto& e : run_events) expected += body(e.customer, e.amount, e.account) + "\n";
        auto file = write_file("connect.jsonl", expected);
        // Published: all but shop-3's on a, and shop-4's on b instead of a.
        for (const auto& e : run_events) {
            if (e.customer == "shop-3" && e.account == a) continue;
            nsqd->publish(topic, body(e.customer, e.amount, e.customer == "shop-4" ? b : e.account));
        }
        // No backfill: it would restore the row deleted below.
        auto& consumer = spawn_consume(nsqd->tcp_address(), {"--backfill-window", "0"});
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 7u; }, seconds(60)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        std::size_t in_b = 0;
        for (const auto& ch : fake->charges()) in_b += ch.account == b;
        BOOST_TEST(fake->charges().size() == 7u);
        BOOST_TEST(in_b == 3u);
        // shop-2's row on b lost: its charge is one the ledger does not account for, in b only.
        co_await query("DELETE FROM billing_records WHERE key = '" +
                       billing::base_key(key_namespace, "shop-2", p, b) + "'");

        child* c = nullptr;
        BOOST_TEST(co_await run_cmd(c, reconcile_args(file, p)) == 2, c->err());
        auto got = classes_by_account(c->out());
        const std::map<std::string, std::string> want = {
            {"shop-1@-", "ok"},
            {"shop-1@" + a, "ok"},
            {"shop-1@" + b, "ok"},
            {"shop-2@" + a, "ok"},
            {"shop-2@" + b, "at_stripe_not_in_ledger"},
            {"shop-3@-", "ok"},
            {"shop-3@" + a, "missing"},
            {"shop-4@" + a, "missing"},
            {"shop-4@" + b, "amount_currency_mismatch"},  // charged; the run does not list it there
        };
        for (const auto& [who, cls] : want) BOOST_TEST(got[who] == cls, who + ": " + c->out());
        BOOST_TEST(got.size() == want.size(), c->out());
        BOOST_TEST(parse_report(c->out()).unexplained == 4);
    });
}

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

// `explain --json` output, parsed: state, verdict, the ledger's charge id, and Stripe's charge id (--stripe).
struct explained {
    std::string state, verdict, ledger_charge, stripe_charge, ledger_status;
    std::size_t letters = 0;
    std::vector<std::string> spend_states;  // vault_spend rows' states
};

explained parse_explained(const std::string& out) {
    explained x;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    x.state = std::string(doc["state"].get_string().value());
    x.verdict = std::string(doc["verdict"].get_string().value());
    x.letters = doc["dead_letters"].get_array().value().size();
    // A named array: the range-for would otherwise hold a reference into the simdjson_result temporary.
    simdjson::dom::array spend = doc["vault_spend"].get_array().value();
    for (auto s : spend) x.spend_states.push_back(std::string(s["state"].get_string().value()));
    auto ledger = doc["ledger"];
    if (!ledger.is_null()) {
        x.ledger_status = std::string(ledger["status"].get_string().value());
        if (!ledger["charge_id"].is_null())
            x.ledger_charge = std::string(ledger["charge_id"].get_string().value());
    }
    auto stripe = doc["stripe"];
    if (!stripe.is_null() && !stripe["charge_id"].is_null())
        x.stripe_charge = std::string(stripe["charge_id"].get_string().value());
    return x;
}

}  // namespace

// `chargeguard explain` for every ledger state: a row charged by `consume` itself, rows written as the
// pipeline leaves them (pending with a live lease, pending indeterminate, declined, cap-blocked), a key with
// only a dead letter, and a key never seen. Each answers with its state, its one-line verdict and exit 0
// (charged) or 2; --stripe finds the charge by the recovery search, also when the ledger lost the answer.
BOOST_FIXTURE_TEST_CASE(explain_answers_for_every_ledger_state, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-08";
        nsqd->publish(topic, event_json("x-charged", p, 1200, "cus_x"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        // The pipeline's log lines name the customer and period next to the key.
        auto logged = consumer.err();
        BOOST_TEST(logged.find("\"billing_key\":\"" + key_of("x-charged", p) + "\"") != std::string::npos,
                   logged);
        BOOST_TEST(logged.find("\"customer_id\":\"x-charged\"") != std::string::npos, logged);
        BOOST_TEST(logged.find("\"period\":\"" + p + "\"") != std::string::npos, logged);
        auto insert = [&](const std::string& customer, const std::string& cols, const std::string& values) {
            return query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id" +
                cols + ") VALUES ('" + key_of(customer, p) + "', '" + customer + "', '" + p +
                "', 1300, 'usd', 'cus_y'" + values + ")");
        };
        co_await insert("x-live",
                        ", status, lease_until, lease_epoch, stripe_attempts, first_stripe_attempt_at",
                        ", 'pending', now() + interval '10 minutes', 7, 1, now()");
        co_await insert(
            "x-indet", ", status, lease_until, indeterminate_since, stripe_attempts, first_stripe_attempt_at",
            ", 'pending', now() - interval '1 minute', now() - interval '5 minutes', 1, "
            "now() - interval '5 minutes'");
        co_await insert("x-declined", ", status, last_error",
                        ", 'declined', 'card_declined: insufficient funds'");
        co_await insert("x-cap", ", status, last_error", ", 'cap_blocked', 'spend cap exceeded'");
        co_await query(
            "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason, "
            "billing_key) "
            "VALUES ('" +
            topic + "', '" + channel + "', '0a1b2c3d4e5f6073', 5, convert_to('{}', 'UTF8'), " +
            "'stripe rejected: No such customer', '" + key_of("x-dead", p) + "')");

        // The vault released x-cap's reservation when it refused the charge (a later generation's key too).
        co_await query(
            "INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency) VALUES "
            "('vk_explain', 'explain', decode(repeat('00', 32), 'hex'), '" +
            p + "', 100, 'usd')");
        co_await query(
            "INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state) VALUES "
            "('vk_explain', '" +
            key_of("x-cap", p) + "', 1300, 'released'), ('vk_explain', '" + key_of("x-cap", p) +
            "-g2', 1300, 'reserved')");
        auto explain = [&](const std::string& customer, std::vector<std::string> extra = {}) {
            auto a = argv("explain", "--customer", customer, "--period", p, "--key-namespace", key_namespace,
                          "--pg-dsn", dsn(), "--json");
            a.insert(a.end(), extra.begin(), extra.end());
            return a;
        };
        struct want {
            std::string customer, state, verdict_prefix;
            int code;
        };
        const std::vector<want> table = {
            {"x-charged", "charged", "charged once: ch_", 0},
            {"x-live", "pending", "pending: lease held (epoch 7) until ", 2},
            {"x-indet", "pending", "pending, indeterminate since ", 2},
            {"x-declined", "declined", "declined: card_declined: insufficient funds", 2},
            {"x-cap", "cap_blocked", "cap-blocked: spend cap exceeded", 2},
            {"x-dead", "dead_lettered",
             "dead-lettered: stripe rejected: No such customer; replay with chargeguard "
             "dead-letters replay ",
             2},
            {"x-unknown", "never_seen", "never seen: ", 2},
        };
        child* c = nullptr;
        std::string charged_id;
        for (const auto& w : table) {
            BOOST_TEST_CONTEXT(w.customer) {
                BOOST_TEST(co_await run_cmd(c, explain(w.customer)) == w.code, c->err());
                auto x = parse_explained(c->out());
                BOOST_TEST(x.state == w.state);
                BOOST_TEST(x.verdict.rfind(w.verdict_prefix, 0) == 0u, x.verdict);
                if (w.state == "charged") charged_id = x.ledger_charge;
                if (w.customer == "x-cap")
                    BOOST_TEST((x.spend_states == std::vector<std::string>{"released", "reserved"}));
                else
                    BOOST_TEST(x.spend_states.empty());
            }
        }
        BOOST_TEST_REQUIRE(charges_by_key()[key_of("x-charged", p)].size() == 1u);
        BOOST_TEST(charged_id == charges_by_key()[key_of("x-charged", p)].front());

        // The text form ends with the verdict line; --key finds the same row.
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--key", key_of("x-charged", p), "--pg-dsn", dsn())) == 0,
            c->err());
        BOOST_TEST(c->out().find("verdict: charged once: " + charged_id) != std::string::npos, c->out());

        // --stripe: the recovery search finds the charge; with the ledger's answer lost (the row set back to
        // pending, as a crash after Stripe answered leaves it) it still does, and says recovery records it.
        auto s = stripe_args();
        s.insert(s.begin(), "--stripe");
        BOOST_TEST(co_await run_cmd(c, explain("x-charged", s)) == 0, c->err());
        BOOST_TEST(parse_explained(c->out()).stripe_charge == charged_id);
        co_await query(
            "UPDATE billing_records SET status = 'pending', charge_id = NULL, lease_until = now() - interval "
            "'1 minute', indeterminate_since = now() WHERE key = '" +
            key_of("x-charged", p) + "'");
        BOOST_TEST(co_await run_cmd(c, explain("x-charged", s)) == 2, c->err());
        auto lost = parse_explained(c->out());
        BOOST_TEST(lost.state == "pending");
        BOOST_TEST(lost.stripe_charge == charged_id);
        BOOST_TEST(lost.verdict.find("Stripe already holds " + charged_id) != std::string::npos,
                   lost.verdict);
        // A customer Stripe has nothing for: searched, nothing found.
        BOOST_TEST(co_await run_cmd(c, explain("x-declined", s)) == 2, c->err());
        BOOST_TEST(parse_explained(c->out()).stripe_charge.empty());
        BOOST_TEST(c->err().find(stripe_key) == std::string::npos);

        // Stripe Connect: a connected account's row is found by its own key (the account hashed in), with
        // --stripe-account; without it the platform's key names no row, and the customer and period alone do
        // not find another account's row.
        const std::string connect_key = billing::base_key(key_namespace, "x-conn", p, "acct_1Ops");
        co_await query(
            "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
            "stripe_customer_id, stripe_account, status, last_error) VALUES ('" +
            connect_key + "', 'x-conn', '" + p +
            "', 1300, 'usd', 'cus_y', 'acct_1Ops', 'declined', 'card_declined')");
        const std::vector<std::string> for_account{"--stripe-account", "acct_1Ops"};
        BOOST_TEST(co_await run_cmd(c, explain("x-conn", for_account)) == 2, c->err());
        auto in_account = parse_explained(c->out());
        BOOST_TEST(in_account.state == "declined");
        BOOST_TEST(c->out().find(connect_key) != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, explain("x-conn")) == 2, c->err());
        BOOST_TEST(parse_explained(c->out()).state == "never_seen");
    });
}

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

// The issue's scenario on the real nsqd 1.3.0: events wait in `consume`'s channel `chargeguard`; with the
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

// `explain` for a corrected period, from a ledger `consume` wrote: the original (1000, charged), revision 1
// (to 1500: a charge of 500) and revision 2 (to 700: refunds of 500 and 300, newest payment first). The
// JSON lists each revision with its total, difference and state and each money move with its Stripe
// object, and the money moved for the period; the verdict names the last total; the text shows the same,
// and a correction's key given to --key finds its period.
BOOST_FIXTURE_TEST_CASE(explain_shows_a_periods_corrections_and_their_stripe_objects, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-07";
        const auto base = key_of("x-corr", p);
        auto& consumer = spawn_consume(nsqd->tcp_address());
        const std::int64_t totals[] = {1000, 1500, 700};
        for (int rev = 0; rev < 3; ++rev) {
            auto body = event_json("x-corr", p, totals[rev], "cus_x");
            if (rev > 0) {
                body.pop_back();
                body += ",\"revision\":" + std::to_string(rev) + "}";
            }
            nsqd->publish(topic, body);
            auto want = static_cast<std::size_t>(rev + 1);
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == want; },
                                    seconds(40)),
                consumer.err());
        }
        co_await stop_cleanly(consumer);
        BOOST_TEST_REQUIRE(fake->charges().size() == 2u);
        BOOST_TEST_REQUIRE(fake->refunds().size() == 2u);
        const auto original = fake->charges()[0].id;
        const auto r1_charge = fake->charges()[1].id;
        const auto refund1 = fake->refunds()[0].id;
        const auto refund2 = fake->refunds()[1].id;

        child* c = nullptr;
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--customer", "x-corr", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn(), "--json")) == 0,
            c->err());
        simdjson::dom::parser parser;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(parser.parse(c->out()).get(doc) == simdjson::SUCCESS, c->out());
        auto text = [](simdjson::dom::element e, const char* k) {
            auto v = e[k];
            return v.is_null() ? std::string("null") : std::string(v.get_string().value());
        };
        BOOST_TEST(text(doc, "state") == "charged");
        BOOST_TEST(text(doc, "verdict")
                           .find("; corrected to 700 cents by revision 2 (applied); net moved 700 "
                                 "cents") != std::string::npos,
                   text(doc, "verdict"));
        BOOST_TEST(text(doc, "net_cents") == "700");
        simdjson::dom::array revs = doc["corrections"].get_array().value();
        BOOST_TEST_REQUIRE(revs.size() == 2u, c->out());
        simdjson::dom::element r1 = revs.at(0).value(), r2 = revs.at(1).value();
        BOOST_TEST(text(r1, "key") == base + "-r1");
        BOOST_TEST(text(r1, "revision") == "1");
        BOOST_TEST(text(r1, "total_cents") == "1500");
        BOOST_TEST(text(r1, "delta_cents") == "500");
        BOOST_TEST(text(r1, "status") == "applied");
        simdjson::dom::array m1 = r1["moves"].get_array().value();
        BOOST_TEST_REQUIRE(m1.size() == 1u);
        BOOST_TEST(text(m1.at(0).value(), "kind") == "charge");
        BOOST_TEST(text(m1.at(0).value(), "amount_cents") == "500");
        BOOST_TEST(text(m1.at(0).value(), "status") == "done");
        BOOST_TEST(text(m1.at(0).value(), "stripe_object_id") == r1_charge);
        BOOST_TEST(text(r2, "total_cents") == "700");
        BOOST_TEST(text(r2, "delta_cents") == "-800");
        BOOST_TEST(text(r2, "status") == "applied");
        simdjson::dom::array m2 = r2["moves"].get_array().value();
        BOOST_TEST_REQUIRE(m2.size() == 2u);
        BOOST_TEST(text(m2.at(0).value(), "kind") == "refund");
        BOOST_TEST(text(m2.at(0).value(), "refund_of") == r1_charge);
        BOOST_TEST(text(m2.at(0).value(), "amount_cents") == "500");
        BOOST_TEST(text(m2.at(0).value(), "stripe_object_id") == refund1);
        BOOST_TEST(text(m2.at(1).value(), "refund_of") == original);
        BOOST_TEST(text(m2.at(1).value(), "amount_cents") == "300");
        BOOST_TEST(text(m2.at(1).value(), "stripe_object_id") == refund2);

        // The text, asked by a correction's key as the logs print it.
        BOOST_TEST(co_await run_cmd(c, argv("explain", "--key", base + "-r2", "--pg-dsn", dsn())) == 0,
                   c->err());
        const auto& out = c->out();
        BOOST_TEST(
            out.find("corrections:  2 revision(s); net moved for the period: 700 cents") != std::string::npos,
            out);
        BOOST_TEST(out.find("revision 2 (" + base + "-r2): total 700 usd, difference -800, applied") !=
                       std::string::npos,
                   out);
        BOOST_TEST(out.find("  move 1: charge 500 cents, done, stripe " + r1_charge) != std::string::npos,
                   out);
        BOOST_TEST(out.find("  move 2: refund of " + original + " 300 cents, done, stripe " + refund2) !=
                       std::string::npos,
                   out);
    });
}

namespace {

std::string squeeze(const std::string& text) {
    std::string out;
    for (char ch : text) {
        bool space = ch == ' ' || ch == '\n' || ch == '\t';
        if (space && (out.empty() || out.back() == ' ')) continue;
        out += space ? ' ' : ch;
    }
    return out;
}

// The runbook's "Incidents, walked" (docs/operating/runbook.md) shows each command with what it prints: the
// `#   ` lines under the `nth` occurrence of `command` in that section (… stands for anything; a line wrapped
// in the doc is matched piece by piece). Empty when `output` holds every one of them (whitespace runs read as
// one space), else what is missing: the doc's outputs are this test's, and cannot drift from the binary's.
std::string runbook_mismatch(const std::string& command, const std::string& output, int nth = 0) {
    const char* root = std::getenv("CG_SOURCE_ROOT");
    if (!root) return "CG_SOURCE_ROOT is not set (run through meson test)";
    std::ifstream in(std::string(root) + "/docs/operating/runbook.md");
    std::string line;
    bool in_section = false, collecting = false;
    int seen = 0;
    std::vector<std::string> want;
    while (std::getline(in, line)) {
        if (line.rfind("## ", 0) == 0) in_section = line == "## Incidents, walked";
        if (!in_section) continue;
        if (collecting) {
            if (line.rfind("#   ", 0) != 0) break;
            want.push_back(squeeze(line.substr(4)));
            continue;
        }
        if (line == command && seen++ == nth) collecting = true;
    }
    if (!collecting) return "the runbook does not show `" + command + "`";
    if (want.empty()) return "the runbook shows no output for `" + command + "`";
    const auto out = squeeze(output);
    for (const auto& w : want) {
        // The line as a regular expression: every character literal but "…", which stands for anything.
        std::string re;
        for (std::size_t k = 0; k < w.size(); ++k) {
            if (w.compare(k, std::string_view("…").size(), "…") == 0) {
                re += ".*?";
                k += std::string_view("…").size() - 1;
            } else if (std::string_view("\\^$.|?*+()[]{}").find(w[k]) != std::string_view::npos) {
                re += std::string("\\") + w[k];
            } else {
                re += w[k];
            }
        }
        if (!std::regex_search(out, std::regex(re)))
            return "the runbook shows `" + w + "` for `" + command + "`, the output is:\n" + output;
    }
    return "";
}

// The succeeded charges Stripe holds for a key (metadata[billing_key]), and every charge for it.
std::pair<std::vector<std::string>, std::size_t> charges_for(const fake::fake_stripe& s,
                                                             const std::string& key) {
    std::vector<std::string> ok;
    std::size_t all = 0;
    for (const auto& ch : s.charges())
        for (const auto& [k, v] : ch.metadata)
            if (k == "billing_key" && v == key) {
                ++all;
                if (ch.status == "succeeded") ok.push_back(ch.id);
            }
    return {ok, all};
}

std::string intent_event(const std::string& customer, const std::string& period, std::int64_t amount,
                         const std::string& stripe_customer) {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","payment_method":"pm_card_visa","off_session":false})";
}

}  // namespace

// The issue's first incident: a customer's card is declined; re-publishing the event changes nothing (the
// row is final). Once the card is fixed, `retry-declined` — by customer and period, by key, and for every
// declined row of a period — charges each key exactly once under a new key generation, records who and why,
// and `explain` shows each attempt. A retry while the card is still declined is declined again (a second
// generation), and the next retry still charges once. A PaymentIntent left requires_action (3-D Secure on
// session) is cancelled first, so it can never succeed beside the retry's payment.
BOOST_FIXTURE_TEST_CASE(retry_declined_charges_once_after_the_card_is_fixed, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-07";
        fake::decline_rule auth;
        auth.code = "authentication_required";
        for (const char* cus : {"cus_d1", "cus_d2", "cus_d3"}) fake->decline(cus);
        fake->decline("cus_d4", auth);
        nsqd->publish(topic, event_json("d1", p, 1100, "cus_d1"));
        nsqd->publish(topic, event_json("d2", p, 1200, "cus_d2"));
        nsqd->publish(topic, event_json("d3", p, 1300, "cus_d3"));
        nsqd->publish(topic, intent_event("d4", p, 1400, "cus_d4"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        auto status_count = [&](const std::string& status) -> net::awaitable<std::int64_t> {
            auto r = co_await query("SELECT count(*) FROM billing_records WHERE billing_period = '" + p +
                                    "' AND status = '" + status + "'");
            co_return r.get<std::int64_t>(0, 0);
        };
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 4u; }, seconds(40)),
                           consumer.err());
        BOOST_TEST_REQUIRE(co_await status_count("declined") == 4);
        BOOST_TEST_REQUIRE(fake->intents().size() == 1u);
        BOOST_TEST(fake->intents()[0].status == "requires_action");
        // Declines are logged at warn: someone should look.
        BOOST_TEST(consumer.err().find("\"level\":\"warn\",\"msg\":\"billing message finished\"") !=
                       std::string::npos,
                   consumer.err());

        // Re-publishing the event is finished as a duplicate: no new charge.
        nsqd->publish(topic, event_json("d1", p, 1100, "cus_d1"));
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == 5u; }, seconds(20)));
        BOOST_TEST(charges_for(*fake, key_of("d1", p)).second == 1u);

        auto retry = [&](std::vector<std::string> how) {
            auto a = argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                          "--by", "alice", "--reason", "card updated");
            a.insert(a.end(), how.begin(), how.end());
            auto s = stripe_args();
            a.insert(a.end(), s.begin(), s.end());
            return a;
        };
        child* c = nullptr;
        const std::string explain_d1 = "chargeguard explain --customer d1 --period 2026-07";
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "d1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 2,
            c->err());
        BOOST_TEST(runbook_mismatch(explain_d1, c->out(), 0) == "");
        // Still declined: the retry charges under generation 2 and is declined again.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("retry #1 by alice: reopened under generation 2") != std::string::npos,
                   c->out());
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return charges_for(*fake, key_of("d1", p)).second == 2u; }, seconds(20)));
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == 6u; }, seconds(20)));
        BOOST_TEST(co_await status_count("declined") == 4);

        // The customers fix their cards.
        for (const char* cus : {"cus_d1", "cus_d2", "cus_d3", "cus_d4"}) fake->clear_decline(cus);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("reopened under generation 3") != std::string::npos, c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard retry-declined --customer d1 --period 2026-07 --reason 'card "
                             "updated' --by alice --nsqd-tcp-address nsqd:4150",
                             c->out()) == "");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--key", key_of("d2", p)))) == 0, c->err());
        BOOST_TEST(c->out().find("reopened under generation 2") != std::string::npos, c->out());
        // Every row still declined in the period: d3, and d4 whose open intent is cancelled first.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--period", p, "--all"))) == 0, c->err());
        BOOST_TEST(c->out().find("was requires_action: cancelled") != std::string::npos, c->out());
        BOOST_TEST(
            c->out().find("2 retried, 0 charged already, 0 not declined, 0 failed") != std::string::npos,
            c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard retry-declined --period 2026-07 --all --reason 'card updated' "
                             "--by alice --nsqd-tcp-address nsqd:4150",
                             c->out()) == "");
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 10u; },
                                seconds(40)),
            consumer.err());
        BOOST_TEST(co_await status_count("charged") == 4);
        for (const char* who : {"d1", "d2", "d3", "d4"}) {
            BOOST_TEST_CONTEXT(who) {
                auto key = key_of(who, p);
                auto [ok, all] = charges_for(*fake, key);
                BOOST_TEST_REQUIRE(ok.size() == 1u);
                auto row = co_await query(
                    "SELECT charge_id, key_generation FROM billing_records WHERE key = '" + key + "'");
                BOOST_TEST(row.text(0, 0) == ok[0]);
                BOOST_TEST(row.text(0, 1) == (std::string(who) == "d1" ? "3" : "2"));
                BOOST_TEST(all == (std::string(who) == "d1" ? 3u : std::string(who) == "d4" ? 1u : 2u));
            }
        }
        BOOST_TEST_REQUIRE(fake->intents().size() == 2u);
        BOOST_TEST(fake->intents()[0].status == "canceled");
        BOOST_TEST(fake->intents()[1].status == "succeeded");
        auto recorded = co_await query(
            "SELECT count(*), count(*) FILTER (WHERE requested_by = 'alice' AND reason = 'card updated') "
            "FROM billing_retries");
        BOOST_TEST(recorded.text(0, 0) == "5");
        BOOST_TEST(recorded.text(0, 1) == "5");

        // A retry of a charged key charges nothing.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry(argv("--customer", "d1", "--period", p))) == 0,
                           c->err());
        BOOST_TEST(c->out().find("charged (ch_") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 10u);

        // explain: each attempt and how it ended.
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "d1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 0,
            c->err());
        const auto& out = c->out();
        BOOST_TEST(out.find("attempts:     3 (retried after a decline)") != std::string::npos, out);
        BOOST_TEST(out.find("attempt 1 (generation 1): first delivery -> declined: ") != std::string::npos,
                   out);
        BOOST_TEST(out.find("attempt 2 (generation 2): retry #1 by alice at ") != std::string::npos, out);
        BOOST_TEST(out.find("attempt 3 (generation 3): retry #2 by alice at ") != std::string::npos, out);
        BOOST_TEST(out.find(": card updated -> charged (charge " +
                            charges_for(*fake, key_of("d1", p)).first[0]) != std::string::npos,
                   out);
        BOOST_TEST(out.find("verdict: charged once: ") != std::string::npos, out);
        BOOST_TEST(out.find("3 attempts (2 retried after a decline)") != std::string::npos, out);
        BOOST_TEST(runbook_mismatch(explain_d1, out, 1) == "");
        co_await stop_cleanly(consumer);
    });
}

// Two retries of one declined key at once, racing a re-publication of the original event: one retry
// reopens the row (one billing_retries record), every delivery goes through the ledger's lease, and Stripe
// holds exactly one succeeded charge for the key.
BOOST_FIXTURE_TEST_CASE(two_retries_at_once_and_a_republication_charge_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-06", body = event_json("r1", p, 2100, "cus_r1");
        fake->decline("cus_r1");
        nsqd->publish(topic, body);
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        fake->clear_decline("cus_r1");
        auto retry = [&](const char* by) {
            return argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                        "--by", by, "--reason", "card updated", "--customer", "r1", "--period", p);
        };
        auto& a = spawn(retry("alice"));
        auto& b = spawn(retry("bob"));
        nsqd->publish(topic, body);
        BOOST_TEST(co_await wait_exit(a, seconds(30)) == 0, a.err());
        BOOST_TEST(co_await wait_exit(b, seconds(30)) == 0, b.err());
        auto key = key_of("r1", p);
        auto charged = [&]() -> net::awaitable<bool> {
            auto r = co_await query("SELECT status FROM billing_records WHERE key = '" + key + "'");
            co_return r.text(0, 0) == "charged";
        };
        for (int i = 0; i < 400 && !co_await charged(); ++i) co_await net::sleep_for(milliseconds(50));
        BOOST_TEST_REQUIRE(co_await charged(), consumer.err());
        // Every message published (the original, the re-publication, one or two retries) is finished.
        BOOST_TEST_REQUIRE(co_await eventually(
            [&] { return nsqd->channel(topic, channel).finish_count == nsqd->topic_message_count(topic); },
            seconds(30)));
        co_await stop_cleanly(consumer);
        auto [ok, all] = charges_for(*fake, key);
        BOOST_TEST(ok.size() == 1u);
        BOOST_TEST(all == 2u);  // the decline and the one success
        auto recorded = co_await query("SELECT count(*) FROM billing_retries WHERE key = '" + key + "'");
        BOOST_TEST(recorded.text(0, 0) == "1");
        auto outs = a.out() + b.out();
        BOOST_TEST(outs.find("reopened under generation 2") != std::string::npos, outs);
    });
}

// A crash in the middle of a retry: the new generation's call is left without an answer (indeterminate)
// while Stripe holds only the old generation's fresh decline. The redelivery searches and must not read
// that decline as the new generation's answer (its id is recorded with the retry): it finds nothing, takes
// a new generation once the old call is quiet, and charges once. Then `consume` is killed while the charge
// of another retried key is inside Stripe, and the restarted consume still charges that key once.
BOOST_FIXTURE_TEST_CASE(a_crash_mid_retry_still_charges_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        // nsqd requeues a killed consumer's messages at once (as it does once their timeout passes).
        test::nsq::fake_nsqd_options o;
        o.requeue_on_disconnect = true;
        start_nsqd(o);
        co_await migrate();
        const std::string p = "2026-05";
        fake->decline("cus_k1");
        fake->decline("cus_k2");
        nsqd->publish(topic, event_json("k1", p, 3100, "cus_k1"));
        nsqd->publish(topic, event_json("k2", p, 3200, "cus_k2"));
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 2u; },
                                    seconds(40)),
                consumer.err());
            co_await stop_cleanly(consumer);
        }
        fake->clear_decline("cus_k1");
        fake->clear_decline("cus_k2");
        auto retry = [&](const char* customer) {
            return argv("retry-declined", "--pg-dsn", dsn(), "--nsqd-tcp-address", nsqd->tcp_address(),
                        "--reason", "card updated", "--customer", customer, "--period", p);
        };
        auto k1 = key_of("k1", p), k2 = key_of("k2", p);
        auto charged = [&](const std::string& key) -> net::awaitable<bool> {
            auto r = co_await query("SELECT status FROM billing_records WHERE key = '" + key + "'");
            co_return r.text(0, 0) == "charged";
        };

        // k1: the retry's generation-2 call "was sent and never answered" (the row says so) and Stripe made
        // nothing: the search sees only the decline of moments ago.
        child* c = nullptr;
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k1")) == 0, c->err());
        co_await query(
            "UPDATE billing_records SET indeterminate_since = now(), stripe_attempts = stripe_attempts + 1 "
            "WHERE key = '" +
            k1 + "'");
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            for (int i = 0; i < 400 && !co_await charged(k1); ++i) co_await net::sleep_for(milliseconds(50));
            BOOST_TEST_REQUIRE(co_await charged(k1), consumer.err());
            co_await stop_cleanly(consumer);
        }
        auto gen = co_await query("SELECT key_generation FROM billing_records WHERE key = '" + k1 + "'");
        BOOST_TEST(gen.text(0, 0) == "3");  // a new generation once the search found nothing of generation 2

        // k2: consume is killed while the retry's charge is inside Stripe; the restarted consume finishes it.
        // The retry is run twice, as after a crash of the command between its reopen and its publish: the
        // second run finds the row reopened by the first and publishes the event again.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k2")) == 0, c->err());
        BOOST_TEST_REQUIRE(co_await run_cmd(c, retry("k2")) == 0, c->err());
        BOOST_TEST(c->out().find("retry #2 by ") != std::string::npos, c->out());
        BOOST_TEST(
            c->out().find("is under way (generation 2): published again; event published to billing") !=
                std::string::npos,
            c->out());
        fake->faults().stall_ms = 3000;
        fake->faults().stall_count = 1;
        {
            auto& consumer = spawn_consume(nsqd->tcp_address());
            BOOST_TEST_REQUIRE(co_await eventually([&] { return !fake->fault_hits().empty(); }, seconds(20)),
                               consumer.err());
            ::kill(consumer.pid, SIGKILL);
            co_await wait_exit(consumer, seconds(10));
        }
        auto& again = spawn_consume(nsqd->tcp_address());
        for (int i = 0; i < 600 && !co_await charged(k2); ++i) co_await net::sleep_for(milliseconds(50));
        BOOST_TEST_REQUIRE(co_await charged(k2), again.err());
        co_await stop_cleanly(again);
        for (const auto& key : {k1, k2}) {
            BOOST_TEST_CONTEXT(key) {
                auto [ok, all] = charges_for(*fake, key);
                BOOST_TEST_REQUIRE(ok.size() == 1u);
                BOOST_TEST(all == 2u);  // the decline and the one success
                auto row = co_await query("SELECT charge_id FROM billing_records WHERE key = '" + key + "'");
                BOOST_TEST(row.text(0, 0) == ok[0]);
            }
        }
    });
}

namespace {

// A gauge's value in Prometheus text ("name{labels} value" or "name value"); -1 when absent.
double scraped(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
}

}  // namespace

// The issue's third incident: every dead letter can be closed. A conflict letter's replay is refused — it
// would only be dead-lettered again — and publishes nothing (no new letter); an invalid event's letter is
// refused as it is, `explain` finds it by the customer and period in its body, and its replay with a
// corrected event charges once and keeps the correction beside the original; the rest are dismissed with a
// reason. The open-letters gauge counts them by reason while open and drops to 0 once closed.
BOOST_FIXTURE_TEST_CASE(every_dead_letter_can_be_closed, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-04";
        nsqd->publish(topic, event_json("x1", p, 1500, "cus_x1"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 1u; }, seconds(40)),
                           consumer.err());
        // An invalid amount (a decimal) for c-21; the same customer and period as x1 with another amount; a
        // test event nobody should charge. One after the other: letters 1, 2 and 3, as the runbook shows
        // them.
        const std::string invalid =
            R"({"customer_id":"c-21","billing_period":")" + p +
            R"(","amount_cents":19.99,"currency":"usd","stripe_customer_id":"cus_c21"})";
        const std::string bodies[] = {invalid, event_json("x1", p, 2500, "cus_x1"),
                                      R"({"customer_id":"smoke-test"})"};
        for (std::size_t i = 0; i < std::size(bodies); ++i) {
            nsqd->publish(topic, bodies[i]);
            BOOST_TEST_REQUIRE(
                co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 2u + i; },
                                    seconds(40)),
                consumer.err());
        }
        // Dead letters are logged at warn.
        BOOST_TEST(consumer.err().find("\"level\":\"warn\",\"msg\":\"billing message finished\"") !=
                       std::string::npos,
                   consumer.err());
        auto ids =
            co_await query("SELECT string_agg(id || ' ' || reason, '; ' ORDER BY id) FROM dead_letters");
        BOOST_TEST_REQUIRE(
            std::string(ids.text(0, 0)).rfind("1 event field is invalid: amount_cents", 0) == 0u,
            ids.text(0, 0));
        BOOST_TEST_REQUIRE(
            std::string(ids.text(0, 0)).find("; 2 conflict; 3 event lacks") != std::string::npos,
            ids.text(0, 0));
        const std::string invalid_id = "1", conflict_id = "2", smoke_id = "3";

        // The gauge: open letters by reason class.
        std::optional<unsigned short> port;
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return (port = consumer.logged_port()).has_value(); }, seconds(20)));
        auto scrape = [&](unsigned short at) -> net::awaitable<std::string> {
            auto cl = http::client::create(io.get_executor(), "http://127.0.0.1:" + std::to_string(at), {},
                                           logger());
            BOOST_TEST_REQUIRE(cl.has_value());
            http::request req;
            req.target = "/metrics";
            auto r = co_await (*cl)->request(std::move(req));
            BOOST_TEST_REQUIRE(r.ok());
            co_return r.resp.body;
        };
        std::string metrics;
        for (int i = 0; i < 400; ++i) {
            metrics = co_await scrape(*port);
            if (scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 2) break;
            co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 2, metrics);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"conflict\"}") == 1);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"stripe_rejected\"}") == 0);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_dismissed") == 0);

        auto replay = [&](std::vector<std::string> extra) {
            auto a = argv("dead-letters", "replay", "--pg-dsn", dsn(), "--nsqd-tcp-address",
                          nsqd->tcp_address(), "--by", "alice");
            a.insert(a.end(), extra.begin(), extra.end());
            return a;
        };
        child* c = nullptr;
        // The conflict letter: refused, truthfully, and nothing published (no new letter).
        BOOST_TEST(co_await run_cmd(c, replay(argv(conflict_id))) == 1, c->err());
        BOOST_TEST(
            c->out().find("refused, nothing published: ledger row " + key_of("x1", p) +
                          " holds 1500 usd for cus_x1, this event says 2500 usd for cus_x1: it would be "
                          "dead-lettered again as a conflict") != std::string::npos,
            c->out());
        BOOST_TEST(
            c->out().find("0 replayed, 0 skipped (closed already), 1 refused, 0 failed") != std::string::npos,
            c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 2 --nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST(nsqd->topic_message_count(topic) == 4u);
        // A letter whose event was charged meanwhile: superseded, nothing published.
        auto stale =
            co_await add_letter(event_json("x1", p, 1500, "cus_x1"), "stripe rejected: No such customer");
        BOOST_TEST(co_await run_cmd(c, replay(argv(std::to_string(stale)))) == 1, c->err());
        BOOST_TEST(c->out().find("refused, nothing published: superseded: ledger row " + key_of("x1", p) +
                                 " is charged (ch_") != std::string::npos,
                   c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 4u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", std::to_string(stale),
                                                    "--reason", "charged meanwhile", "--pg-dsn", dsn())) ==
                           0);

        // The invalid letter as it is: refused. explain finds it by its body, not "never seen".
        BOOST_TEST(co_await run_cmd(c, replay(argv(invalid_id))) == 1);
        BOOST_TEST(c->out().find("the body is not a valid billing event") != std::string::npos, c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 1 --nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "c-21", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 2,
            c->err());
        BOOST_TEST(runbook_mismatch("chargeguard explain --customer c-21 --period 2026-04", c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, argv("explain", "--customer", "c-21", "--period", p, "--key-namespace",
                                            key_namespace, "--pg-dsn", dsn(), "--json")) == 2,
                   c->err());
        auto x = parse_explained(c->out());
        BOOST_TEST(x.state == "dead_lettered");
        BOOST_TEST(x.verdict.rfind("dead-lettered: event field is invalid: amount_cents", 0) == 0u,
                   x.verdict);
        BOOST_TEST(x.verdict.find("dead-letters replay " + invalid_id) != std::string::npos, x.verdict);
        BOOST_TEST(x.letters == 1u);

        // Replayed with the corrected event: charged once, the correction kept with the letter.
        const std::string fixed = event_json("c-21", p, 1999, "cus_c21");
        auto file = write_file("fixed.json", fixed + "\n");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, replay(argv(invalid_id, "--event", file))) == 0,
                           c->out() + c->err());
        BOOST_TEST(c->out().find("letter " + invalid_id +
                                 ": replayed with the corrected event to topic billing by alice") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters replay 1 --event fixed.json --by alice "
                                    "--nsqd-tcp-address nsqd:4150",
                                    c->out()) == "");
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 5u; }, seconds(40)),
                           consumer.err());
        BOOST_TEST(charges_for(*fake, key_of("c-21", p)).first.size() == 1u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "show", invalid_id, "--pg-dsn", dsn())) ==
                           0);
        BOOST_TEST(c->out().find("corrected event published by the replay") != std::string::npos, c->out());
        BOOST_TEST(c->out().find(fixed) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("19.99") != std::string::npos, c->out());  // the original is kept too
        // A corrected event that is itself invalid is refused.
        auto bad = write_file("bad.json", R"({"customer_id":"x"})");
        BOOST_TEST(co_await run_cmd(c, replay(argv(smoke_id, "--event", bad))) == 1);
        BOOST_TEST(c->out().find("the corrected event is not a valid billing event") != std::string::npos,
                   c->out());

        // The rest are dismissed with a reason; a dismissed letter is not replayed.
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", conflict_id, smoke_id,
                                                    "--reason", "2500 was a publisher bug; smoke test",
                                                    "--by", "bob", "--pg-dsn", dsn())) == 0,
                           c->err());
        BOOST_TEST(c->out().find("2 dismissed, 0 not open, 0 failed") != std::string::npos, c->out());
        BOOST_TEST(
            runbook_mismatch("chargeguard dead-letters dismiss 2 3 --reason '2500 was a publisher bug; smoke "
                             "test' --by bob",
                             c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, argv("dead-letters", "dismiss", smoke_id, "--reason", "again",
                                            "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("not open (dismissed by bob)") != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, replay(argv(conflict_id))) == 0);
        BOOST_TEST(c->out().find("dismissed by bob") != std::string::npos, c->out());
        BOOST_TEST(nsqd->topic_message_count(topic) == 5u);
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "list", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(c->out().find("0 letter(s) open") != std::string::npos, c->out());
        BOOST_TEST(runbook_mismatch("chargeguard dead-letters list", c->out()) == "");
        auto letters = co_await query("SELECT count(*) FROM dead_letters");
        BOOST_TEST(letters.text(0, 0) == "4");  // no refusal made a new letter
        co_await stop_cleanly(consumer);

        // A consume started now exports every class at 0 and the dismissals.
        auto& next = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return (port = next.logged_port()).has_value(); }, seconds(20)));
        for (int i = 0; i < 400; ++i) {
            metrics = co_await scrape(*port);
            if (scraped(metrics, "chargeguard_dead_letters_dismissed") == 3) break;
            co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_dismissed") == 3, metrics);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"invalid\"}") == 0);
        BOOST_TEST(scraped(metrics, "chargeguard_dead_letters_open{reason=\"conflict\"}") == 0);
        co_await stop_cleanly(next);

        // explain on an event whose only letter was dismissed: not "never seen".
        auto gone = co_await add_letter(event_json("x-gone", p, 700, "cus_g"), "stripe rejected: test");
        BOOST_TEST_REQUIRE(co_await run_cmd(c, argv("dead-letters", "dismiss", std::to_string(gone),
                                                    "--reason", "cancelled order", "--pg-dsn", dsn())) == 0);
        BOOST_TEST(
            co_await run_cmd(c, argv("explain", "--customer", "x-gone", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn(), "--json")) == 2,
            c->err());
        auto closed = parse_explained(c->out());
        BOOST_TEST(closed.state == "dead_lettered");
        BOOST_TEST(closed.verdict.rfind("dead-lettered: stripe rejected: test (letter " +
                                            std::to_string(gone) + " dismissed at ",
                                        0) == 0u,
                   closed.verdict);
    });
}

// explain's verdict table (docs/operating/cli.md), the rows explain_answers_for_every_ledger_state leaves
// out: processing, failed after processing, pending with its lease expired, failed and conflict without an
// open letter; and --stripe-customer on the issue's second incident — one Stripe customer billed under
// `C-05` and `c-05` is charged twice, which per key looks like two single charges.
BOOST_FIXTURE_TEST_CASE(explain_verdicts_by_table_and_by_stripe_customer, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        co_await migrate();
        const std::string p = "2026-03";
        nsqd->publish(topic, event_json("C-05", p, 900, "cus_05"));
        nsqd->publish(topic, event_json("c-05", p, 900, "cus_05"));
        nsqd->publish(topic, event_json("c-06", p, 900, "cus_06"));
        auto& consumer = spawn_consume(nsqd->tcp_address());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 3u; }, seconds(40)),
                           consumer.err());
        co_await stop_cleanly(consumer);
        auto insert = [&](const std::string& customer, const std::string& cols, const std::string& values) {
            return query(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status" +
                cols + ") VALUES ('" + key_of(customer, p) + "', '" + customer + "', '" + p +
                "', 1300, 'usd', 'cus_t'" + values + ")");
        };
        co_await insert(
            "t-processing",
            ", charge_id, stripe_status, stripe_status_at, processing_since, raw_body, nsq_topic, "
            "nsq_channel",
            ", 'processing', 'py_t1', 'processing', now(), now(), '\\x7b7d', 'billing', 'chargeguard'");
        co_await insert("t-late", ", last_error", ", 'failed_after_processing', 'insufficient_funds'");
        co_await insert("t-expired", ", lease_until, stripe_attempts, first_stripe_attempt_at",
                        ", 'pending', now() - interval '1 minute', 1, now()");
        co_await insert("t-failed", ", last_error", ", 'failed', 'No such customer'");
        co_await insert("t-conflict", ", last_error", ", 'conflict', 'Keys for idempotent requests'");
        struct want {
            std::string customer, state, verdict_prefix;
        };
        const std::vector<want> table = {
            {"t-processing", "processing", "processing since "},
            {"t-late", "failed_after_processing", "failed after processing: insufficient_funds"},
            {"t-expired", "pending", "pending: lease expired; the next delivery resumes it"},
            {"t-failed", "failed", "failed: No such customer"},
            {"t-conflict", "conflict", "conflict: Keys for idempotent requests"},
            {"c-05", "charged", "charged once: ch_"},
        };
        child* c = nullptr;
        for (const auto& w : table) {
            BOOST_TEST_CONTEXT(w.customer) {
                BOOST_TEST(co_await run_cmd(c, argv("explain", "--customer", w.customer, "--period", p,
                                                    "--key-namespace", key_namespace, "--pg-dsn", dsn(),
                                                    "--json")) == (w.state == "charged" ? 0 : 2),
                           c->err());
                auto x = parse_explained(c->out());
                BOOST_TEST(x.state == w.state);
                BOOST_TEST(x.verdict.rfind(w.verdict_prefix, 0) == 0u, x.verdict);
            }
        }
        auto by_cus = [&](const std::string& cus, bool stripe) {
            auto a = argv("explain", "--stripe-customer", cus, "--period", p, "--pg-dsn", dsn());
            if (stripe) {
                a.push_back("--stripe");
                auto s = stripe_args();
                a.insert(a.end(), s.begin(), s.end());
            }
            return a;
        };
        auto c05 = charges_for(*fake, key_of("C-05", p)).first,
             c05b = charges_for(*fake, key_of("c-05", p)).first;
        BOOST_TEST_REQUIRE(c05.size() == 1u);
        BOOST_TEST_REQUIRE(c05b.size() == 1u);
        // Each key alone is charged once.
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "c-05", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 0,
            c->err());
        BOOST_TEST(runbook_mismatch("chargeguard explain --customer c-05 --period 2026-03", c->out()) == "");
        // The double charge, from Stripe and from the ledger alone: one verdict line.
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_05", true)) == 2, c->err());
        BOOST_TEST(c->out().find("verdict: charged twice: Stripe holds 2 payments of cus_05 for period " + p +
                                 " under 2 customer id(s) (") != std::string::npos,
                   c->out());
        BOOST_TEST(c->out().find("C-05: " + c05[0]) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("c-05: " + c05b[0]) != std::string::npos, c->out());
        BOOST_TEST(c->out().find("  ledger " + key_of("C-05", p) + ": customer C-05, charged 900 usd") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(runbook_mismatch("chargeguard explain --stripe-customer cus_05 --period 2026-03 --stripe",
                                    c->out()) == "");
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_05", false)) == 2, c->err());
        BOOST_TEST(c->out().find("verdict: charged twice: the ledger records 2 payments of cus_05") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_06", true)) == 0, c->err());
        BOOST_TEST(c->out().find("verdict: charged once: Stripe holds ch_") != std::string::npos, c->out());
        BOOST_TEST(co_await run_cmd(c, by_cus("cus_none", true)) == 2, c->err());
        BOOST_TEST(
            c->out().find("verdict: not charged: Stripe holds no payment of cus_none") != std::string::npos,
            c->out());
    });
}

namespace {

const std::string webhook_secret = "whsec_ops_payment_method_change";

// `chargeguard webhooks` beside consume, fake-stripe delivering its events to it (signed with the secret,
// which reaches the child through the environment, never argv). `retry`: with
// --retry-declined-on-payment-method-change. Returns the receiver once it listens.
net::awaitable<child*> start_receiver(ops& t, bool retry) {
    ::setenv("CHARGEGUARD_WEBHOOK_SECRET", webhook_secret.c_str(), 1);
    auto a = argv("webhooks", "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0", "--pg-dsn",
                  t.dsn(), "--shutdown-timeout", "10");
    if (retry) {
        auto more = argv("--retry-declined-on-payment-method-change", "--nsqd-tcp-address",
                         t.nsqd->tcp_address(), "--topic", topic);
        a.insert(a.end(), more.begin(), more.end());
        auto s = t.stripe_args();
        a.insert(a.end(), s.begin(), s.end());
    }
    child& r = t.spawn(a);
    const std::regex listening(R"("msg":"webhook receiver listening"[^\n]*"port":([0-9]+))");
    std::smatch m;
    std::string log;
    BOOST_TEST_REQUIRE(co_await eventually(
                           [&] {
                               log = r.err();
                               return std::regex_search(log, m, listening);
                           },
                           seconds(30)),
                       r.err());
    fake::webhook_endpoint e;
    e.url = "http://127.0.0.1:" + m[1].str() + "/stripe/webhooks";
    e.secrets = {webhook_secret};
    e.retry_base_ms = 200;
    e.retry_max_ms = 1000;
    t.fake->webhooks().configure(e);
    co_return &r;
}

// The auto-retry tests' start: nsqd and the schema, Stripe declining each of `declined` (Stripe customer
// ids), the `events` published and consumed to their decline. Returns the consumer, still running.
net::awaitable<child*> declined_first(ops& t, std::vector<std::string> declined,
                                      std::vector<std::string> events) {
    t.start_nsqd();
    co_await t.migrate();
    for (const auto& customer : declined) t.fake->decline(customer);
    for (const auto& body : events) t.nsqd->publish(topic, body);
    auto& consumer = t.spawn_consume(t.nsqd->tcp_address());
    BOOST_TEST_REQUIRE(
        co_await eventually([&] { return t.nsqd->channel(topic, channel).finish_count == events.size(); },
                            seconds(40)),
        consumer.err());
    co_return &consumer;
}

// Every event fake-stripe made has been answered 2xx by the receiver (each copy of a duplicated one).
bool all_acked(ops& t) {
    const auto st = t.fake->webhooks().stats();
    return st.outstanding == 0 && st.acked_events == st.events;
}

}  // namespace

// The automatic retry: a declined customer attaches a new card; Stripe's payment_method.attached reaches
// `chargeguard webhooks --retry-declined-on-payment-method-change`, which retries the customer's declined
// row through retry-declined's path (recorded by webhook:<event id>, why the event type) and `consume`
// charges it, once. The retry shows in `explain`.
BOOST_FIXTURE_TEST_CASE(a_card_attached_at_stripe_retries_the_declined_key_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::string p = "2026-08";
        // cus_w9: another customer, never retried.
        const std::vector<std::string> declined{"cus_w1", "cus_w9"},
            events{event_json("w1", p, 1500, "cus_w1"), event_json("w9", p, 1900, "cus_w9")};
        auto& consumer = *co_await declined_first(*this, declined, events);
        child* receiver = co_await start_receiver(*this, true);
        const std::string pm = fake->attach_payment_method("cus_w1");
        const std::string event_id = fake->events().back().id;
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return charges_for(*fake, key_of("w1", p)).first.size() == 1u; },
                                seconds(40)),
            receiver->err() + consumer.err());
        BOOST_TEST_REQUIRE(co_await eventually([&] { return all_acked(*this); }, seconds(20)),
                           receiver->err());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count == 3u; }, seconds(20)),
                           consumer.err());
        auto row =
            co_await query("SELECT status, key_generation, charge_id FROM billing_records WHERE key = '" +
                           key_of("w1", p) + "'");
        BOOST_TEST(row.text(0, 0) == "charged");
        BOOST_TEST(row.text(0, 1) == "2");
        BOOST_TEST(row.text(0, 2) == charges_for(*fake, key_of("w1", p)).first[0]);
        BOOST_TEST(charges_for(*fake, key_of("w1", p)).second == 2u);  // the decline, then the retry
        auto retries = co_await query("SELECT key, requested_by, reason FROM billing_retries");
        BOOST_TEST_REQUIRE(retries.size() == 1u);
        BOOST_TEST(retries.text(0, 0) == key_of("w1", p));
        BOOST_TEST(retries.text(0, 1) == "webhook:" + event_id);
        BOOST_TEST(retries.text(0, 2) == "payment_method.attached");
        auto other =
            co_await query("SELECT status FROM billing_records WHERE key = '" + key_of("w9", p) + "'");
        BOOST_TEST(other.text(0, 0) == "declined");
        BOOST_TEST(receiver->err().find(pm) != std::string::npos, receiver->err());
        child* c = nullptr;
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "w1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn())) == 0,
            c->err());
        BOOST_TEST(c->out().find("attempt 2 (generation 2): retry #1 by webhook:" + event_id + " at ") !=
                       std::string::npos,
                   c->out());
        BOOST_TEST(c->out().find(": payment_method.attached -> charged (charge ") != std::string::npos,
                   c->out());
        // The same as JSON: each attempt an object of the array, the retry's requester in it.
        BOOST_TEST_REQUIRE(
            co_await run_cmd(c, argv("explain", "--customer", "w1", "--period", p, "--key-namespace",
                                     key_namespace, "--pg-dsn", dsn(), "--json")) == 0,
            c->err());
        {
            simdjson::dom::parser jp;
            simdjson::dom::element doc;
            const std::string json = c->out();
            BOOST_TEST_REQUIRE(jp.parse(json).get(doc) == simdjson::SUCCESS, json);
            simdjson::dom::array attempts, letters;
            BOOST_TEST_REQUIRE(doc["attempts"].get(attempts) == simdjson::SUCCESS, json);
            BOOST_TEST_REQUIRE(attempts.size() == 2u, json);
            std::string_view started, generation;
            BOOST_TEST_REQUIRE(attempts.at(1)["started"].get(started) == simdjson::SUCCESS, json);
            BOOST_TEST(std::string(started).find("retry #1 by webhook:" + event_id) != std::string::npos,
                       json);
            BOOST_TEST_REQUIRE(attempts.at(1)["generation"].get(generation) == simdjson::SUCCESS, json);
            BOOST_TEST(generation == "2");
            BOOST_TEST_REQUIRE(doc["dead_letters"].get(letters) == simdjson::SUCCESS, json);
            BOOST_TEST(letters.size() == 0u);
        }
        co_await stop_cleanly(*receiver);
        co_await stop_cleanly(consumer);
    });
}

// The same event delivered twice, and a second event (customer.updated: the new card made the default)
// close behind it, each delivered twice: one retry, one charge.
BOOST_FIXTURE_TEST_CASE(a_duplicated_event_and_a_second_event_retry_once, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::string p = "2026-08";
        const std::vector<std::string> declined{"cus_w2"}, events{event_json("w2", p, 1600, "cus_w2")};
        auto& consumer = *co_await declined_first(*this, declined, events);
        child* receiver = co_await start_receiver(*this, true);
        fake->webhooks().faults().duplicate = 2;
        const std::string pm = fake->attach_payment_method("cus_w2");
        const std::string attached = fake->events().back().id;
        fake->set_default_payment_method("cus_w2", pm);
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return charges_for(*fake, key_of("w2", p)).first.size() == 1u; },
                                seconds(40)),
            receiver->err() + consumer.err());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return all_acked(*this) && fake->webhooks().stats().duplicates == 2u; },
                                seconds(20)),
            receiver->err());
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] { return nsqd->channel(topic, channel).finish_count >= 2u; }, seconds(20)),
                           consumer.err());
        auto retries = co_await query("SELECT count(*), min(requested_by) FROM billing_retries");
        BOOST_TEST(retries.text(0, 0) == "1");
        BOOST_TEST(retries.text(0, 1) == "webhook:" + attached);
        auto [ok, all] = charges_for(*fake, key_of("w2", p));
        BOOST_TEST(ok.size() == 1u);
        BOOST_TEST(all == 2u);
        auto row = co_await query("SELECT status, key_generation FROM billing_records WHERE key = '" +
                                  key_of("w2", p) + "'");
        BOOST_TEST(row.text(0, 0) == "charged");
        BOOST_TEST(row.text(0, 1) == "2");
        co_await stop_cleanly(*receiver);
        co_await stop_cleanly(consumer);
    });
}

// The new card is declined too: the event's retry is declined again. Stripe redelivering that event (same id,
// same body) retries nothing more — the retry statement skips a row this event retried before — while a new
// event (the card made the default) is a new request and retries once more.
BOOST_FIXTURE_TEST_CASE(a_redelivered_event_never_retries_a_row_twice, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::string p = "2026-08", key = key_of("w4", p);
        const std::vector<std::string> declined{"cus_w4"}, events{event_json("w4", p, 1800, "cus_w4")};
        auto& consumer = *co_await declined_first(*this, declined, events);
        child* receiver = co_await start_receiver(*this, true);
        const std::string pm = fake->attach_payment_method("cus_w4");
        const auto attached = fake->events().back();
        fake->decline("cus_w4");  // the new card is declined as well
        auto row_is = [&](const std::string& status, const std::string& generation) -> net::awaitable<bool> {
            auto r = co_await query("SELECT status, key_generation FROM billing_records WHERE key = '" + key +
                                    "'");
            co_return r.text(0, 0) == status&& r.text(0, 1) == generation;
        };
        bool declined_again = false;
        for (int i = 0; i < 400 && !declined_again; ++i) {
            // g++ 12: no co_await inside a conditional expression (docs/contributing.md).
            declined_again = co_await row_is("declined", "2");
            declined_again = declined_again && charges_for(*fake, key).second == 2u;
            if (!declined_again) co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST_REQUIRE(declined_again, receiver->err() + consumer.err());
        BOOST_TEST_REQUIRE(co_await eventually([&] { return all_acked(*this); }, seconds(20)),
                           receiver->err());
        // Stripe delivers the same event again.
        const auto acked_before = fake->webhooks().stats().acked;
        fake->webhooks().send({attached.id, attached.type, attached.object_id, attached.body});
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] {
                                   // A copy sent again is counted as one more event, not one more distinct
                                   // event.
                                   const auto st = fake->webhooks().stats();
                                   return st.outstanding == 0 && st.acked > acked_before;
                               },
                               seconds(20)),
                           receiver->err());
        auto retries = co_await query("SELECT count(*) FROM billing_retries WHERE key = '" + key + "'");
        BOOST_TEST(retries.text(0, 0) == "1");
        BOOST_TEST(co_await row_is("declined", "2"));
        BOOST_TEST(charges_for(*fake, key).second == 2u);
        BOOST_TEST(receiver->err().find(" retried it before") != std::string::npos, receiver->err());
        // A new event is a new request: one more retry, declined again, and still no success.
        fake->set_default_payment_method("cus_w4", pm);
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return charges_for(*fake, key).second == 3u; }, seconds(40)),
            receiver->err() + consumer.err());
        bool settled = false;
        for (int i = 0; i < 400 && !settled; ++i) {
            settled = co_await row_is("declined", "3");
            if (!settled) co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST(settled);
        auto both = co_await query("SELECT string_agg(reason, ',' ORDER BY generation) FROM billing_retries");
        BOOST_TEST(both.text(0, 0) == "payment_method.attached,customer.updated");
        BOOST_TEST(charges_for(*fake, key).first.empty());
        co_await stop_cleanly(*receiver);
        co_await stop_cleanly(consumer);
    });
}

// A Connect event names its account: the customer's card changed there, so only the rows of that account are
// retried — the same customer id's declined row on the platform is another customer's, and stays declined.
BOOST_FIXTURE_TEST_CASE(a_card_change_retries_only_the_rows_of_its_account, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::string p = "2026-08", acct = "acct_1CardW5";
        fake->add_account(acct, {"cus_w5"});
        auto connected = event_json("w5", p, 1501, "cus_w5");
        connected.pop_back();
        const std::vector<std::string> declined{"cus_w5"},
            events{event_json("w5", p, 1500, "cus_w5"), connected + R"(,"stripe_account":")" + acct + "\"}"};
        auto& consumer = *co_await declined_first(*this, declined, events);
        child* receiver = co_await start_receiver(*this, true);
        fake->attach_payment_method("cus_w5", acct);
        BOOST_TEST_REQUIRE(co_await eventually(
                               [&] {
                                   for (const auto& ch : fake->charges())
                                       if (ch.status == "succeeded") return true;
                                   return false;
                               },
                               seconds(40)),
                           receiver->err() + consumer.err());
        BOOST_TEST_REQUIRE(co_await eventually([&] { return all_acked(*this); }, seconds(20)),
                           receiver->err());
        bool settled = false;
        pg::rows rows;
        for (int i = 0; i < 400 && !settled; ++i) {
            rows = co_await query(
                "SELECT coalesce(stripe_account, ''), status, key_generation FROM billing_records "
                "WHERE customer_id = 'w5' ORDER BY 1");
            settled = rows.size() == 2u && rows.text(1, 1) == "charged";
            if (!settled) co_await net::sleep_for(milliseconds(50));
        }
        BOOST_TEST_REQUIRE(settled);
        BOOST_TEST(rows.text(0, 0) == "");
        BOOST_TEST(rows.text(0, 1) == "declined");
        BOOST_TEST(rows.text(0, 2) == "1");
        BOOST_TEST(rows.text(1, 0) == acct);
        BOOST_TEST(rows.text(1, 2) == "2");
        auto retries = co_await query("SELECT count(*) FROM billing_retries");
        BOOST_TEST(retries.text(0, 0) == "1");
        std::size_t succeeded = 0;
        for (const auto& ch : fake->charges())
            if (ch.status == "succeeded") {
                ++succeeded;
                BOOST_TEST(ch.account == acct);
            }
        BOOST_TEST(succeeded == 1u);
        co_await stop_cleanly(*receiver);
        co_await stop_cleanly(consumer);
    });
}

// Without --retry-declined-on-payment-method-change the same event is recorded and nothing is retried.
BOOST_FIXTURE_TEST_CASE(without_the_flag_a_card_change_retries_nothing, ops) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::string p = "2026-08";
        const std::vector<std::string> declined{"cus_w3"}, events{event_json("w3", p, 1700, "cus_w3")};
        auto& consumer = *co_await declined_first(*this, declined, events);
        child* receiver = co_await start_receiver(*this, false);
        const std::string pm = fake->attach_payment_method("cus_w3");
        fake->set_default_payment_method("cus_w3", pm);
        BOOST_TEST_REQUIRE(co_await eventually([&] { return all_acked(*this); }, seconds(20)),
                           receiver->err());
        auto recorded = co_await query("SELECT count(*) FROM stripe_webhook_events");
        BOOST_TEST(recorded.text(0, 0) == "2");
        auto retries = co_await query("SELECT count(*) FROM billing_retries");
        BOOST_TEST(retries.text(0, 0) == "0");
        auto row = co_await query("SELECT status FROM billing_records WHERE key = '" + key_of("w3", p) + "'");
        BOOST_TEST(row.text(0, 0) == "declined");
        BOOST_TEST(charges_for(*fake, key_of("w3", p)).second == 1u);
        BOOST_TEST(nsqd->topic_message_count(topic) == 1u);
        co_await stop_cleanly(*receiver);
        co_await stop_cleanly(consumer);
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
