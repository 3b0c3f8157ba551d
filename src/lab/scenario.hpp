// The lab's scenarios as data: one delivery history (what crashes, what Stripe does, what the producer and
// the operator do) run twice — by an unsafe consumer and by the real pipeline. Only the consumer differs
// between the two runs; nsqd and fake-stripe produce the history.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "lab/keys.hpp"

namespace cg::lab {

// How the unsafe consumer reaches Stripe.
enum class unsafe_call {
    offloaded_touch,     // like the real consumer (offloaded, TOUCHed): only the key differs
    blocking,            // the call blocks the main loop (pynsq's IOLoop failure)
    offloaded_no_touch,  // the textbook fix alone: offloaded, but the message is never TOUCHed
    ledger_naive_key,    // the ledger (pre-flight row, lease, recovery) without the content key or the search
};

struct scenario {
    std::string name;
    std::string what;  // one line for the table's legend
    key_policy unsafe_key = key_policy::attempts;
    unsafe_call call = unsafe_call::offloaded_touch;
    int events = 2;
    unsigned max_in_flight = 1;
    unsigned max_attempts = 5;
    int crashes = 0;               // the first N deliveries end in a crash after Stripe answered, before FIN
    int stripe_latency_ms = 0;     // fake-stripe answers every /v1 call this late
    int heartbeat_ms = 1000;       // the consumers' IDENTIFY heartbeat_interval
    int fail_after_create = 0;     // the first N creating POSTs: charge created, then 500 (saved, replayed)
    bool publish_twice = false;    // the producer re-publishes every event (its PUB's OK was lost)
    bool broker_restart = false;   // real broker: after the crash, nsqd restarts on a new address
    bool real_broker = false;      // use the real nsqd when one is given (FM3 rows must)
    bool pause_in_flight = false;  // pause the channel once every event is in flight, resume 2 s later
    bool clock_jump_after_first = false;  // the first delivery's REQ lands 25 h later (Stripe's clock moved)
    bool republish_after_24h = false;  // after all is settled: 25 h pass, the same events are published again
    // The spend cap's row: a third run, the unsafe consumer through the vault proxy (`chargeguard proxy`'s
    // engine) with a vault key for the period capped at expected × 1.10; the safe run goes through it too.
    bool spend_cap = false;
    // A bank debit that answers processing and fails later (src/lab/settle_later.cpp runs it).
    bool settles_later = false;
    // Each event is followed by its correction (revision 1, the total 500 lower): the crashes hit the
    // corrections only, and the count's duplicates and uncharged are of refunds (one per customer is right).
    bool correction = false;
};

// One run of a scenario: which consumer, and whether it reaches Stripe through the vault proxy.
enum class variant {
    unsafe,         // the unsafe consumer, straight to Stripe
    unsafe_capped,  // the unsafe consumer through the vault proxy (spend_cap scenarios)
    safe,           // the pipeline (through the vault proxy in spend_cap scenarios)
};

// The variants `s` runs, in table order.
std::vector<variant> variants_of(const scenario& s);

// The table, in report order. A new scenario is one initialiser in all_scenarios() (scenario.cpp) naming what
// differs from the defaults above; a scenario whose run needs more than these fields adds its field here and
// its step to the driver (lab/driver.cpp: run_variant, prepare, drive) or a consumer file of its own.
const std::vector<scenario>& all_scenarios();
const scenario* find_scenario(std::string_view name);

}  // namespace cg::lab
