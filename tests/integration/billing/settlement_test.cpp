// Payments that settle later, end to end on real PostgreSQL: the pipeline leaves a PaymentIntent answered
// `processing` as a processing row (never charged) and finishes the message; Stripe's events, recorded and
// applied by billing::settlement_store exactly as the webhook receiver does, move it to charged or to
// failed_after_processing with one dead letter, in every order and with duplicates; the replay charges
// again under a new key generation; the poll settles a row whose webhook never came.
//
// Stripe here is a small in-test double over plain HTTP (fake-stripe has no asynchronous payment methods):
// POST /v1/payment_intents answers with the status the test sets (idempotent on Idempotency-Key), GET
// /v1/payment_intents/{id} returns the intent as the test moved it, the lists answer empty.
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <map>

#include "billing/heal/settlement_poller.hpp"
#include "billing/store/settlement_store.hpp"
#include "fixture.hpp"
#include "http/server.hpp"
#include "metrics/registry.hpp"
#include "stripe/webhook_event.hpp"
#include "support/prom_text.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::delivery_of;
using cg::test::key_of;
using cg::test::reason;

namespace {

struct async_intent {
    std::string id, status, latest_charge, billing_key, customer, idempotency_key, failure;
    std::int64_t amount = 0;
};

// The in-test Stripe (see the top of the file). Runs on the test's io_context.
class async_stripe {
  public:
    explicit async_stripe(asio::any_io_executor ex) {
        http::router r;
        r.add("POST", "/v1/payment_intents", [this](http::request& q) { return create(q); });
        r.add_prefix("GET", "/v1/payment_intents", [this](http::request& q) { return get_intent(q); });
        r.add_prefix("GET", "/v1/charges", [this](http::request& q) { return list_charges(q); });
        server_ = std::make_unique<http::server>(ex, std::move(r), http::server_options{}, logger());
        auto ep = server_->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        port = ep->port();
        server_->start();
    }
    ~async_stripe() { server_->stop(); }

    std::string next_status = "processing";
    bool fail_next_create = false;  // answer the next create 500 without creating anything
    std::vector<async_intent> intents;
    int retrieves = 0;
    std::uint16_t port = 0;

    async_intent* find(const std::string& id) {
        for (auto& i : intents)
            if (i.id == id) return &i;
        return nullptr;
    }

    static std::string json(const async_intent& i) {
        std::string err = i.failure.empty() ? "null" : R"({"code":")" + i.failure + R"("})";
        return R"({"id":")" + i.id + R"(","object":"payment_intent","amount":)" + std::to_string(i.amount) +
               R"(,"currency":"usd","customer":")" + i.customer + R"(","status":")" + i.status +
               R"(","latest_charge":")" + i.latest_charge +
               R"(","created":1700000000,"last_payment_error":)" + err + R"(,"metadata":{"billing_key":")" +
               i.billing_key + R"("}})";
    }

  private:
    asio::awaitable<http::response> create(http::request& q) {
        std::string idem(q.headers.get("Idempotency-Key").value_or(""));
        for (const auto& i : intents)
            if (i.idempotency_key == idem) co_return http::make_response(200, json(i), "application/json");
        if (fail_next_create) {
            fail_next_create = false;
            co_return http::make_response(500, R"({"error":{"type":"api_error","message":"try later"}})",
                                          "application/json");
        }
        std::map<std::string, std::string> form;
        std::string_view b = q.body;
        while (!b.empty()) {
            auto amp = b.find('&');
            auto part = b.substr(0, amp);
            b = amp == std::string_view::npos ? std::string_view() : b.substr(amp + 1);
            auto eq = part.find('=');
            auto k = http::url_decode(part.substr(0, eq));
            auto v = http::url_decode(eq == std::string_view::npos ? "" : part.substr(eq + 1));
            if (k && v) form[*k] = *v;
        }
        async_intent i;
        i.id = "pi_" + std::to_string(intents.size() + 1);
        i.latest_charge = "ch_" + std::to_string(intents.size() + 1);
        i.status = next_status;
        i.amount = std::stoll(form["amount"]);
        i.customer = form["customer"];
        i.billing_key = form["metadata[billing_key]"];
        i.idempotency_key = idem;
        intents.push_back(i);
        co_return http::make_response(200, json(i), "application/json");
    }

    asio::awaitable<http::response> get_intent(http::request& q) {
        auto path = std::string(q.path());
        if (path == "/v1/payment_intents") {
            // The customer's intents, newest first (the test has one customer per intent's key).
            std::string data;
            for (auto it = intents.rbegin(); it != intents.rend(); ++it)
                data += (data.empty() ? "" : ",") + json(*it);
            co_return http::make_response(
                200, R"({"object":"list","data":[)" + data + R"(],"has_more":false})", "application/json");
        }
        ++retrieves;
        auto* i = find(path.substr(path.rfind('/') + 1));
        if (!i)
            co_return http::make_response(
                404,
                R"({"error":{"type":"invalid_request_error","message":"No such payment_intent","param":"id"}})",
                "application/json");
        co_return http::make_response(200, json(*i), "application/json");
    }

    asio::awaitable<http::response> list_charges(http::request&) {
        co_return http::make_response(200, R"({"object":"list","data":[],"has_more":false})",
                                      "application/json");
    }

    std::unique_ptr<http::server> server_;
};

std::string intent_event_body(const std::string& customer) {
    return R"({"customer_id":")" + customer +
           R"(","billing_period":"2026-12","amount_cents":1999,"currency":"usd","stripe_customer_id":"cus_ok",)"
           R"("payment_method":"pm_usBankAccount"})";
}

struct settle_fixture : test::billing_fixture {
    async_stripe bank{io.get_executor()};
    std::unique_ptr<stripe::client> async_client;
    billing::settlement_store store{pg};
    metrics::registry settle_reg;
    int event_seq = 0;

    settle_fixture() {
        auto c = config();
        c.api_base = "http://127.0.0.1:" + std::to_string(bank.port);
        async_client = client(c);
    }

    std::unique_ptr<billing::charge_flow> async_pipeline() {
        return std::make_unique<billing::charge_flow>(config_for_pipeline(), *ledger, *async_client, logger(),
                                                      &settle_reg);
    }

    // A Stripe event as Stripe sends it: `type` about the PaymentIntent / charge / dispute of `pi`.
    std::string event(const std::string& type, const async_intent& pi, std::string status,
                      std::int64_t amount_refunded = 0, std::int64_t created = 1700000000) {
        std::string id = "evt_" + std::to_string(++event_seq);
        std::string obj;
        if (type.starts_with("payment_intent.")) {
            async_intent moved = pi;
            moved.status = std::move(status);
            if (moved.status == "requires_payment_method") moved.failure = "insufficient_funds";
            obj = async_stripe::json(moved);
        } else if (type.starts_with("charge.dispute.")) {
            obj = R"({"id":"dp_)" + pi.id + R"(","object":"dispute","amount":)" + std::to_string(pi.amount) +
                  R"(,"charge":")" + pi.latest_charge + R"(","payment_intent":")" + pi.id +
                  R"(","status":")" + status + R"("})";
        } else {
            obj = R"({"id":")" + pi.latest_charge + R"(","object":"charge","amount":)" +
                  std::to_string(pi.amount) + R"(,"status":")" + status + R"(","payment_intent":")" + pi.id +
                  R"(","amount_refunded":)" + std::to_string(amount_refunded) +
                  R"(,"metadata":{"billing_key":")" + pi.billing_key + R"("}})";
        }
        return R"({"id":")" + id + R"(","object":"event","type":")" + type + R"(","created":)" +
               std::to_string(created) + R"(,"livemode":false,"data":{"object":)" + obj + "}}";
    }

    billing::event_record_result deliver(const std::string& body) {
        auto env = stripe::parse_webhook_event(body);
        BOOST_TEST_REQUIRE(env.has_value(), (env ? "" : env.err().message));
        auto r = run(store.record_event(*env, body));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        return *r;
    }

    // A row left processing by the pipeline for `customer`, and its intent at the bank.
    async_intent processing_row(const std::string& customer, billing::charge_flow& p) {
        bank.next_status = "processing";
        auto v = handle(p, delivery_of(intent_event_body(customer), "m-" + customer));
        BOOST_TEST_REQUIRE(reason(v) == "processing", v.detail);
        BOOST_TEST_REQUIRE(v.finished());
        return bank.intents.back();
    }

    std::string status_of(const std::string& key) {
        auto r = run(query("SELECT status FROM billing_records WHERE key = $1", pg::params(key)));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        return (*r)[0].get<std::string>(0);
    }

    std::int64_t letters_for(const std::string& key) {
        return scalar(
            "SELECT count(*) FROM dead_letters WHERE billing_key = $1 "
            "AND reason LIKE 'failed after processing%'",
            key);
    }

    double counter(const std::string& name) {
        auto fams = test::parse_prometheus(settle_reg.render());
        auto it = fams.find(name);
        if (it == fams.end() || it->second.samples.empty()) return 0;
        return it->second.samples[0].value;
    }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_settlement)

// The pipeline: a PaymentIntent answered processing is a processing row, not charged; the message is
// finished; the row names the intent and keeps the delivery for a later dead letter. A redelivery is a
// prevented duplicate (no second intent).
BOOST_AUTO_TEST_CASE(processing_answer_is_not_charged) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("proc-1", *p);
    auto key = key_of("proc-1", "2026-12");
    BOOST_TEST(f.status_of(key) == "processing");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND payment_intent_id = $2 AND "
                        "stripe_status = 'processing' AND processing_since IS NOT NULL AND "
                        "convert_from(raw_body, 'UTF8') = $3 AND nsq_topic = 'billing'",
                        key, pi.id, intent_event_body("proc-1")) == 1);
    auto again = f.handle(*p, delivery_of(intent_event_body("proc-1"), "m-proc-1", 2));
    BOOST_TEST(reason(again) == "duplicate_prevented");
    BOOST_TEST(f.bank.intents.size() == 1u);
}

// requires_capture: an authorisation chargeguard never asks for. Not charged: processing, counted, alerted.
BOOST_AUTO_TEST_CASE(requires_capture_is_an_anomaly_not_a_charge) {
    settle_fixture f;
    auto p = f.async_pipeline();
    f.bank.next_status = "requires_capture";
    auto v = f.handle(*p, delivery_of(intent_event_body("cap-1"), "m-cap-1"));
    BOOST_TEST(reason(v) == "processing", v.detail);
    BOOST_TEST(f.status_of(key_of("cap-1", "2026-12")) == "processing");
    BOOST_TEST(f.counter("chargeguard_billing_requires_capture_total") == 1);
}

// Every order of processing and payment_failed, each delivered twice: failed_after_processing with exactly
// one dead letter carrying the original body; and succeeded in any order with processing ends charged.
BOOST_AUTO_TEST_CASE(every_order_of_processing_and_the_outcome) {
    settle_fixture f;
    auto p = f.async_pipeline();
    int n = 0;
    for (const char* outcome :
         {"payment_intent.payment_failed", "payment_intent.succeeded", "charge.failed", "charge.succeeded"}) {
        for (bool outcome_first : {true, false}) {
            std::string customer = "order-" + std::to_string(++n);
            auto pi = f.processing_row(customer, *p);
            auto key = key_of(customer, "2026-12");
            bool fails = std::string(outcome).ends_with("failed");
            std::string st = std::string(outcome).starts_with("charge.")
                                 ? (fails ? "failed" : "succeeded")
                                 : (fails ? "requires_payment_method" : "succeeded");
            auto proc = f.event("payment_intent.processing", pi, "processing", 0, 1700000000);
            auto end = f.event(outcome, pi, st, 0, 1700000100);
            std::vector<std::string> order =
                outcome_first ? std::vector{end, proc, end, proc} : std::vector{proc, end, proc, end};
            int duplicates = 0;
            for (const auto& e : order) duplicates += f.deliver(e).duplicate;
            BOOST_TEST(duplicates == 2);
            BOOST_TEST_CONTEXT(outcome << (outcome_first ? " first" : " last")) {
                BOOST_TEST(f.status_of(key) == (fails ? "failed_after_processing" : "charged"));
                BOOST_TEST(f.letters_for(key) == (fails ? 1 : 0));
                if (fails)
                    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE billing_key = $1 AND "
                                        "convert_from(raw_body, 'UTF8') = $2 AND topic = 'billing'",
                                        key, intent_event_body(customer)) == 1);
                else
                    BOOST_TEST(
                        f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND charge_id = $2",
                                 key, pi.latest_charge) == 1);
            }
        }
    }
}

// Refunds and disputes in every order of a succeeded payment's events: charged, with the full refund and
// the lost dispute, whatever came first; a succeeded replayed after the refund changes nothing.
BOOST_AUTO_TEST_CASE(refunds_and_disputes_in_every_order) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto seed = f.processing_row("refund-seed", *p);
    std::vector<int> idx{0, 1, 2, 3, 4};
    int n = 0;
    do {
        std::string customer = "refund-" + std::to_string(++n);
        auto pi = f.processing_row(customer, *p);
        auto key = key_of(customer, "2026-12");
        std::vector<std::string> events{
            f.event("payment_intent.succeeded", pi, "succeeded"),
            f.event("charge.refunded", pi, "succeeded", 500),
            f.event("charge.refunded", pi, "succeeded", 1999),
            f.event("charge.dispute.created", pi, "needs_response"),
            f.event("charge.dispute.closed", pi, "lost"),
        };
        for (int i : idx) f.deliver(events[static_cast<std::size_t>(i)]);
        f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));  // replayed after the refund
        BOOST_TEST_CONTEXT("order " << n) {
            BOOST_TEST(
                f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'charged' AND "
                         "refunded_cents = 1999 AND disputed_cents = 1999 AND dispute_status = 'lost' "
                         "AND charge_id = $2",
                         key, pi.latest_charge) == 1);
        }
    } while (std::next_permutation(idx.begin(), idx.end()) && n < 40);
    // The seed row saw none of these events: each applies to the row its ids name.
    BOOST_TEST(f.status_of(key_of("refund-seed", "2026-12")) == "processing");
    (void)seed;
}

// A refund object event (refund.created, refund.updated, charge.refund.updated) about refund
// `re` of `pi`'s charge.
std::string refund_event(settle_fixture& f, const std::string& type, const async_intent& pi,
                         const std::string& re, std::int64_t amount, const std::string& status,
                         std::int64_t created = 1700000100) {
    std::string obj = R"({"id":")" + re + R"(","object":"refund","amount":)" + std::to_string(amount) +
                      R"(,"charge":")" + pi.latest_charge + R"(","payment_intent":")" + pi.id +
                      R"(","currency":"usd","status":")" + status + R"(","metadata":{}})";
    return R"({"id":"evt_r)" + std::to_string(++f.event_seq) + R"(","object":"event","type":")" + type +
           R"(","created":)" + std::to_string(created) + R"(,"livemode":false,"data":{"object":)" + obj +
           "}}";
}

std::int64_t refunded_of(settle_fixture& f, const std::string& key) {
    return f.scalar("SELECT refunded_cents FROM billing_records WHERE key = $1 AND status = 'charged'", key);
}

// One refund reported by its charge (charge.refunded, cumulative) and by itself (refund.created, then
// refund.updated succeeded), in every order, each delivered twice: it counts once. The same with the
// refund ending failed (refund.updated): in every order it gives its amount back, whatever came after.
BOOST_AUTO_TEST_CASE(one_refund_by_its_charge_and_by_its_id_counts_once_in_every_order) {
    settle_fixture f;
    auto p = f.async_pipeline();
    for (bool fails : {false, true}) {
        std::vector<int> idx{0, 1, 2};
        if (fails) idx.push_back(3);
        int n = 0;
        do {
            std::string customer = std::string(fails ? "rf-fail-" : "rf-ok-") + std::to_string(++n);
            auto pi = f.processing_row(customer, *p);
            auto key = key_of(customer, "2026-12");
            f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));
            const std::string re = "re_" + customer;
            std::vector<std::string> events{
                f.event("charge.refunded", pi, "succeeded", 600, 1700000050),
                refund_event(f, "refund.created", pi, re, 600, "pending", 1700000050),
                refund_event(f, "refund.updated", pi, re, 600, "succeeded", 1700000060),
                refund_event(f, "refund.updated", pi, re, 600, "failed", 1700000070),
            };
            for (int i : idx) {
                auto first = f.deliver(events[static_cast<std::size_t>(i)]);
                BOOST_TEST(!first.duplicate);
                BOOST_TEST(f.deliver(events[static_cast<std::size_t>(i)]).duplicate);
            }
            BOOST_TEST_CONTEXT((fails ? "failing" : "succeeding") << " order " << n) {
                BOOST_TEST(refunded_of(f, key) == (fails ? 0 : 600));
                BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_refunds WHERE id = $1 AND status = $2", re,
                                    std::string(fails ? "failed" : "succeeded")) == 1);
            }
        } while (std::next_permutation(idx.begin(), idx.end()));
    }
}

// Several refunds of one charge, their events interleaved and late: each counts once by its id; one that
// fails (refund.updated) or is canceled (charge.refund.updated) gives its amount back, and a late
// charge.refunded with the higher cumulative amount, or a late refund.created of the failed refund, does not
// bring it back. A refund.created arriving before its charge.refunded counts at once.
BOOST_AUTO_TEST_CASE(several_refunds_their_failures_and_late_events) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("rf-multi", *p);
    auto key = key_of("rf-multi", "2026-12");
    f.deliver(f.event("payment_intent.succeeded", pi, "succeeded"));
    BOOST_TEST(refunded_of(f, key) == 0);
    auto r = f.deliver(refund_event(f, "refund.created", pi, "re_a", 500, "succeeded", 1700000100));
    BOOST_TEST(r.outcome == "applied");
    BOOST_TEST(refunded_of(f, key) == 500);
    r = f.deliver(f.event("charge.refunded", pi, "succeeded", 500, 1700000100));  // the same refund
    BOOST_TEST(r.outcome == "no_change");
    BOOST_TEST(refunded_of(f, key) == 500);
    f.deliver(refund_event(f, "refund.created", pi, "re_b", 300, "pending", 1700000200));
    BOOST_TEST(refunded_of(f, key) == 800);
    f.deliver(f.event("charge.refunded", pi, "succeeded", 800, 1700000200));
    BOOST_TEST(refunded_of(f, key) == 800);
    // re_b fails: its 300 comes back.
    f.deliver(refund_event(f, "refund.updated", pi, "re_b", 300, "failed", 1700000300));
    BOOST_TEST(refunded_of(f, key) == 500);
    // Late: charge.refunded at 800 again (a new event), re_b's refund.updated pending, a refund.created.
    f.deliver(f.event("charge.refunded", pi, "succeeded", 800, 1700000210));
    f.deliver(refund_event(f, "refund.updated", pi, "re_b", 300, "pending", 1700000250));
    f.deliver(refund_event(f, "refund.created", pi, "re_b", 300, "pending", 1700000200));
    BOOST_TEST(refunded_of(f, key) == 500);
    // re_a canceled (charge.refund.updated): nothing is refunded any more.
    f.deliver(refund_event(f, "charge.refund.updated", pi, "re_a", 500, "canceled", 1700000400));
    BOOST_TEST(refunded_of(f, key) == 0);
    // A third refund known first only by its charge's newer cumulative amount (the two given back are not
    // in it): it counts at once, and its own event later does not count it again.
    f.deliver(f.event("charge.refunded", pi, "succeeded", 400, 1700000500));
    BOOST_TEST(refunded_of(f, key) == 400);
    f.deliver(refund_event(f, "refund.created", pi, "re_c", 400, "succeeded", 1700000500));
    BOOST_TEST(refunded_of(f, key) == 400);
    BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_refunds WHERE charge_id = $1", pi.latest_charge) == 3);
    BOOST_TEST(f.status_of(key) == "charged");
}

// The failure reaches the receiver before the create call's answer (the row still pending): recorded,
// deferred; the pipeline, leaving the row processing, applies it: failed_after_processing, one letter.
BOOST_AUTO_TEST_CASE(payment_failed_before_processing) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto body = intent_event_body("early-1");
    auto key = key_of("early-1", "2026-12");
    f.dead_workers_row(body, "m-early", 1ms);  // pending, its lease about to lapse
    async_intent future;                       // the intent the bank is about to create for it
    future.id = "pi_1";
    future.latest_charge = "ch_1";
    future.billing_key = key;
    future.amount = 1999;
    auto early = f.deliver(f.event("payment_intent.payment_failed", future, "requires_payment_method"));
    BOOST_TEST(early.outcome == "deferred");
    BOOST_TEST(f.status_of(key) == "pending");
    auto v = f.handle(*p, delivery_of(body, "m-early", 2));
    BOOST_TEST(reason(v) == "processing", v.detail);
    BOOST_TEST(f.status_of(key) == "failed_after_processing");
    BOOST_TEST(f.letters_for(key) == 1);
    BOOST_TEST(f.counter("chargeguard_billing_failed_after_processing_total") == 1);
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM stripe_webhook_events WHERE outcome = 'applied' AND applied_to = $1",
                 key) == 1);
}

// Failed after processing → dead letter → replay: the row reopens under a new key generation and the
// redelivered message charges once (a new PaymentIntent under key-g2); the old intent's late events name
// another payment and change nothing.
BOOST_AUTO_TEST_CASE(replay_after_a_late_failure_charges_under_a_new_generation) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("replay-1", *p);
    auto key = key_of("replay-1", "2026-12");
    f.deliver(f.event("payment_intent.payment_failed", pi, "requires_payment_method"));
    BOOST_TEST_REQUIRE(f.status_of(key) == "failed_after_processing");
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(reopened.has_value());
    BOOST_TEST_REQUIRE(reopened->has_value());
    BOOST_TEST(billing::to_string(**reopened) == "failed_after_processing");
    BOOST_TEST(f.status_of(key) == "pending");
    // The letter's body, as `dead-letters replay` publishes it.
    auto letter = f.run(f.query(
        "SELECT convert_from(raw_body, 'UTF8') FROM dead_letters WHERE billing_key = $1", pg::params(key)));
    BOOST_TEST_REQUIRE(letter.has_value());
    f.bank.next_status = "succeeded";
    auto v = f.handle(*p, delivery_of((*letter)[0].get<std::string>(0), "m-replay-2"));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST_REQUIRE(f.bank.intents.size() == 2u);
    BOOST_TEST(f.bank.intents[1].idempotency_key == key + "-g2");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'charged' AND "
                        "payment_intent_id = 'pi_2' AND key_generation = 2",
                        key) == 1);
    // The first intent's events, late: another payment than the row's.
    auto late = f.deliver(f.event("payment_intent.processing", pi, "processing"));
    BOOST_TEST(late.outcome == "other_payment");
    BOOST_TEST(f.status_of(key) == "charged");
    // A second replay of the same letter finds the row charged: nothing reopened.
    auto again = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(!again->has_value());
}

// After a replay, the failed payment it superseded still carries the key. A replayed charge whose answer is
// lost (500) is searched for: the old failed PaymentIntent is not this generation's decline — the row goes on
// to a new generation and is charged once, never left declined (the customer would pay nothing).
BOOST_AUTO_TEST_CASE(the_search_after_a_replay_ignores_the_superseded_failure) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto pi = f.processing_row("super-1", *p);
    auto key = key_of("super-1", "2026-12");
    f.deliver(f.event("payment_intent.payment_failed", pi, "requires_payment_method"));
    f.bank.find(pi.id)->status = "requires_payment_method";
    BOOST_TEST_REQUIRE(f.status_of(key) == "failed_after_processing");
    auto reopened = f.run(f.ledger->reopen_for_replay(key, "replay test"));
    BOOST_TEST_REQUIRE(reopened.has_value());
    f.bank.fail_next_create = true;
    auto lost = f.handle(*p, delivery_of(intent_event_body("super-1"), "m-super-2"));
    BOOST_TEST(reason(lost) == "requeued_indeterminate", lost.detail);
    f.bank.next_status = "succeeded";
    auto v = f.handle(*p, delivery_of(intent_event_body("super-1"), "m-super-2", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.status_of(key) == "charged");
    BOOST_TEST_REQUIRE(f.bank.intents.size() == 2u);
    BOOST_TEST(f.bank.intents[1].idempotency_key == key + "-g3");
    BOOST_TEST(f.bank.intents[1].status == "succeeded");
}

// Events for objects no row names, and types not acted on: recorded once, counted, nothing changed.
BOOST_AUTO_TEST_CASE(unknown_objects_and_types_are_recorded_and_ignored) {
    settle_fixture f;
    async_intent stranger;
    stranger.id = "pi_stranger";
    stranger.latest_charge = "ch_stranger";
    stranger.billing_key = "0123456789abcdef0123456789abcdef";
    auto body = f.event("payment_intent.succeeded", stranger, "succeeded");
    BOOST_TEST(f.deliver(body).outcome == "unknown_object");
    BOOST_TEST(f.deliver(body).duplicate);
    auto other = R"({"id":"evt_other","object":"event","type":"customer.created","created":1,)"
                 R"("livemode":false,"data":{"object":{"id":"cus_1","object":"customer"}}})";
    BOOST_TEST(f.deliver(other).outcome == "unknown_type");
    BOOST_TEST(f.scalar("SELECT count(*) FROM stripe_webhook_events") == 2);
}

// No webhook: the poll retrieves rows processing past the bound by id and applies the same step — a
// succeeded intent is charged, a failed one is failed_after_processing with its letter; rows not due yet
// are left alone; the bounded rate holds.
BOOST_AUTO_TEST_CASE(poll_settles_rows_whose_webhook_never_came) {
    settle_fixture f;
    auto p = f.async_pipeline();
    auto ok = f.processing_row("poll-ok", *p);
    auto bad = f.processing_row("poll-bad", *p);
    auto fresh = f.processing_row("poll-fresh", *p);
    f.bank.find(ok.id)->status = "succeeded";
    f.bank.find(bad.id)->status = "requires_payment_method";
    f.bank.find(bad.id)->failure = "insufficient_funds";
    f.bank.find(fresh.id)->status = "succeeded";
    // Two rows processing for an hour; the third just now.
    auto aged = f.run(
        f.query("UPDATE billing_records SET processing_since = now() - interval '2 hours' "
                "WHERE key = ANY($1::text[])",
                pg::params("{" + key_of("poll-ok", "2026-12") + "," + key_of("poll-bad", "2026-12") + "}")));
    BOOST_TEST_REQUIRE(aged.has_value());
    billing::poller_config pc;
    pc.poll_after = 1h;
    pc.rate_per_second = 50;
    billing::settlement_poller poller(pc, f.pg, *f.async_client, logger(), &f.settle_reg);
    auto swept = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(swept.has_value(), (swept ? "" : swept.err().describe()));
    BOOST_TEST(swept->retrieved == 2u);
    BOOST_TEST(f.bank.retrieves == 2);
    BOOST_TEST(f.status_of(key_of("poll-ok", "2026-12")) == "charged");
    BOOST_TEST(f.status_of(key_of("poll-bad", "2026-12")) == "failed_after_processing");
    BOOST_TEST(f.letters_for(key_of("poll-bad", "2026-12")) == 1);
    BOOST_TEST(f.status_of(key_of("poll-fresh", "2026-12")) == "processing");
    BOOST_TEST(f.counter("chargeguard_billing_failed_after_processing_total") == 1);
    BOOST_TEST(f.counter("chargeguard_billing_processing_records") == 1);  // poll-fresh
    BOOST_TEST(f.counter("chargeguard_billing_oldest_processing_age_seconds") < 3600);
    // Polled rows are not due again until the bound passes once more.
    auto again = f.run(poller.poll_once());
    BOOST_TEST_REQUIRE(again.has_value());
    BOOST_TEST(again->retrieved == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
