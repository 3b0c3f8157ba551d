// The billing state machine (docs/design.md §4) end to end: real PostgreSQL (scratch database, migrations
// applied), fake-stripe over TLS, the real stripe::client. Each test names the failure it would catch. g++ 12
// -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/detached.hpp>
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

// Runs one delivery to completion and wakes `done` (a timer used as an event).
net::awaitable<void> handle_into(billing::charge_flow* p, billing::delivery d,
                                 std::optional<billing::verdict>* out, net::steady_timer* done) {
    *out = co_await p->handle(std::move(d));
    done->cancel();
}

double metric(metrics::registry& reg, const std::string& family, const std::string& outcome) {
    auto fams = test::parse_prometheus(reg.render());
    auto it = fams.find(family);
    if (it == fams.end()) return -1;
    for (auto& s : it->second.samples)
        if (s.labels.count("outcome") && s.labels.at("outcome") == outcome) return s.value;
    return -1;
}

double unlabelled(metrics::registry& reg, const std::string& family) {
    auto fams = test::parse_prometheus(reg.render());
    auto it = fams.find(family);
    if (it == fams.end() || it->second.samples.size() != 1) return -1;
    return it->second.samples[0].value;
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

// Same customer and period, another amount: dead-lettered "conflict", the recorded row untouched, one charge;
// a redelivery of the conflicting message adds no second letter.
BOOST_AUTO_TEST_CASE(payload_conflict_is_dead_lettered_and_ledger_untouched) {
    fixture f;
    auto p = f.make_pipeline();
    auto key = key_of("acme-3", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 1000), "0c01"))) == "charged");
    auto v = f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 2000), "0c02"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail == "conflict");
    auto again = f.handle(*p, delivery_of(event_json("acme-3", "2026-11", 2000), "0c02", 2));
    BOOST_TEST(reason(again) == "dead_lettered");
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = $1 AND reason = 'conflict' "
                 "AND billing_key = $2 AND attempts = 1 AND topic = 'billing' AND channel = 'chargeguard'",
                 std::string("0c02"), key) == 1);
    BOOST_TEST(f.dead_letters("0c01") == 0);
    auto rec = f.row(key);
    BOOST_TEST(rec->amount_cents == 1000);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 1);
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

// A pending row whose first attempt is past the 23 h window (pipeline and fake-stripe clocks moved 25 h) and
// no charge at Stripe: the search finds none, the generation is bumped, one charge under "<base>-g2".
BOOST_AUTO_TEST_CASE(stale_pending_row_without_charge_takes_generation_two) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-7", "2026-11", 800);
    auto key = key_of("acme-7", "2026-11");
    f.fake->faults().rate_limit = 3;  // the first try and both client retries: 429, nothing saved
    auto v = f.handle(*p, delivery_of(body, "1001", 1));
    BOOST_TEST(reason(v) == "requeued_retry_same_key", v.detail);
    BOOST_TEST(v.delay == 102ms);
    BOOST_TEST(f.fake->charges().empty());
    BOOST_TEST(f.row(key)->stripe_attempts == 1);

    f.clock_offset = std::chrono::hours(25);
    f.fake->advance_clock(std::chrono::hours(25));
    auto v2 = f.handle(*p, delivery_of(body, "1001", 2));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(f.fake->posts_for(key) == 3);          // only the 429s
    BOOST_TEST(f.fake->posts_for(key + "-g2") == 1);  // the new generation
    stripe::metadata md(f.fake->charges()[0].metadata.begin(), f.fake->charges()[0].metadata.end());
    BOOST_TEST(stripe::metadata_value(md, "billing_key").value_or("") == key);  // always the base key
    auto rec = f.row(key);
    BOOST_TEST(rec->key_generation == 2);
    BOOST_TEST(billing::to_string(rec->status) == "charged");
}

// Another worker holds the lease: REQ until that lease can have expired (not a fixed short delay that burns
// NSQ attempts), no Stripe call, row untouched.
BOOST_AUTO_TEST_CASE(lease_held_elsewhere_requeues_without_calling_stripe) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-8", "2026-11", 900);
    auto key = key_of("acme-8", "2026-11");
    auto other = f.dead_workers_row(body, "other", 60s);  // alive here: it holds a 60 s lease
    auto v = f.handle(*p, delivery_of(body, "1101", 2));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_lease_held");
    // The other worker's 60 s lease has (almost) all of its time left: wait that long, plus ≤ 10 % jitter.
    BOOST_TEST(v.delay >= 58s, v.delay.count());
    BOOST_TEST(v.delay <= 66s, v.delay.count());
    BOOST_TEST(f.fake->requests() == 0u);
    auto rec = f.row(key);
    BOOST_TEST(rec->stripe_attempts == 1);  // the other worker's pre-flight; nothing added by this delivery
    BOOST_TEST((rec->lease_until == other.lease_until));
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

// The ledger's group-commit wait follows Stripe's pace: 1 % of the exponential average (weight 1/16) of the
// Stripe call time, capped by group_commit_linger_max, and never a wait when the cap is 0.
BOOST_AUTO_TEST_CASE(group_commit_linger_follows_stripe_call_time) {
    fixture f;
    BOOST_TEST(f.ledger->linger().count() == 0);  // no Stripe call yet: no wait
    f.fake->faults().latency_ms = 200;
    auto p = f.make_pipeline();
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-lg1", "2026-11", 1000), "1a01"))) ==
               "charged");
    // One 200 ms call: average 200 ms / 16 = 12.5 ms, so 125 µs (a little more: the call took ≥ 200 ms).
    auto one = f.ledger->linger();
    BOOST_TEST(one >= std::chrono::microseconds(125));
    BOOST_TEST(one < std::chrono::microseconds(250));
    BOOST_TEST(reason(f.handle(*p, delivery_of(event_json("acme-lg2", "2026-11", 1000), "1a02"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger() > one);  // the average climbs towards the call time

    auto capped = f.config_for_pipeline();
    capped.group_commit_linger_max = std::chrono::microseconds(40);
    auto q = f.make_pipeline(capped);
    BOOST_TEST(reason(f.handle(*q, delivery_of(event_json("acme-lg3", "2026-11", 1000), "1a03"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger() == std::chrono::microseconds(40));

    auto off = f.config_for_pipeline();
    off.group_commit_linger_max = std::chrono::microseconds(0);
    auto z = f.make_pipeline(off);
    BOOST_TEST(reason(f.handle(*z, delivery_of(event_json("acme-lg4", "2026-11", 1000), "1a04"))) ==
               "charged");
    BOOST_TEST(f.ledger->linger().count() == 0);
}

// Stripe slower than the lease: the lease is renewed while the call is awaited, so a second pipeline handling
// a redelivery meanwhile sees "lease held" and never POSTs. Without renewal it would take the expired lease
// and POST under the same key (409 in use here; a second charge after a new generation in general).
BOOST_AUTO_TEST_CASE(lease_is_renewed_during_a_slow_stripe_call) {
    fixture f;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 1000ms;
    cfg.lease_renew_interval = 200ms;
    auto a = f.make_pipeline(cfg);
    auto b = f.make_pipeline(cfg);
    f.fake->faults().latency_ms = 3000;  // the 7th renewal (≈ 1.4 s) comes well before the answer
    auto body = event_json("acme-11", "2026-11", 1400);
    auto key = key_of("acme-11", "2026-11");

    std::optional<billing::verdict> va, vb;
    net::steady_timer b_done(f.io, std::chrono::steady_clock::time_point::max());
    int touches = 0;
    // At the 7th touch (≈ 1.4 s into the call, past the 1 s lease) the redelivery arrives at the other
    // instance.
    billing::touch_fn touch = [&] {
        if (++touches == 7)
            asio::co_spawn(f.io, handle_into(b.get(), delivery_of(body, "1401", 2), &vb, &b_done),
                           asio::detached);
    };
    va = run_async(f.io, [&]() -> net::awaitable<billing::verdict> {
        auto v = co_await a->handle(delivery_of(body, "1401", 1), touch);
        if (!vb) co_await b_done.async_wait();  // cancelled when b finishes
        co_return v;
    });
    BOOST_TEST(touches >= 7);
    BOOST_TEST_REQUIRE(vb.has_value());
    BOOST_TEST(reason(*vb) == "requeued_lease_held", vb->detail);
    BOOST_TEST(reason(*va) == "charged", va->detail);
    BOOST_TEST(f.fake->posts_for(key) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Another worker takes the row's lease while Stripe is still answering (its epoch moves): the next renewal
// finds it gone, counts it, and notes the call in flight instead of renewing; the one charge is still made.
BOOST_AUTO_TEST_CASE(a_lease_taken_over_during_the_call_is_counted) {
    fixture f;
    metrics::registry reg;
    auto cfg = f.config_for_pipeline();
    cfg.lease = 5000ms;
    cfg.lease_renew_interval = 200ms;
    auto p = f.make_pipeline(cfg, &reg);
    f.fake->faults().latency_ms = 3000;
    auto body = event_json("acme-lost", "2026-11", 1450);
    auto key = key_of("acme-lost", "2026-11");

    bool taken = false;
    auto touch = f.take_lease_at_second_touch("billing_records", key, &taken);
    auto v = run_async(f.io, [&]() { return p->handle(delivery_of(body, "1451", 1), touch); });
    BOOST_TEST_REQUIRE(taken);
    BOOST_TEST(unlabelled(reg, "chargeguard_billing_lease_lost_total") == 1.0);
    BOOST_TEST(f.fake->posts_for(key) == 1, reason(v));
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Past max attempts a valid event is not poison: it goes through the machine like any delivery and is
// charged — never dead-lettered "max attempts exceeded" — and the delivery is counted so an operator sees it.
BOOST_AUTO_TEST_CASE(give_up_charges_a_valid_event_instead_of_dead_lettering_it) {
    fixture f;
    metrics::registry reg;
    auto p = f.make_pipeline(f.config_for_pipeline(), &reg);
    auto body = event_json("acme-12", "2026-11", 1500);
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1501", 10)); });
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.dead_letters("1501") == 0);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(unlabelled(reg, "chargeguard_billing_past_max_attempts_total") == 1.0);
}

// Past max attempts, an event that can never succeed is still dead-lettered, with its real reason.
BOOST_AUTO_TEST_CASE(give_up_dead_letters_an_invalid_event_with_its_reason) {
    fixture f;
    auto p = f.make_pipeline();
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of("{\"customer_id\": 7}", "1502", 10)); });
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1502' AND "
                        "reason LIKE 'event%'") == 1);
    BOOST_TEST(f.fake->requests() == 0u);
}

// The chaos-run loss: a worker wrote the row and died before Stripe heard of it; the redelivery came back
// past max attempts while the dead worker's lease still ran. Today's answer: requeue until the lease can
// have expired (no letter, no Stripe call), then recover and charge — never dead-letter and leave it pending.
BOOST_AUTO_TEST_CASE(past_max_attempts_with_a_dead_workers_lease_waits_for_it_then_charges) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-13", "2026-11", 1600);
    auto key = key_of("acme-13", "2026-11");
    f.dead_workers_row(body, "1601", 1500ms);  // the dead worker's pre-flight, 1.5 s lease
    auto held = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1601", 6)); });
    BOOST_TEST(!held.finished());
    BOOST_TEST(reason(held) == "requeued_lease_held", held.detail);
    BOOST_TEST(held.delay >= 1000ms, held.delay.count());          // until the dead worker's lease can expire
    BOOST_TEST(held.delay <= 1500ms + 150ms, held.delay.count());  // + at most 10 % jitter
    BOOST_TEST(f.dead_letters("1601") == 0);
    BOOST_TEST(f.fake->requests() == 0u);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND status = 'pending'", key) ==
               1);

    // nsqd redelivers after that delay (a timer stands in for the REQ timeout).
    run_async(f.io, [&]() -> net::awaitable<void> {
        net::steady_timer t(co_await asio::this_coro::executor, held.delay);
        co_await t.async_wait();
    });
    auto v = run_async(f.io, [&]() { return p->give_up(delivery_of(body, "1601", 7)); });
    BOOST_TEST(reason(v) == "charged", v.detail);
    BOOST_TEST(f.dead_letters("1601") == 0);
    BOOST_TEST(f.fake->charges().size() == 1u);
    BOOST_TEST(billing::to_string(f.row(key)->status) == "charged");
}

// Past max attempts with an indeterminate Stripe answer: the machine resolves it by search → charged, no
// letter, one charge.
BOOST_AUTO_TEST_CASE(give_up_resolves_an_indeterminate_attempt_by_search) {
    fixture f;
    auto p = f.make_pipeline();
    auto body2 = event_json("acme-14", "2026-11", 1700);
    auto key2 = key_of("acme-14", "2026-11");
    f.fake->faults().fail_after_create = 1;
    BOOST_TEST(reason(f.handle(*p, delivery_of(body2, "1602", 1))) == "requeued_indeterminate");
    auto resolved = run_async(f.io, [&]() { return p->give_up(delivery_of(body2, "1602", 10)); });
    BOOST_TEST(reason(resolved) == "charged", resolved.detail);
    BOOST_TEST(f.dead_letters("1602") == 0);
    BOOST_TEST(f.fake->posts_for(key2) == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Same customer and period under another key namespace: the UNIQUE (customer_id, billing_period) row
// conflicts, not the key. Dead-lettered "conflict" naming the recorded key; never a second charge.
BOOST_AUTO_TEST_CASE(same_customer_period_under_another_key_is_a_conflict) {
    fixture f;
    auto p = f.make_pipeline();
    auto cfg = f.config_for_pipeline();
    cfg.key_namespace = "other-ns";
    auto other = f.make_pipeline(cfg);
    auto body = event_json("acme-15", "2026-11", 1800);
    auto key = key_of("acme-15", "2026-11");
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "1701"))) == "charged");
    auto v = f.handle(*other, delivery_of(body, "1702"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail == "conflict");
    BOOST_TEST(
        f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1702' AND reason = 'conflict' "
                 "AND billing_key = $1",
                 key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records") == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// Stripe already saw the key with other parameters (400 idempotency_error): status conflict, dead letter,
// FIN.
BOOST_AUTO_TEST_CASE(stripe_idempotency_error_marks_conflict_and_dead_letters) {
    fixture f;
    auto p = f.make_pipeline();
    auto body = event_json("acme-16", "2026-11", 1900);
    auto key = key_of("acme-16", "2026-11");
    auto ev = billing::parse_event(body);
    BOOST_TEST_REQUIRE(ev.has_value());
    auto other = *ev;
    other.amount_cents = 1901;
    auto pre = f.run(f.stripe->create_charge(billing::build_charge_request(other, key, 1)));
    BOOST_TEST_REQUIRE((pre.cls == stripe::outcome_class::succeeded));
    auto v = f.handle(*p, delivery_of(body, "1801"));
    BOOST_TEST(v.finished());
    BOOST_TEST(reason(v) == "dead_lettered");
    BOOST_TEST(v.detail.find("idempotency_error") != std::string::npos, v.detail);
    BOOST_TEST(billing::to_string(f.row(key)->status) == "conflict");
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters WHERE nsq_message_id = '1801' AND "
                        "reason = 'stripe idempotency_error' AND billing_key = $1",
                        key) == 1);
    BOOST_TEST(reason(f.handle(*p, delivery_of(body, "1801", 2))) == "duplicate_prevented");
    BOOST_TEST(f.fake->posts_for(key) == 2);
}

// Recovery searched and found no charge, but the call under the current key showed life moments ago (its
// worker may have lost the lease while Stripe still works on it): no new generation yet — the row is
// requeued for when that call cannot charge any more, and only then charged under generation 2.
BOOST_AUTO_TEST_CASE(no_new_generation_while_a_call_under_the_old_one_may_be_in_flight) {
    fixture f;
    auto cfg = f.config_for_pipeline();
    cfg.new_key_quiet = 60s;
    auto p = f.make_pipeline(cfg);
    auto body = event_json("acme-19", "2026-11", 2200);
    auto rec = f.dead_workers_row(body, "1903", 30s);
    auto marked = f.run(f.ledger->mark_indeterminate(rec.key, rec.lease_epoch, "after sending: timeout"));
    BOOST_TEST_REQUIRE((marked.has_value() && *marked));
    auto v = f.handle(*p, delivery_of(body, "1903", 2));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_indeterminate", v.detail);
    BOOST_TEST(v.delay.count() > 55'000);
    BOOST_TEST(v.delay.count() <= 60'100);
    auto after = f.row(rec.key);
    BOOST_TEST(after->key_generation == 1);
    BOOST_TEST(!after->lease_remaining.value_or(0ms).count());  // handed back at once
    BOOST_TEST(f.fake->posts_for(rec.key + "-g2") == 0);
    // A minute later nothing under the old key can still charge: generation 2, charged once.
    f.age_last_attempt(rec.key);
    auto v2 = f.handle(*p, delivery_of(body, "1903", 3));
    BOOST_TEST(reason(v2) == "charged", v2.detail);
    BOOST_TEST(f.row(rec.key)->key_generation == 2);
    BOOST_TEST(f.fake->posts_for(rec.key + "-g2") == 1);
    BOOST_TEST(f.fake->charges().size() == 1u);
}

// A request refused for our setup (401: a bad or rotated API key) says nothing about the event: it stays
// pending, no dead letter, the message is requeued — and once the key is fixed the same event is charged,
// once. (Dead-lettering it, as a "rejected" event, would leave the customer uncharged for good: the letter's
// replay meets a final row.)
BOOST_AUTO_TEST_CASE(stripe_refusing_our_key_requeues_and_charges_once_the_key_is_fixed) {
    fixture f;
    auto sc = f.config();
    sc.api_key = "bad_key";
    auto bad_client = f.client(sc);
    billing::charge_flow p(f.config_for_pipeline(), *f.ledger, *bad_client, logger());
    auto body = event_json("acme-17", "2026-11", 2000);
    auto key = key_of("acme-17", "2026-11");
    auto v = f.handle(p, delivery_of(body, "1901"));
    BOOST_TEST(!v.finished());
    BOOST_TEST(reason(v) == "requeued_stripe_unavailable");
    BOOST_TEST(v.delay.count() == 104);
    auto rec = f.row(key);
    BOOST_TEST(billing::to_string(rec->status) == "pending");
    BOOST_TEST(f.scalar("SELECT count(*) FROM billing_records WHERE key = $1 AND last_error LIKE '%401%' AND "
                        "lease_until < now()",
                        key) == 1);
    BOOST_TEST(f.scalar("SELECT count(*) FROM dead_letters") == 0);
    BOOST_TEST(f.fake->charges().empty());
    // The operator fixes the key; the redelivery charges the same event under the same key.
    auto again = f.handle(*f.make_pipeline(), delivery_of(body, "1901", 2));
    BOOST_TEST(reason(again) == "charged");
    BOOST_TEST(billing::to_string(f.row(key)->status) == "charged");
    BOOST_TEST(f.fake->charges().size() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
