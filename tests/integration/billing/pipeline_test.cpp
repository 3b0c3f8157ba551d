// The billing state machine (docs/design.md §4) end to end: real PostgreSQL (scratch database, migrations
// applied), fake-stripe over TLS, the real stripe::client. Each test names the failure it would catch. g++ 12
// -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <boost/test/unit_test.hpp>

#include "billing/machine/outcome.hpp"
#include "fixture.hpp"
#include "stripe/types.hpp"
#include "support/prom_text.hpp"

using namespace std::chrono_literals;
using namespace cg;
using billing::verdict_reason;
using cg::test::delivery_of;
using cg::test::event_json;
using cg::test::first_sample;
using cg::test::key_of;
using cg::test::reason;
using cg::test::run_async;
using cg::test::watch_pending_age;

namespace {

using fixture = test::billing_fixture;

double metric(metrics::registry& reg, const std::string& family, const std::string& outcome) {
    auto fams = test::parse_prometheus(reg.render());
    auto it = fams.find(family);
    if (it == fams.end()) return -1;
    for (auto& s : it->second.samples)
        if (s.labels.count("outcome") && s.labels.at("outcome") == outcome) return s.value;
    return -1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(billing_pipeline)

// One event → one charge with the metadata and key §4 prescribes, row charged with that id, FIN, counted.
BOOST_AUTO_TEST_CASE(happy_path_charges_once_with_key_and_metadata) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline(f.config_for_pipeline(), &reg);
    auto key = key_of("acme-1", "2026-11");
    auto v = f.handle(*p, delivery_of(event_json("acme-1", "2026-11", 1999), "0a0000000000000000000001"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "charged", v.detail);

    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);
    const auto& ch = f.fake->charges()[0];
    BOOST_TEST(ch.amount == 1999);
    BOOST_TEST(ch.currency == "usd");
    BOOST_TEST(ch.customer == "cus_ok");
    stripe::metadata md(ch.metadata.begin(), ch.metadata.end());
    BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == key);
    BOOST_TEST(stripe::metadata_value(md, "customer_id").value_or("") == "acme-1");
    BOOST_TEST(stripe::metadata_value(md, "billing_period").value_or("") == "2026-11");
    BOOST_TEST(f.fake->posts_for(key) == 1);  // Idempotency-Key is the base key (generation 1)
    BOOST_TEST(v.detail == ch.id);

    auto rec = f.row(key);
    BOOST_TEST_REQUIRE(rec.has_value());
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(rec->charge_id.value_or("") == ch.id);
    BOOST_TEST(rec->stripe_attempts == 1);
    BOOST_TEST(rec->key_generation == 1);
    BOOST_TEST(rec->first_stripe_attempt_at.has_value());
    BOOST_TEST(!rec->lease_until.has_value());
    BOOST_TEST(metric(reg, "chargeguard_billing_messages_total", "charged") == 1.0);
    BOOST_TEST(metric(reg, "chargeguard_billing_messages_total", "dead_lettered") == 0.0);
    auto fams = test::parse_prometheus(reg.render());
    BOOST_TEST(fams.count("chargeguard_billing_stripe_call_duration_seconds") == 1u);
}

// Redeliveries (attempts 2, 3, another message id) never POST again: the ledger says charged.
BOOST_AUTO_TEST_CASE(redelivery_is_a_prevented_duplicate) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline(f.config_for_pipeline(), &reg);
    auto body = event_json("acme-2", "2026-11", 500);
    auto key = key_of("acme-2", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "0b01", 1))) == "charged");
    auto v2 = f.handle(*p, delivery_of(body, "0b01", 2));
    auto v3 = f.handle(*p, delivery_of(body, "0b02", 3));
    BOOST_TEST(v2.finished());
    BOOST_TEST(reason(v2) == "duplicate_prevented");
    BOOST_TEST(reason(v3) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(metric(reg, "chargeguard_billing_messages_total", "duplicate_prevented") == 2.0);
}

// Whether the last deliveries called Stripe (consume holds its pipelines to max_handlers while they do): no
// before any, yes after a run of charges, no again once duplicates, which never call it, follow.
BOOST_AUTO_TEST_CASE(deliveries_call_stripe_follows_the_last_deliveries) {
    fixture f;
    auto p = f.make_pipeline(f.config_for_pipeline());
    BOOST_TEST(!p->deliveries_call_stripe());
    std::vector<std::string> bodies;
    for (int i = 0; i < 6; ++i) {
        bodies.push_back(event_json("acme-share-" + std::to_string(i), "2026-11", 100 + i));
        auto id = "0c0" + std::to_string(i);
        BOOST_TEST(reason(f.handle(*p, delivery_of(bodies.back(), id))) == "charged");
        BOOST_TEST(p->deliveries_call_stripe() == (i == 5), i);  // 1 − (7/8)^6 ≥ 0.5 after the sixth
    }
    BOOST_TEST(reason(f.handle(*p, delivery_of(bodies[0], "0c10", 2))) == "duplicate_prevented");
    BOOST_TEST(!p->deliveries_call_stripe());
    BOOST_TEST(f.fake->charges().size() == 6u);
}

// Every line of a delivery carries its context: the message id and attempts, then once the event is parsed
// its billing key, customer and period — whether a line was written before the event was known (debug: the
// context is rendered for "billing delivery received", then extended) or none was (info: rendered for the
// finish line only). At warn a charge and a duplicate write no line at all.
BOOST_AUTO_TEST_CASE(delivery_lines_carry_the_delivery_and_event_context) {
    fixture f;
    auto body = event_json("acme-log", "2026-11", 700);
    auto key = key_of("acme-log", "2026-11");
    auto context = [&](std::string_view id, int attempts) {
        return "\"message_id\":\"" + std::string(id) + "\",\"attempts\":" + std::to_string(attempts) +
               ",\"billing_key\":\"" + key + "\",\"customer_id\":\"acme-log\",\"period\":\"2026-11\"";
    };
    auto line_with = [](const memory_sink& sink, std::string_view msg) {
        for (const auto& l : sink.lines())
            if (l.find("\"msg\":\"" + std::string(msg) + "\"") != std::string::npos) return l;
        return std::string();
    };
    struct step {
        log_level level;
        const char* id;
        const char* outcome;
    };
    const step steps[] = {{log_level::debug, "0e01", "charged"},
                          {log_level::debug, "0e02", "duplicate_prevented"},
                          {log_level::info, "0e03", "duplicate_prevented"}};
    for (const auto& s : steps) {
        auto sink = std::make_shared<memory_sink>();
        billing::charge_flow p(f.config_for_pipeline(), *f.ledger, *f.stripe, logger(sink, s.level));
        auto v = f.handle(p, delivery_of(body, s.id, 2));
        BOOST_TEST(reason(v) == s.outcome);
        auto finished = line_with(*sink, "billing message finished");
        BOOST_TEST(finished.find(context(s.id, 2) + ",\"reason\":\"" + s.outcome + "\"") != std::string::npos,
                   finished);
        if (s.level == log_level::debug) {
            auto received = line_with(*sink, "billing delivery received");
            BOOST_TEST(received.find("\"message_id\":\"" + std::string(s.id) + "\",\"attempts\":2}") !=
                           std::string::npos,
                       received);
        }
    }
    auto quiet = std::make_shared<memory_sink>();
    billing::charge_flow p(f.config_for_pipeline(), *f.ledger, *f.stripe, logger(quiet, log_level::warn));
    BOOST_TEST(reason(f.handle(p, delivery_of(body, "0e04"))) == "duplicate_prevented");
    BOOST_TEST(reason(f.handle(p, delivery_of(event_json("acme-log2", "2026-11", 700), "0e05"))) ==
               "charged");
    BOOST_TEST(quiet->lines().empty());
}

// Invalid payloads: dead letter with parse_event's reason and the raw body, FIN, no ledger row; a redelivery
// of the same message does not add a second letter.
BOOST_AUTO_TEST_CASE(invalid_event_is_dead_lettered_once) {
    fixture f;
    auto p = f.make_pipeline();
    auto v = f.handle(*p, delivery_of("not json {", "0d01"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail.find("not a JSON object") != std::string::npos, v.detail);
    auto again = f.handle(*p, delivery_of("not json {", "0d01", 2));
    BOOST_TEST(reason(again) == "dead_lettered");
    BOOST_TEST(f.dead_letters("0d01") == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '0d01' AND "
                        "raw_body = convert_to('not json {', 'UTF8') AND billing_key IS NULL") == 1);

    auto bad = R"({"customer_id":"acme-4","billing_period":"2026-11","amount_cents":19.99,"currency":"usd",)"
               R"("stripe_customer_id":"cus_ok"})";
    auto vb = f.handle(*p, delivery_of(bad, "0d02"));
    BOOST_TEST(reason(vb) == "dead_lettered");
    BOOST_TEST(vb.detail.find("amount_cents") != std::string::npos, vb.detail);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '0d02' AND reason LIKE "
                        "'%amount_cents%'") == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records") == 0);
    BOOST_TEST(f.fake->requests() == 0u);
}

// A worker charged at Stripe, then died before recording it (row pending, attempt recorded, lease expired).
// The redelivery recovers under the same key: Stripe replays the original charge; one charge, row charged
// with the original id.
BOOST_AUTO_TEST_CASE(crash_after_stripe_charged_recovers_with_the_same_key) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-5", "2026-11", 4200);
    auto key = key_of("acme-5", "2026-11");
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    // The dead worker's steps: pre-flight (which records the first attempt), Stripe charged; its lease lapses
    // (0 ms here).
    auto dead = f.dead_workers_row(body, "0e01", 0ms);
    BOOST_TEST(dead.stripe_attempts == 1);
    auto out = f.run(f.stripe->create_charge(billing::build_charge_request(*ev, key, 1)));
    BOOST_TEST_REQUIRE((out.cls == stripe::outcome_class::succeeded));
    auto first_charge = out.charge_id;
    auto v = f.handle(*p, delivery_of(body, "0e01", 2));
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(v.detail == first_charge);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 2);  // the same key again: replayed, not a new charge
    auto rec = f.row(key);
    BOOST_TEST(rec->charge_id.value_or("") == first_charge);
    BOOST_TEST(rec->stripe_attempts == 2);
}

// 500 after the charge was created: indeterminate, REQ. The redelivery searches (the same key would only
// replay the 500), finds the charge by metadata[billing_key] and records it: exactly one charge, one POST.
BOOST_AUTO_TEST_CASE(server_error_after_create_is_resolved_by_search) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline(f.config_for_pipeline(), &reg);
    auto body = event_json("acme-6", "2026-11", 700);
    auto key = key_of("acme-6", "2026-11");
    f.fake->faults().fail_after_create = 1;
    auto v = f.handle(*p, delivery_of(body, "0f01", 1));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST(v.delay == 103ms);
    auto pending = f.row(key);
    BOOST_TEST(billing::to_string(pending->status) == "pending");
    BOOST_TEST(pending->indeterminate_since.has_value());
    BOOST_TEST(pending->lease_until.has_value());
    BOOST_TEST((*pending->lease_until <= std::chrono::system_clock::now()));  // released for RECOVER
    BOOST_TEST_REQUIRE(f.fake->charges().size() == 1u);
    auto created = f.fake->charges()[0].id;

    auto v2 = f.handle(*p, delivery_of(body, "0f01", 2));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    auto rec = f.row(key);
    BOOST_TEST(rec->charge_id.value_or("") == created);
    BOOST_TEST(rec->key_generation == 1);
    BOOST_TEST(metric(reg, "chargeguard_billing_messages_total", "requeued_indeterminate") == 1.0);
}

// A decline is final: declined, FIN; a redelivery does not try again.
BOOST_AUTO_TEST_CASE(decline_is_final) {
    fixture f;
    f.fake->decline("cus_broke", {"card_declined", "insufficient_funds"});
    auto p = f.make_pipeline();
    auto body = event_json("acme-9", "2026-11", 1200, "cus_broke");
    auto key = key_of("acme-9", "2026-11");
    auto v = f.handle(*p, delivery_of(body, "1201"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "declined", v.detail);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "declined");
    BOOST_TEST(rec->charge_id.has_value());  // the failed charge, for support
    auto again = f.handle(*p, delivery_of(body, "1201", 2));
    BOOST_TEST(reason(again) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == 1);
}

// PostgreSQL unreachable (a pool pointed at a closed port): REQ with a delay growing with attempts, capped,
// and Stripe is never called.
BOOST_AUTO_TEST_CASE(postgres_unreachable_requeues_without_calling_stripe) {
    fixture f;
    auto dead_pool = f.pool_for(test::loopback_config(test::closed_port()));
    billing::ledger dead_ledger(dead_pool);
    billing::charge_flow p(f.config_for_pipeline(), dead_ledger, *f.stripe, logger());
    auto body = event_json("acme-10", "2026-11", 1300);
    auto v1 = f.handle(p, delivery_of(body, "1301", 1));
    auto v3 = f.handle(p, delivery_of(body, "1301", 3));
    auto v9 = f.handle(p, delivery_of(body, "1301", 9));
    BOOST_TEST(reason(v1) == "requeued_postgres", v1.detail);
    BOOST_TEST(!v1.finished());
    BOOST_TEST(v1.delay == 50ms);
    BOOST_TEST(v3.delay == 200ms);
    BOOST_TEST(v9.delay == 400ms);  // capped
    BOOST_TEST(f.fake->requests() == 0u);
    run_async(f.io, [&]() -> net::awaitable<void> { co_await dead_pool->close(); });
}

BOOST_AUTO_TEST_SUITE_END()
