// Helpers for the tests of payments that settle later: Stripe as a small in-test double over plain HTTP
// (fake-stripe has no asynchronous payment methods): POST /v1/payment_intents answers with the status the
// test sets (idempotent on Idempotency-Key), GET /v1/payment_intents/{id} returns the intent as the test
// moved it, the lists answer empty. And a fixture whose pipeline charges through it, delivering Stripe's
// events as the webhook receiver records them.
#pragma once

#include <boost/test/unit_test.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "billing/store/settlement_store.hpp"
#include "fixture.hpp"
#include "http/server.hpp"
#include "metrics/registry.hpp"
#include "stripe/webhook_event.hpp"
#include "support/prom_text.hpp"

namespace cg::test::settle_support {

struct async_intent {
    std::string id, status, latest_charge, billing_key, customer, idempotency_key, failure;
    std::int64_t amount = 0;
};

// The in-test Stripe (see the top of this file). Runs on the test's io_context.
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

inline std::string intent_event_body(const std::string& customer) {
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

}  // namespace cg::test::settle_support
