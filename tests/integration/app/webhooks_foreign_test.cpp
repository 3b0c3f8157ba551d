// The webhook receiver against a real PostgreSQL (webhooks_fixture.hpp): a fact about another payment — a
// foreign charge, one found by metadata only, another account's event — moves no row and writes no letter;
// poison events and events in another API version are refused once and recorded with their reason.
#include <boost/test/unit_test.hpp>

#include "webhooks_fixture.hpp"

namespace {

// A charge event: `pi` empty for a charge made without a PaymentIntent (by hand, /v1/charges); the row's key
// in its metadata, as another integration or a support agent copying it would leave it.
std::string charge_event(const std::string& evt, const std::string& type, const std::string& charge,
                         const std::string& pi, const std::string& status, const std::string& key) {
    return R"({"id":")" + evt + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,"data":{"object":{"id":")" +
           charge + R"(","object":"charge","status":")" + status + R"(","payment_intent":)" +
           (pi.empty() ? std::string("null") : "\"" + pi + "\"") +
           R"(,"failure_code":"card_declined","metadata":{"billing_key":")" + key + R"("}}}})";
}

// A PaymentIntent event, from `account` (Connect; empty: the platform's own, no "account" field).
std::string intent_event(const std::string& evt, const std::string& type, const std::string& pi,
                         const std::string& status, const std::string& key, const std::string& account = {}) {
    return R"({"id":")" + evt + R"(","object":"event","api_version":"2024-06-20","type":")" + type +
           R"(","created":)" + std::to_string(now_unix()) + R"(,"livemode":false,)" +
           (account.empty() ? std::string() : R"("account":")" + account + R"(",)") +
           R"("data":{"object":{"id":")" + pi + R"(","object":"payment_intent","status":")" + status +
           R"(","latest_charge":"ch_)" + pi + R"(","last_payment_error":{"code":"insufficient_funds"},)" +
           R"("metadata":{"billing_key":")" + key + R"("}}}})";
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(webhooks, webhooks_fixture)

// A charge.failed for a charge that carries the row's billing_key but is not its PaymentIntent's (made by
// hand, no PaymentIntent; or another integration's, another one): recorded, other_payment, the processing
// row untouched and no dead letter (a replay would charge again while the real debit may still succeed).
BOOST_AUTO_TEST_CASE(a_foreign_charge_failed_moves_nothing_and_writes_no_letter) {
    const std::string key = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    seed_processing(key, "c-foreign-1", "pi_own_1");
    auto r = send(delivery(charge_event("evt_ff_1", "charge.failed", "ch_by_hand", "", "failed", key),
                           current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    r = send(delivery(charge_event("evt_ff_2", "charge.failed", "ch_other_integration",
                                   "pi_other_integration", "failed", key),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') FROM billing_records WHERE key = '" +
                   key + "'") == "processing/-");
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
    BOOST_TEST(count_rows("id IN ('evt_ff_1', 'evt_ff_2') AND outcome = 'other_payment' AND applied_to = '" +
                          key + "'") == 2);
    BOOST_TEST(outcome("other_payment") == 2);
    BOOST_TEST(outcome("recorded") == 0);
    BOOST_TEST(events_result("other_payment") == 2);
    BOOST_TEST(counter("chargeguard_billing_failed_after_processing_total") == 0);
}

// A charge.succeeded of such a foreign charge does not mark the row charged; the row's own
// payment_intent.payment_failed afterwards applies: failed_after_processing, its dead letter.
BOOST_AUTO_TEST_CASE(a_foreign_charge_succeeded_does_not_mark_the_row_paid) {
    const std::string key = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
    seed_processing(key, "c-foreign-2", "pi_own_2");
    auto r =
        send(delivery(charge_event("evt_fs_1", "charge.succeeded", "ch_foreign_ok", "", "succeeded", key),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') FROM billing_records WHERE key = '" +
                   key + "'") == "processing/-");
    BOOST_TEST(count_rows("id = 'evt_fs_1' AND outcome = 'other_payment'") == 1);
    r = send(delivery(
        intent_event("evt_fs_2", "payment_intent.payment_failed", "pi_own_2", "requires_payment_method", key),
        current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(count_rows("id = 'evt_fs_2' AND outcome = 'applied'") == 1);
    BOOST_TEST(sql("SELECT status FROM billing_records WHERE key = '" + key + "'") ==
               "failed_after_processing");
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters WHERE billing_key = '" + key + "'") == "1");
    BOOST_TEST(counter("chargeguard_billing_failed_after_processing_total") == 1);
}

// Rows that hold no Stripe id can only be found by metadata. The receiver applies no such fact: a pending
// row's is deferred and marks the row for the sweeper (abandoned_sql::record_has_deferred_fact); a verdict
// the pipeline reached without a Stripe object (declined with no charge, cap_blocked, failed) stands, the
// fact unconfirmed, no alert. Each row is left as it was.
BOOST_AUTO_TEST_CASE(a_fact_found_by_metadata_only_moves_no_row) {
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"pending", "d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0d0"},
        {"declined", "d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1"},
        {"cap_blocked", "d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2"},
        {"failed", "d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3"},
    };
    for (const auto& [status, key] : rows) {
        auto seeded = run_async(io, [&]() -> net::awaitable<std::string> {
            auto c = co_await pool->acquire();
            if (!c) co_return c.err().describe();
            auto r = co_await (*c)->query_with(
                "INSERT INTO billing_records (key, customer_id, billing_period, amount_cents, currency, "
                "stripe_customer_id, status) VALUES ($1, 'c-' || $2, '2026-12', 1999, 'usd', 'cus_1', $2)",
                pg::params(key, status), 5s);
            co_return r ? std::string() : r.err().describe();
        });
        BOOST_TEST_REQUIRE(seeded.empty(), seeded);
        auto r = send(delivery(
            charge_event("evt_md_" + status, "charge.succeeded", "ch_md_" + status, "", "succeeded", key),
            current_secret, now_unix()));
        BOOST_TEST(r.status == 200, r.body);
        BOOST_TEST(sql("SELECT status || '/' || coalesce(charge_id, '-') || '/' || "
                       "coalesce(payment_intent_id, '-') FROM billing_records WHERE key = '" +
                       key + "'") == status + "/-/-");
        const std::string want = status == "pending" ? "deferred" : "unconfirmed";
        BOOST_TEST(count_rows("id = 'evt_md_" + status + "' AND outcome = '" + want + "' AND applied_to = '" +
                              key + "'") == 1,
                   status);
        const std::string marked = sql("SELECT count(*) FROM billing_records WHERE key = '" + key + "' AND " +
                                       billing::abandoned_sql::record_has_deferred_fact);
        BOOST_TEST(marked == (status == "pending" ? "1" : "0"), status);
    }
    BOOST_TEST(events_result("deferred") == 1);
    BOOST_TEST(events_result("unconfirmed") == 3);
    BOOST_TEST(events_result("applied") == 0);
    BOOST_TEST(counter("chargeguard_billing_settlement_anomalies_total") == 0);
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
}

// A Connect endpoint receives every connected account's events: an event from another account, or the
// platform's, naming the row's very PaymentIntent id, moves nothing; the row's own account's applies.
BOOST_AUTO_TEST_CASE(an_event_from_another_account_moves_nothing) {
    const std::string key = "c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2";
    seed_processing(key, "c-connect-1", "pi_connect_1", "acct_Rowsown");
    auto status = [&] { return sql("SELECT status FROM billing_records WHERE key = '" + key + "'"); };
    auto r = send(delivery(intent_event("evt_xa_1", "payment_intent.payment_failed", "pi_connect_1",
                                        "requires_payment_method", key, "acct_Someoneelse"),
                           current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    r = send(
        delivery(intent_event("evt_xa_2", "payment_intent.succeeded", "pi_connect_1", "succeeded", key, ""),
                 current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status() == "processing");
    BOOST_TEST(count_rows("id IN ('evt_xa_1', 'evt_xa_2') AND outcome = 'other_payment'") == 2);
    BOOST_TEST(sql("SELECT count(*) FROM dead_letters") == "0");
    r = send(delivery(intent_event("evt_xa_3", "payment_intent.succeeded", "pi_connect_1", "succeeded", key,
                                   "acct_Rowsown"),
                      current_secret, now_unix()));
    BOOST_TEST(r.status == 200, r.body);
    BOOST_TEST(status() == "charged");
    BOOST_TEST(outcome("other_payment") == 2);
    BOOST_TEST(outcome("recorded") == 1);
}

// Genuinely signed events no table can hold: answered 400 once with the refusal recorded (reason, body),
// then acknowledged (Stripe would otherwise redeliver for three days, each a 500 paging as an error).
BOOST_AUTO_TEST_CASE(poison_events_are_refused_once_and_recorded_with_their_reason) {
    const std::string head = R"({"object":"event","api_version":"2024-06-20","type":"charge.succeeded",)";
    const std::string int64_max = std::to_string(std::numeric_limits<std::int64_t>::max());
    const std::vector<std::pair<std::string, std::string>> poison = {
        {"evt_poison_time", R"({"id":"evt_poison_time",)" + head.substr(1) + R"("created":)" + int64_max +
                                R"(,"data":{"object":{"id":"ch_p1","object":"charge"}}})"},
        {"evt_poison_nul",
         R"({"id":"evt_poison_nul",)" + head.substr(1) + R"("created":)" + std::to_string(now_unix()) +
             R"(,"data":{"object":{"id":"ch_p2","object":"charge","metadata":{"note":"a\u0000b"}}}})"},
        {"evt_poison_dup",
         R"({"id":"evt_poison_dup",)" + head.substr(1) + R"("created":)" + std::to_string(now_unix()) +
             R"(,"id":"evt_poison_other","data":{"object":{"id":"ch_p3","object":"charge"}}})"},
    };
    for (const auto& [id, body] : poison) {
        BOOST_TEST_CONTEXT(id) {
            auto r = send(delivery(body, current_secret, now_unix()));
            BOOST_TEST(r.status == 400, r.body);
            r = send(delivery(body, current_secret, now_unix()));  // Stripe's retry
            BOOST_TEST(r.status == 200, r.body);
            BOOST_TEST(r.body.find("refused") != std::string::npos, r.body);
            BOOST_TEST(sql("SELECT deliveries || ' ' || encode(body, 'hex') FROM stripe_webhook_refusals "
                           "WHERE event_id = '" +
                           id + "' AND reason LIKE 'unstorable: %'") == "2 " + to_hex(body));
        }
    }
    BOOST_TEST(sql("SELECT reason FROM stripe_webhook_refusals WHERE event_id = 'evt_poison_dup'") ==
               "unstorable: the key \"id\" twice in $");
    BOOST_TEST(sql("SELECT reason FROM stripe_webhook_refusals WHERE event_id = 'evt_poison_time'")
                   .find("outside the years 1970 to 9999") != std::string::npos);
    BOOST_TEST(count_rows() == 0);
    BOOST_TEST(outcome("poison") == 3);
    BOOST_TEST(outcome("duplicate") == 3);
    BOOST_TEST(outcome("error") == 0);
}

// The receiver reads one API version: an event rendered in another (or naming none) is refused, every
// delivery, with the version to create the endpoint with; nothing of it reaches the ledger.
BOOST_AUTO_TEST_CASE(an_event_in_another_api_version_is_refused) {
    const std::string key = "b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3";
    seed_processing(key, "c-version-1", "pi_version_1");
    auto old = intent_event("evt_v_old", "payment_intent.payment_failed", "pi_version_1",
                            "requires_payment_method", key);
    const std::string current = R"("api_version":"2024-06-20")";
    old.replace(old.find(current), current.size(), R"("api_version":"2022-08-01")");
    auto r = send(delivery(old, current_secret, now_unix()));
    BOOST_TEST(r.status == 400, r.body);
    BOOST_TEST(send(delivery(old, current_secret, now_unix())).status == 400);  // every delivery
    auto none = intent_event("evt_v_none", "payment_intent.payment_failed", "pi_version_1",
                             "requires_payment_method", key);
    none.replace(none.find(current + ","), current.size() + 1, "");
    BOOST_TEST(send(delivery(none, current_secret, now_unix())).status == 400);
    BOOST_TEST(sql("SELECT deliveries || ' ' || reason FROM stripe_webhook_refusals WHERE event_id = "
                   "'evt_v_old'") ==
               "2 api_version 2022-08-01, the receiver reads 2024-06-20: create the endpoint with "
               "api_version 2024-06-20");
    BOOST_TEST(sql("SELECT api_version IS NULL FROM stripe_webhook_refusals WHERE event_id = 'evt_v_none'") ==
               "t");
    BOOST_TEST(sql("SELECT status FROM billing_records WHERE key = '" + key + "'") == "processing");
    BOOST_TEST(count_rows() == 0);
    BOOST_TEST(outcome("wrong_api_version") == 3);
}

BOOST_AUTO_TEST_SUITE_END()
