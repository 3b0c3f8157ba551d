// The built binary's process hygiene, end to end: the schema gate (an older database makes consume wait
// without consuming until it is migrated; a newer one starts only when declared compatible), N concurrent
// `chargeguard migrate` runs against one fresh database, --version, the refusal of plain-http origins and
// the key file's checks. Against fake-nsqd, fake-stripe (TLS) and scratch PostgreSQL databases; awaited on
// the child's log, its /startupz and /metrics, fake-nsqd and PostgreSQL — never on sleeps. Skipped (exit 77)
// without PGHOST.
#define BOOST_TEST_MODULE process_e2e
#define BOOST_TEST_NO_MAIN
#include <sys/stat.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>

#include "billing/machine/key.hpp"
#include "http/client.hpp"
#include "pg/migrations.hpp"
#include "support/chargeguard_e2e.hpp"
#include "support/pg_main.hpp"
#include "support/prom_text.hpp"
#include "support/run_async.hpp"
#include "tests/integration/nsq/helpers.hpp"

using namespace cg;
using namespace std::chrono;
using nsqtest::eventually;
namespace fs = std::filesystem;

namespace {

const std::string topic = "billing", channel = "chargeguard";
const std::string stripe_key = "sk_test_process_never_logged";

std::string event_json(int customer) {
    return R"({"customer_id":"cust-)" + std::to_string(customer) +
           R"(","billing_period":"2024-09","amount_cents":1200,"currency":"usd","stripe_customer_id":"cus_p",)"
           R"("description":"plan"})";
}

struct child : test::child_process {
    unsigned short health_port = 0;
};

// The repository's migrations/ (meson sets CG_MIGRATIONS_DIR).
std::string source_migrations() {
    const char* d = std::getenv("CG_MIGRATIONS_DIR");
    BOOST_TEST_REQUIRE(d != nullptr, "CG_MIGRATIONS_DIR not set (meson sets it)");
    return d;
}

struct proc : test::chargeguard_e2e<child> {
    proc() : chargeguard_e2e("process", ::topic, ::channel, ::stripe_key) {}

    std::vector<std::string> consume_args(const std::string& dbname) const {
        return {"consume",
                "--topic",
                topic,
                "--channel",
                channel,
                "--nsqd-tcp-address",
                nsqd->tcp_address(),
                "--heartbeat-interval",
                "1s",
                "--pg-dsn",
                "dbname=" + dbname,
                "--stripe-api-base",
                "https://127.0.0.1:" + std::to_string(port),
                "--stripe-ca-file",
                test::cert("ca.pem"),
                "--key-namespace",
                "process",
                "--health-listen",
                "127.0.0.1:0",
                "--shutdown-timeout",
                "10",
                "--max-loop-lag",
                "5"};
    }

    // A migrations directory holding the embedded migrations up to `upto` plus `extra` (name → SQL).
    std::string migrations_dir(const std::string& tag, int upto,
                               const std::vector<std::pair<std::string, std::string>>& extra = {}) {
        std::string dir = tmp + "-" + tag;
        fs::remove_all(dir);
        fs::create_directories(dir);
        dirs_.push_back(dir);
        for (const auto& e : fs::directory_iterator(source_migrations())) {
            auto name = e.path().filename().string();
            if (e.path().extension() == ".sql" && std::stoi(name.substr(0, 4)) <= upto)
                fs::copy_file(e.path(), dir + "/" + name);
        }
        for (const auto& [name, sql] : extra) std::ofstream(dir + "/" + name) << sql;
        return dir;
    }
    ~proc() {
        for (const auto& d : dirs_) fs::remove_all(d);
    }

    // Runs one `chargeguard migrate` to completion; returns its exit code.
    net::awaitable<int> migrate(const std::string& dbname, const std::string& dir = "") {
        std::vector<std::string> args{"migrate", "--pg-dsn", "dbname=" + dbname};
        if (!dir.empty()) args.insert(args.end(), {"--migrations-dir", dir});
        auto& c = children.spawn(args);
        int rc = co_await wait_exit(c, seconds(60));
        BOOST_TEST(rc == 0, c.err());
        co_return rc;
    }

    net::awaitable<void> await_port(child& c) {
        bool up = co_await eventually([&] { return c.logged_port().has_value(); }, seconds(20));
        BOOST_TEST_REQUIRE(up, c.err());
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

    net::awaitable<double> gauge(const child& c, const std::string& name) {
        auto r = co_await get(c, "/metrics");
        BOOST_TEST_REQUIRE(r.ok());
        auto fams = test::parse_prometheus(r.resp.body);
        auto it = fams.find(name);
        BOOST_TEST_REQUIRE((it != fams.end()), name);
        co_return it->second.samples.at(0).value;
    }

    // Waits until `path` answers `status`.
    net::awaitable<bool> await_status(const child& c, const std::string& path, int status, seconds limit) {
        auto end = steady_clock::now() + limit;
        while (steady_clock::now() < end) {
            auto r = co_await get(c, path);
            if (r.ok() && r.resp.status == status) co_return true;
            co_await net::sleep_for(milliseconds(20));
        }
        co_return false;
    }

    net::awaitable<void> terminate(child& c) {
        ::kill(c.pid, SIGTERM);
        BOOST_TEST(co_await wait_exit(c, seconds(20)) == 0, c.err());
    }

    // A child run to its exit for a configuration error: its exit code and stderr.
    net::awaitable<std::pair<int, std::string>> run_to_exit(std::vector<std::string> args) {
        auto& c = children.spawn(std::move(args));
        int rc = co_await wait_exit(c, seconds(20));
        co_return std::pair{rc, c.err() + c.out()};
    }

    std::vector<std::string> dirs_;
};

template <typename F>
void run(proc& f, F body, seconds limit = seconds(90)) {
    test::run_async(f.io, body, limit);
}

bool has(const std::string& text, const std::string& what) {
    return text.find(what) != std::string::npos;
}

}  // namespace

// A database one migration behind: consume starts its health server but does not subscribe to nsqd; it says
// why in its log, on /startupz and /readyz, and in chargeguard_schema_*; once `chargeguard migrate` runs it
// starts by itself and charges.
BOOST_FIXTURE_TEST_CASE(older_schema_waits_without_consuming_until_migrated, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        const int required = ms->back().version;
        co_await migrate(db.name, migrations_dir("old", required - 1));
        nsqd->publish(topic, event_json(1));

        auto& c = children.spawn(consume_args(db.name));
        co_await await_port(c);
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return has(c.err(), "database schema is older"); }, seconds(20)),
            c.err());
        char missing[64];
        std::snprintf(missing, sizeof missing, "missing %04d", required);
        auto st = co_await get(c, "/startupz");
        BOOST_TEST_REQUIRE(st.ok());
        BOOST_TEST(st.resp.status == 503);
        BOOST_TEST(has(st.resp.body, "WAIT schema: "), st.resp.body);
        BOOST_TEST(has(st.resp.body, missing), st.resp.body);
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST(ready.resp.status == 503);
        BOOST_TEST(has(ready.resp.body, "FAIL schema: "), ready.resp.body);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_ok") == 0);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_version") == required - 1);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_required_version") == required);
        BOOST_TEST(nsqd->client_count() == 0u);  // no live work: not even a subscription
        BOOST_TEST(nsqd->channel(topic, channel).finish_count == 0u);
        BOOST_TEST(fake->charges().empty());

        co_await migrate(db.name);
        BOOST_TEST_REQUIRE(co_await await_status(c, "/startupz", 200, seconds(30)), c.err());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            c.err());
        BOOST_TEST(fake->charges().size() == 1u);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_ok") == 1);
        BOOST_TEST(co_await gauge(c, "chargeguard_schema_version") == required);
        BOOST_TEST(has(c.err(), "database schema fits this binary"));
        co_await terminate(c);
    });
}

// With lookupd discovery and a topic nobody has published yet there is no nsqd to subscribe to: an
// nsqlookupd answering (404 TOPIC_NOT_FOUND) is NSQ reached, so /startupz passes (a native sidecar's startup
// probe must not keep the billing app, which creates the topic, from starting) while /readyz still says no
// nsqd is subscribed; once the topic has a producer, consume finds it and charges.
BOOST_FIXTURE_TEST_CASE(lookupd_answer_without_topic_completes_startup, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        test::nsq::fake_nsqlookupd lookupd(io.get_executor());
        BOOST_TEST_REQUIRE(lookupd.start().has_value());
        co_await migrate(db.name);
        auto args = consume_args(db.name);
        auto at = std::find(args.begin(), args.end(), "--nsqd-tcp-address");
        BOOST_TEST_REQUIRE((at != args.end()));
        *at = "--lookupd-http-address";
        *(at + 1) = lookupd.http_address();
        args.insert(args.end(), {"--lookupd-poll-interval", "1s"});
        auto& c = children.spawn(args);
        co_await await_port(c);
        BOOST_TEST_REQUIRE(co_await await_status(c, "/startupz", 200, seconds(30)), c.err());
        BOOST_TEST(lookupd.lookups() > 0u);
        auto ready = co_await get(c, "/readyz");
        BOOST_TEST(ready.resp.status == 503, ready.resp.body);
        BOOST_TEST(nsqd->client_count() == 0u);

        nsqd->publish(topic, event_json(3));
        lookupd.add_producer(topic, nsqd->producer());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            c.err());
        BOOST_TEST(fake->charges().size() == 1u);
        co_await terminate(c);
        lookupd.stop();
    });
}

// A rollback: the database carries a migration newer than the binary. Declared compatible down to the
// binary's schema, consume starts; undeclared, it exits 1 at once, naming the versions.
BOOST_FIXTURE_TEST_CASE(newer_schema_starts_only_when_declared_compatible, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        start_nsqd();
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        const int required = ms->back().version;
        char next[16], req4[16];
        std::snprintf(next, sizeof next, "%04d", required + 1);
        std::snprintf(req4, sizeof req4, "%04d", required);
        const std::vector<std::pair<std::string, std::string>> compatible{
            {std::string(next) + "_future_column.sql",
             std::string("-- chargeguard: compatible-down-to ") + req4 +
                 "\nALTER TABLE billing_records ADD COLUMN future_note text;\n"}};
        auto compatible_dir = migrations_dir("compatible", required, compatible);
        co_await migrate(db.name, compatible_dir);
        nsqd->publish(topic, event_json(2));
        auto& ok = children.spawn(consume_args(db.name));
        co_await await_port(ok);
        BOOST_TEST_REQUIRE(co_await await_status(ok, "/startupz", 200, seconds(30)), ok.err());
        BOOST_TEST_REQUIRE(
            co_await eventually([&] { return nsqd->channel(topic, channel).finish_count == 1; }, seconds(30)),
            ok.err());
        BOOST_TEST(co_await gauge(ok, "chargeguard_schema_ok") == 1);
        BOOST_TEST(co_await gauge(ok, "chargeguard_schema_version") == required + 1);
        co_await terminate(ok);

        test::scratch_db other("process_newer");
        const std::vector<std::pair<std::string, std::string>> incompatible{
            {std::string(next) + "_future_table.sql", "CREATE TABLE future_thing (id integer);\n"}};
        auto incompatible_dir = migrations_dir("incompatible", required, incompatible);
        co_await migrate(other.name, incompatible_dir);
        auto& refused = children.spawn(consume_args(other.name));
        int rc = co_await wait_exit(refused, seconds(30));
        BOOST_TEST(rc == 1, refused.err());
        BOOST_TEST(has(refused.err(), "need binaries from " + std::string(next)), refused.err());
        BOOST_TEST(has(refused.err(), "incompatible database schema"), refused.err());
    });
}

// Five `chargeguard migrate` processes against one fresh database while this test holds the migration lock:
// all five wait on it (PostgreSQL shows five ungranted advisory locks), then exactly one applies every
// migration, the other four find them applied, and all exit 0.
BOOST_FIXTURE_TEST_CASE(concurrent_migrates_apply_once, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        auto ms = pg::embedded_migrations();
        BOOST_TEST_REQUIRE(ms.has_value());
        auto holder = co_await pg->acquire();
        BOOST_TEST_REQUIRE(holder.has_value());
        auto locked = co_await (*holder)->query("SELECT pg_advisory_lock($1)", pg::migration_lock_key);
        BOOST_TEST_REQUIRE(locked.has_value());

        std::vector<child*> runs;
        for (int i = 0; i < 5; ++i)
            runs.push_back(&children.spawn({"migrate", "--pg-dsn", "dbname=" + db.name}));
        std::int64_t waiting = 0;
        auto end = steady_clock::now() + seconds(30);
        while (waiting < 5 && steady_clock::now() < end) {
            auto r = co_await query(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                "database = (SELECT oid FROM pg_database WHERE datname = current_database())");
            waiting = r.get<std::int64_t>(0, 0);
            if (waiting < 5) co_await net::sleep_for(milliseconds(20));
        }
        BOOST_TEST_REQUIRE(waiting == 5);
        for (auto* c : runs) BOOST_TEST(::waitpid(c->pid, nullptr, WNOHANG) == 0);  // all still waiting
        auto unlocked = co_await (*holder)->query("SELECT pg_advisory_unlock($1)", pg::migration_lock_key);
        BOOST_TEST_REQUIRE(unlocked.has_value());

        const std::string n = std::to_string(ms->size());
        int applied_all = 0, saw_applied = 0;
        for (auto* c : runs) {
            BOOST_TEST(co_await wait_exit(*c, seconds(60)) == 0, c->err());
            auto out = c->out();
            if (has(out, n + " applied, 0 already applied")) ++applied_all;
            if (has(out, "0 applied, " + n + " already applied")) ++saw_applied;
        }
        BOOST_TEST(applied_all == 1);
        BOOST_TEST(saw_applied == 4);
        auto rows = co_await query("SELECT count(*), count(DISTINCT version) FROM schema_migrations");
        BOOST_TEST(rows.get<std::int64_t>(0, 0) == static_cast<std::int64_t>(ms->size()));
        BOOST_TEST(rows.get<std::int64_t>(0, 1) == static_cast<std::int64_t>(ms->size()));
    });
}

// `chargeguard --version` and `chargeguard version` print the same line: version, revision, build type.
BOOST_FIXTURE_TEST_CASE(version_names_revision_and_build_type, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> flag_args{"--version"}, cmd_args{"version"};
        auto [rc1, flag] = co_await run_to_exit(flag_args);
        auto [rc2, cmd] = co_await run_to_exit(cmd_args);
        BOOST_TEST(rc1 == 0);
        BOOST_TEST(rc2 == 0);
        BOOST_TEST(flag == cmd);
        BOOST_TEST(has(cmd, "chargeguard " CHARGEGUARD_TEST_VERSION " (revision "), cmd);
        BOOST_TEST(has(cmd, ", " CHARGEGUARD_TEST_BUILD_TYPE ")"), cmd);
        BOOST_TEST(!has(cmd, "(revision , "), cmd);
    });
}

// http:// to Stripe or to the vault's upstream is a configuration error unless --allow-insecure-http is on
// the command line; the environment cannot switch it on.
BOOST_FIXTURE_TEST_CASE(plain_http_origins_are_refused, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> nsq{"--topic",    "t", "--channel", "c", "--nsqd-tcp-address",
                                           "127.0.0.1:1"};
        std::vector<std::string> consume{"consume", "--stripe-api-base", "http://127.0.0.1:1"};
        consume.insert(consume.end(), nsq.begin(), nsq.end());
        ::setenv("CHARGEGUARD_ALLOW_INSECURE_HTTP", "1", 1);
        auto [rc, err] = co_await run_to_exit(consume);
        ::unsetenv("CHARGEGUARD_ALLOW_INSECURE_HTTP");
        BOOST_TEST(rc != 0);
        BOOST_TEST(has(err, "--stripe-api-base"), err);
        BOOST_TEST(has(err, "http://127.0.0.1:1 is plain http"), err);

        const std::vector<std::string> proxy_args{"proxy", "--upstream", "http://127.0.0.1:1"};
        auto [prc, perr] = co_await run_to_exit(proxy_args);
        BOOST_TEST(prc != 0);
        BOOST_TEST(has(perr, "--upstream"), perr);
        BOOST_TEST(has(perr, "is plain http"), perr);

        // Allowed: past the configuration (it then fails on PostgreSQL, which is not what this is about).
        std::vector<std::string> allowed = consume;
        allowed.insert(allowed.end(), {"--allow-insecure-http", "--pg-dsn", "host=127.0.0.1 port=1",
                                       "--pg-startup-timeout", "0", "--health-listen", "127.0.0.1:0"});
        auto [arc, aerr] = co_await run_to_exit(allowed);
        BOOST_TEST(!has(aerr, "plain http"), aerr);
        BOOST_TEST(has(aerr, "consume starting"), aerr);
        (void)arc;
    });
}

// The key's shape is checked before anything connects, with a message naming where the key came from and
// never showing it.
BOOST_FIXTURE_TEST_CASE(key_file_shape_is_checked, proc) {
    run(*this, [this]() -> net::awaitable<void> {
        const std::vector<std::string> base{
            "consume", "--topic", "t", "--channel", "c", "--nsqd-tcp-address", "127.0.0.1:1"};
        auto with_key_file = [&](const std::string& path) {
            auto a = base;
            a.insert(a.end(), {"--stripe-key-file", path});
            return a;
        };
        std::string file = tmp + "-key";
        std::ofstream(file) << "hello_not_a_key\n";
        auto [rc, err] = co_await run_to_exit(with_key_file(file));
        BOOST_TEST(rc != 0);
        BOOST_TEST(has(err, "the key from --stripe-key-file '" + file + "' is not a Stripe secret"), err);
        BOOST_TEST(!has(err, "hello_not_a_key"), err);

        std::ofstream(file) << "sk_test_ab cd\n";
        auto [wrc, werr] = co_await run_to_exit(with_key_file(file));
        BOOST_TEST(wrc != 0);
        BOOST_TEST(has(werr, "'" + file + "' contains whitespace"), werr);
        BOOST_TEST(!has(werr, "sk_test_ab"), werr);

        std::string dir = tmp + "-keydir";
        fs::create_directories(dir);
        auto [drc, derr] = co_await run_to_exit(with_key_file(dir));
        BOOST_TEST(drc != 0);
        BOOST_TEST(has(derr, "'" + dir + "' is a directory"), derr);

        auto [mrc, merr] = co_await run_to_exit(with_key_file(tmp + "-missing"));
        BOOST_TEST(mrc != 0);
        BOOST_TEST(has(merr, "cannot read --stripe-key-file '" + tmp + "-missing': No such file"), merr);

        ::setenv("STRIPE_API_KEY", "hello_env_not_a_key", 1);
        auto [erc, eerr] = co_await run_to_exit(base);
        ::setenv("STRIPE_API_KEY", stripe_key.c_str(), 1);
        BOOST_TEST(erc != 0);
        BOOST_TEST(has(eerr, "the key from STRIPE_API_KEY is not a Stripe secret"), eerr);
        BOOST_TEST(!has(eerr, "hello_env_not_a_key"), eerr);
        // The vault proxy holds the real key: a vault key (cgvk_) is refused there.
        ::setenv("STRIPE_API_KEY", "cgvk_abc_0123", 1);
        const std::vector<std::string> proxy_args{"proxy"};
        auto [vrc, verr] = co_await run_to_exit(proxy_args);
        ::setenv("STRIPE_API_KEY", stripe_key.c_str(), 1);
        BOOST_TEST(vrc != 0);
        BOOST_TEST(has(verr, "nor a vault key") == false, verr);
        BOOST_TEST(has(verr, "the key from STRIPE_API_KEY is not a Stripe secret"), verr);
        fs::remove(file);
        fs::remove_all(dir);
    });
}
