// Acknowledging on a row that is already there, against a cluster whose commits wait for a synchronous
// standby that never connects (standby_cluster.hpp): a first commit whose wait was cancelled exists on the
// primary only, and a redelivery that finds it must not be acknowledged (a webhook's 2xx, a FIN) until the
// standby confirms it. Without that, a failover loses the row after the acknowledgement.
#include <boost/test/unit_test.hpp>

#include "billing/store/settlement_store.hpp"
#include "faults.hpp"
#include "standby_cluster.hpp"
#include "stripe/webhook_event.hpp"

using cg::test::cluster_waiting_for_a_standby;

namespace {

struct standby_fixture {
    pg_fixture f;
    cluster_waiting_for_a_standby srv{false};
    std::shared_ptr<pg::pool> pool;

    standby_fixture() {
        pg::pool_options o;
        o.server = test::server_config(srv.dsn());
        o.size = 2;
        // The schema first, with the default deadline: commits do not wait yet.
        auto setup = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
        cg::test::run_async(
            f.io, [&] { return migrate(setup); }, 120s);
        o.conn.query_timeout = 300ms;  // the deadline whose cancel ends a commit's wait
        pool = pg::pool::create(f.io.get_executor(), f.offload.get_executor(), o, logger());
        srv.require_standby();
    }
    static net::awaitable<void> migrate(std::shared_ptr<pg::pool> setup) {
        auto c = must(co_await setup->acquire(), "acquire");
        auto ms = must(pg::embedded_migrations(), "migrations");
        must(co_await pg::migrate(*c, ms, {}, logger()), "migrate");
    }
    std::string count(const std::string& table, const std::string& where) const {
        return srv.exec("SELECT count(*) FROM " + table + " WHERE " + where);
    }
};

// `attempt(n)` with n = 1, 2, … until one fails: the server applies synchronous_standby_names a moment after
// the reload, and until then commits succeed honestly. Returns the n whose commit was not confirmed.
template <class Attempt>
net::awaitable<int> first_unconfirmed(Attempt attempt) {
    auto until = sclock::now() + 15s;
    for (int n = 1;; ++n) {
        auto r = co_await attempt(n);
        if (!r) {
            BOOST_TEST((r.code() == pg::errc::timeout), r.err().describe());
            BOOST_TEST(r.err().describe().find("synchronous standby") != std::string::npos,
                       r.err().describe());
            co_return n;
        }
        BOOST_TEST_REQUIRE((sclock::now() < until), "commits never started waiting for the standby");
    }
}

std::string charge_event(int n) {
    const std::string id = std::to_string(n);
    return R"({"id":"evt_syncrep_)" + id +
           R"(","object":"event","type":"charge.succeeded","created":1800000000,"livemode":false,)"
           R"("data":{"object":{"id":"ch_syncrep_)" +
           id +
           R"(","object":"charge","amount":1999,"currency":"usd","customer":"cus_syncrep","status":"succeeded",)"
           R"("payment_intent":null,"amount_refunded":0,"metadata":{"billing_key":"syncrep-key"}}}})";
}

net::awaitable<result<billing::event_record_result>> record(billing::settlement_store& store, int n) {
    auto body = charge_event(n);
    auto env = must(stripe::parse_webhook_event(body), "parse");
    co_return co_await store.record_event(std::move(env), std::move(body));
}

net::awaitable<void> webhook_redelivery(standby_fixture& t) {
    billing::settlement_store store(t.pool);
    int n = co_await first_unconfirmed([&](int i) { return record(store, i); });
    // Stripe delivers the unacknowledged event again: the row is there (on the primary only).
    auto again = co_await record(store, n);
    BOOST_TEST(!again.has_value(), "a redelivery was acknowledged on an event the standby never confirmed"
                                       << (again ? (again->duplicate ? " (duplicate)" : " (recorded)") : ""));
    if (!again) BOOST_TEST((again.code() == pg::errc::timeout), again.err().describe());
}

BOOST_AUTO_TEST_CASE(a_webhook_redelivery_waits_for_the_standby_to_confirm_the_recorded_event) {
    standby_fixture t;
    cg::test::run_async(
        t.f.io, [&] { return webhook_redelivery(t); }, 60s);
    // The situation the test is about: the event is recorded on the primary, unconfirmed.
    BOOST_TEST(t.count("stripe_webhook_events", "id LIKE 'evt_syncrep_%'") != "0");
}

billing::dead_letter letter(int n) {
    billing::dead_letter l;
    l.topic = "billing";
    l.channel = "chargeguard";
    l.nsq_message_id = "0a0b0c0d0e0f" + std::to_string(1000 + n);
    l.attempts = 1;
    l.raw_body = "{not json";
    l.reason = "unparseable: expected a JSON object";
    return l;
}

net::awaitable<void> letter_redelivery(standby_fixture& t) {
    billing::ledger ledger(t.pool, billing::ledger_options{});
    int n = co_await first_unconfirmed([&](int i) { return ledger.add_dead_letter(letter(i)); });
    // NSQ delivers the message again (no FIN went out): its letter is there (on the primary only).
    auto again = co_await ledger.add_dead_letter(letter(n));
    BOOST_TEST(!again.has_value(), "a redelivered poison message would be FINed on an unconfirmed letter");
    if (!again) BOOST_TEST((again.code() == pg::errc::timeout), again.err().describe());
}

BOOST_AUTO_TEST_CASE(a_redelivered_poison_message_waits_for_the_standby_to_confirm_its_letter) {
    standby_fixture t;
    cg::test::run_async(
        t.f.io, [&] { return letter_redelivery(t); }, 60s);
    BOOST_TEST(t.count("dead_letters", "topic = 'billing'") != "0");
}

}  // namespace
