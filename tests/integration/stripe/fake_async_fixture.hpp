// The fixture of the fake_async suite (fake_async_test.cpp, fake_webhook_delivery_test.cpp,
// fake_requests_test.cpp): fake-stripe driven through stripe::client over TLS, with a webhook endpoint
// (http::server) on the test's io_context that records every signed delivery. Every wait is on an event
// (webhook_sender::wait), never a sleep.
#pragma once

#include <simdjson.h>

#include <boost/test/unit_test.hpp>
#include <deque>

#include "http/proto/message.hpp"
#include "http/router.hpp"
#include "http/server.hpp"
#include "stripe/types.hpp"
#include "stripe/webhook_signature.hpp"
#include "support/run_async.hpp"
#include "tests/integration/stripe/fake_fixture.hpp"

using namespace std::chrono_literals;
using namespace cg;
using cg::test::run_async;

namespace {

const std::string secret = "whsec_fake_async_current";
const std::string previous = "whsec_fake_async_previous";

// A webhook endpoint that records every delivery and answers the queued statuses (then 200).
struct endpoint {
    struct hit {
        std::string signature, body, content_type, user_agent, event_id, type;
    };
    std::unique_ptr<http::server> server;
    std::vector<hit> hits;
    std::deque<int> answers;
    std::uint16_t port = 0;

    explicit endpoint(asio::io_context& io) {
        http::router r;
        r.add("POST", "/hooks", [this](http::request& q) -> asio::awaitable<http::response> {
            hit h;
            h.signature = std::string(q.headers.get("Stripe-Signature").value_or(""));
            h.content_type = std::string(q.headers.get("Content-Type").value_or(""));
            h.user_agent = std::string(q.headers.get("User-Agent").value_or(""));
            h.body = q.body;
            simdjson::dom::parser p;
            auto doc = p.parse(h.body);
            std::string_view id, type;
            if (!doc.error() && !doc["id"].get(id) && !doc["type"].get(type)) {
                h.event_id = std::string(id);
                h.type = std::string(type);
            }
            hits.push_back(std::move(h));
            int status = 200;
            if (!answers.empty()) {
                status = answers.front();
                answers.pop_front();
            }
            co_return http::make_response(status, "");
        });
        server =
            std::make_unique<http::server>(io.get_executor(), std::move(r), http::server_options{}, logger());
        auto ep = server->listen({"127.0.0.1", 0});
        BOOST_TEST_REQUIRE(ep.has_value());
        port = ep->port();
        server->start();
    }
    ~endpoint() { server->stop(); }

    std::string url() const { return "http://127.0.0.1:" + std::to_string(port) + "/hooks"; }
    std::vector<std::string> types() const {
        std::vector<std::string> t;
        for (const auto& h : hits) t.push_back(h.type);
        return t;
    }
};

struct async_fixture : test::fake_stripe_fixture {
    endpoint hook{io};
    async_fixture() {
        fake::webhook_endpoint e;
        e.url = hook.url();
        e.secrets = {secret};
        e.retry_base_ms = 5;
        e.retry_max_ms = 20;
        e.max_attempts = 4;
        e.timeout_ms = 2000;
        fake->webhooks().configure(e);
        fake->settle_after(30ms);
    }
    void only(std::vector<std::string> types) {
        auto e = fake->webhooks().endpoint();
        e.enabled_events = std::move(types);
        fake->webhooks().configure(e);
    }
    // Awaits: nothing outstanding, no settlement pending.
    asio::awaitable<bool> settled() {
        co_return co_await fake->webhooks().wait(
            [this] { return fake->webhooks().idle() && fake->pending_settlements() == 0; }, 10s);
    }
};

inline stripe::payment_intent_request pi_req(std::string key, std::string pm, std::int64_t amount = 4200) {
    stripe::payment_intent_request r;
    r.amount = amount;
    r.currency = "usd";
    r.customer = "cus_bank";
    r.payment_method = std::move(pm);
    r.metadata = {{"billing_key", key}};
    r.idempotency_key = std::move(key);
    return r;
}

inline bool signed_by(const endpoint::hit& h, const std::string& s) {
    std::vector<std::string> secrets{s};
    auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    return stripe::verify_signature(h.signature, h.body, secrets, now).ok();
}

inline std::string field(const std::string& json, std::string_view key) {
    simdjson::dom::parser p;
    auto doc = p.parse(json);
    std::string_view v;
    if (doc.error() || doc[key].get(v)) return {};
    return std::string(v);
}

}  // namespace
