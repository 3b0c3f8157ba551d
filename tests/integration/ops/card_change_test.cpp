// ops_e2e: the automatic retry of a declined key when its customer's card changes at Stripe (`webhooks
// --retry-declined-on-payment-method-change`): once per key, per account, never twice, never without the
// flag.
#include <boost/test/unit_test.hpp>

#include "tests/integration/ops/ops_fixture.hpp"

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
