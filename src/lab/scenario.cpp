#include "lab/scenario.hpp"

namespace cg::lab {

// One initialiser per scenario, naming only what differs from the defaults in scenario.hpp.
const std::vector<scenario>& all_scenarios() {
    static const std::vector<scenario> list{
        {.name = "FM1",
         .what = "key salted with NSQ Attempts; the consumer crashes after Stripe answered, before FIN (x5)",
         .unsafe_key = key_policy::attempts,
         .events = 1,
         .max_attempts = 10,  // the sixth delivery is handled, not given up
         .crashes = 5},
        {.name = "FM2",
         .what = "key with a per-connection UUID; the consumer restarts (crash) before FIN",
         .unsafe_key = key_policy::connection,
         .crashes = 1},
        {.name = "FM2b",
         .what = "key with the nsqd address; redelivered by nsqd restarted on a new address "
                 "(fake broker: through a second nsqd)",
         .unsafe_key = key_policy::nsqd_address,
         .crashes = 1,
         .broker_restart = true,
         .real_broker = true},
        {.name = "FM2c",
         .what = "key with the time of the call; the consumer crashes before FIN",
         .unsafe_key = key_policy::call_time,
         .crashes = 1},
        {.name = "FM3",
         .what =
             "Stripe call blocking the main loop (pynsq's IOLoop), 1.2 s > msg_timeout 1 s, max_in_flight "
             "10, heartbeat 30 s, Attempts key",
         .unsafe_key = key_policy::attempts,
         .call = unsafe_call::blocking,
         .events = 10,
         .max_in_flight = 10,
         .max_attempts = 2,
         .stripe_latency_ms = 1200,
         .heartbeat_ms = 30000,  // nsqd's and pynsq's default: heartbeats answered late, the connection stays
         .real_broker = true},
        {.name = "FM3-heartbeat",
         .what = "as FM3 with heartbeat 1 s and max_in_flight 5: the blocked loop misses heartbeats, nsqd "
                 "drops the connection",
         .unsafe_key = key_policy::attempts,
         .call = unsafe_call::blocking,
         .events = 5,
         .max_in_flight = 5,
         .max_attempts = 2,
         .stripe_latency_ms = 1200,
         .heartbeat_ms = 1000,
         .real_broker = true},
        {.name = "FM3b",
         .what =
             "Stripe call offloaded but no TOUCH, 1.5 s > msg_timeout 1 s, max_in_flight 10, Attempts key",
         .unsafe_key = key_policy::attempts,
         .call = unsafe_call::offloaded_no_touch,
         .events = 10,
         .max_in_flight = 10,
         .max_attempts = 3,
         .stripe_latency_ms = 1500,
         .real_broker = true},
        {.name = "republish-msgid",
         .what = "key = NSQ message id; the producer re-publishes (new id, same event)",
         .unsafe_key = key_policy::message_id,
         .events = 3,
         .publish_twice = true},
        {.name = "pause-resume",
         .what =
             "channel paused with 3 messages in flight (Stripe 1.2 s, no TOUCH, Attempts key), resumed 2 s "
             "later",
         .unsafe_key = key_policy::attempts,
         .call = unsafe_call::offloaded_no_touch,
         .events = 3,
         .max_in_flight = 3,
         .max_attempts = 2,
         .stripe_latency_ms = 1200,
         .pause_in_flight = true},
        {.name = "deferred-req-24h",
         .what = "Stripe 500 (charge created), REQ deferred past Stripe's 24 h key window; content key, no "
                 "ledger",
         .unsafe_key = key_policy::content,
         .fail_after_create = 1,
         .clock_jump_after_first = true},
        {.name = "stripe-500-replayed",
         .what = "Stripe 500 after creating the charge, replayed under the same key; retried under an "
                 "Attempts key",
         .unsafe_key = key_policy::attempts,
         .fail_after_create = 1},
        {.name = "layer-key-alone",
         .what = "content key alone (no ledger) vs the same events re-published after 24 h",
         .unsafe_key = key_policy::content,
         .republish_after_24h = true},
        {.name = "layer-ledger-alone",
         .what = "ledger alone (naive Attempts key, no search) vs a Stripe 500 then a crash before FIN",
         .unsafe_key = key_policy::attempts,
         .call = unsafe_call::ledger_naive_key,
         .crashes = 1,
         .fail_after_create = 1},
        {.name = "layer-spend-cap",
         .what =
             "spend cap alone: Attempts key, no ledger, every message delivered 3 times (crash before FIN "
             "x2); direct, then through the vault proxy, key capped at expected x 1.10",
         .unsafe_key = key_policy::attempts,
         .events = 10,
         .max_in_flight = 10,
         .max_attempts = 10,
         .crashes = 20,  // every first and second delivery of the 10 messages
         .spend_cap = true},
        {.name = "correction-refund",
         .what = "a correction refunds 500 of a charge; the unsafe consumer keys the refund on NSQ Attempts, "
                 "crash after Stripe answered, before FIN",
         .unsafe_key = key_policy::attempts,
         .events = 1,
         .crashes = 1,
         .correction = true},
        {.name = "settle-later",
         .what = "a bank debit answers processing, then fails: counted as charged vs followed to its end "
                 "(dead letter, alert, replay once topped up)",
         .events = 2,
         .settles_later = true},
    };
    return list;
}

const scenario* find_scenario(std::string_view name) {
    for (const auto& s : all_scenarios())
        if (s.name == name) return &s;
    return nullptr;
}

std::vector<variant> variants_of(const scenario& s) {
    if (s.spend_cap) return {variant::unsafe, variant::unsafe_capped, variant::safe};
    return {variant::unsafe, variant::safe};
}

}  // namespace cg::lab
