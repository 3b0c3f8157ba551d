#include "lab/scenario.hpp"

namespace cg::lab {

const std::vector<scenario>& all_scenarios() {
    static const std::vector<scenario> list = [] {
        std::vector<scenario> v;
        {
            scenario s;
            s.name = "FM1";
            s.what =
                "key salted with NSQ Attempts; the consumer crashes after Stripe answered, before FIN (x5)";
            s.unsafe_key = key_policy::attempts;
            s.events = 1;
            s.crashes = 5;
            s.max_attempts = 10;  // the sixth delivery is handled, not given up
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM2";
            s.what = "key with a per-connection UUID; the consumer restarts (crash) before FIN";
            s.unsafe_key = key_policy::connection;
            s.crashes = 1;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM2b";
            s.what =
                "key with the nsqd address; redelivered by nsqd restarted on a new address "
                "(fake broker: through a second nsqd)";
            s.unsafe_key = key_policy::nsqd_address;
            s.real_broker = true;
            s.broker_restart = true;
            s.crashes = 1;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM2c";
            s.what = "key with the time of the call; the consumer crashes before FIN";
            s.unsafe_key = key_policy::call_time;
            s.crashes = 1;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM3";
            s.what =
                "Stripe call blocking the main loop (pynsq's IOLoop), 1.2 s > msg_timeout 1 s, max_in_flight "
                "10, "
                "heartbeat 30 s, Attempts key";
            s.unsafe_key = key_policy::attempts;
            s.call = unsafe_call::blocking;
            s.heartbeat_ms =
                30000;  // nsqd's and pynsq's default: heartbeats answered late, the connection stays
            s.stripe_latency_ms = 1200;
            s.events = 10;
            s.max_in_flight = 10;
            s.max_attempts = 2;
            s.real_broker = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM3-heartbeat";
            s.what =
                "as FM3 with heartbeat 1 s and max_in_flight 5: the blocked loop misses heartbeats, nsqd "
                "drops "
                "the connection";
            s.unsafe_key = key_policy::attempts;
            s.call = unsafe_call::blocking;
            s.heartbeat_ms = 1000;
            s.stripe_latency_ms = 1200;
            s.events = 5;
            s.max_in_flight = 5;
            s.max_attempts = 2;
            s.real_broker = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "FM3b";
            s.what =
                "Stripe call offloaded but no TOUCH, 1.5 s > msg_timeout 1 s, max_in_flight 10, Attempts key";
            s.unsafe_key = key_policy::attempts;
            s.call = unsafe_call::offloaded_no_touch;
            s.events = 10;
            s.max_in_flight = 10;
            s.max_attempts = 3;
            s.stripe_latency_ms = 1500;
            s.real_broker = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "republish-msgid";
            s.what = "key = NSQ message id; the producer re-publishes (new id, same event)";
            s.unsafe_key = key_policy::message_id;
            s.events = 3;
            s.publish_twice = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "pause-resume";
            s.what =
                "channel paused with 3 messages in flight (Stripe 1.2 s, no TOUCH, Attempts key), resumed 2 "
                "s later";
            s.unsafe_key = key_policy::attempts;
            s.call = unsafe_call::offloaded_no_touch;
            s.events = 3;
            s.max_in_flight = 3;
            s.max_attempts = 2;
            s.stripe_latency_ms = 1200;
            s.pause_in_flight = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "deferred-req-24h";
            s.what =
                "Stripe 500 (charge created), REQ deferred past Stripe's 24 h key window; content key, no "
                "ledger";
            s.unsafe_key = key_policy::content;
            s.fail_after_create = 1;
            s.clock_jump_after_first = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "stripe-500-replayed";
            s.what =
                "Stripe 500 after creating the charge, replayed under the same key; retried under an "
                "Attempts key";
            s.unsafe_key = key_policy::attempts;
            s.fail_after_create = 1;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "layer-key-alone";
            s.what = "content key alone (no ledger) vs the same events re-published after 24 h";
            s.unsafe_key = key_policy::content;
            s.republish_after_24h = true;
            v.push_back(s);
        }
        {
            scenario s;
            s.name = "layer-ledger-alone";
            s.what = "ledger alone (naive Attempts key, no search) vs a Stripe 500 then a crash before FIN";
            s.unsafe_key = key_policy::attempts;
            s.call = unsafe_call::ledger_naive_key;
            s.fail_after_create = 1;
            s.crashes = 1;
            v.push_back(s);
        }
        return v;
    }();
    return list;
}

const scenario* find_scenario(std::string_view name) {
    for (const auto& s : all_scenarios())
        if (s.name == name) return &s;
    return nullptr;
}

}  // namespace cg::lab
