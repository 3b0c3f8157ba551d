// The simulator's world (sim.hpp): its parameters, the state of nsqd, the sidecars and their deliveries, and
// the one class whose members are the models (ledger_model.cpp, stripe_model.cpp, nsqd_model.cpp,
// vault_model.cpp), the executor of the charge fsm's commands (sidecar.cpp, recover.cpp) and the run with its
// invariants (sim.cpp).
// Internal to tests/sim.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "billing/machine/charge_fsm.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/settlement.hpp"
#include "models.hpp"
#include "sim.hpp"
#include "stripe/fact.hpp"
#include "stripe/types.hpp"

namespace cg::sim::detail {

using billing::record_status;

// The pipeline's defaults (billing/flow/charge_flow.hpp charge_flow_config, stripe/config.hpp), and the fault
// model.
struct params {
    ms_t lease = 60 * sec;
    ms_t renew = 15 * sec;
    ms_t lease_held_floor = 10 * sec;
    ms_t max_requeue = hour;
    ms_t retry_same_key_delay = 5 * sec;
    ms_t indeterminate_delay = 30 * sec;
    ms_t quiet = 300 * sec;
    ms_t client_timeout = 30 * sec;  // one request attempt
    int client_tries = 3;            // 1 + stripe/retry.hpp max_retries: 429 / 409 / not sent, same key
    ms_t msg_timeout = 60 * sec;     // nsqd --msg-timeout; TOUCH extends it
    ms_t poll_after = 10 * minute;   // --processing-poll-after
    ms_t poll_every = 5 * minute;
    ms_t idempotency_ttl = 24 * hour;
    // Stripe runs a request at most this long after it was sent, even when our client gave up on it: the
    // quiet period must exceed it (docs/design.md §4).
    ms_t max_late_execution = 240 * sec;
    ms_t horizon = 5 * 24 * hour;  // after the faults stop, how long the world may take to settle
    // The sweeper's defaults (billing/heal/sweep_bound.cpp for the pipeline's settings above): the bound
    // 2 × msg_timeout + quiet + 100 ms + max(lease_held_delay, lease / 10), a quarter of it capped at 60 s
    // between sweeps; after a failover a sweep every lease / 30 (at least 1 s) from a grace of two renewals
    // and one interval until max(lease, grace) + two intervals. Safety never depends on them.
    ms_t sweep_after = 2 * 60 * sec + 300 * sec + 100 + 10 * sec;
    ms_t sweep_every = 60 * sec;
    ms_t failover_every = 2 * sec;
    ms_t failover_grace = 2 * 15 * sec + 2 * sec;
    ms_t failover_window = 60 * sec + 2 * 2 * sec;
    // A failover loses at most this many of the last committed statements, none older than the standby's
    // replication lag.
    int lost_commits = 4;
    ms_t replication_lag = 30 * sec;
};

struct message {
    int event = 0;
    std::string body;
    int attempts = 0;
    std::uint64_t token = 0;
    bool inflight = false;
    bool done = false;
    ms_t timeout_at = 0;
};

// One delivery: the charge fsm that ships (billing/machine/charge_fsm.hpp) deciding, this world running its
// commands.
struct delivery {
    int msg = 0;
    std::uint64_t token = 0;
    int sidecar = 0;
    std::uint64_t incarnation = 0;
    std::optional<billing::machine::charge_fsm> fsm;  // until its verdict
    billing::billing_event ev;                        // the fsm's, once parsed
    std::string key;
    billing::create_request request;    // the create call under way (its client retries resend it)
    billing::machine::command pending;  // the statement or list scheduled to run next
    int call = 0;  // which call of this delivery is outstanding (a late answer to an older one is ignored)
    bool calling = false;
    bool row_written = true;  // false: write_before_call removed and the call went first
    bool swept = false;       // the sweeper's: no message (msg is -1), no FIN or REQ
};

struct request {
    int delivery = 0;
    int call = 0;
    int attempt = 0;
    std::string idempotency_key;
    std::string billing_key;
    std::int64_t amount = 0;
    int event = 0;
    int http = 0;  // Stripe's answer, set when it executes; 0: not yet (or never: not sent)
    int charge = -1;
    bool intent = false;  // POST /v1/payment_intents (confirm=true) rather than /v1/charges
    int intent_idx = -1;
    // The vault proxy in front of Stripe (vault_model.cpp): the row the reservation found or wrote, whether
    // this request owns it (reserved / rereserved) and the row's state then; a refusal's body, the proxy's
    // answer when it did not forward.
    int vault_row = -1;
    bool vault_owner = false;
    spend_row::state vault_state = spend_row::state::reserved;
    std::string refusal;
};

struct sidecar {
    bool up = true;
    std::uint64_t incarnation = 0;
};

struct event_spec {
    billing::billing_event ev;
    std::string key;
    bool declines = false;
    bool debit = false;
    bool needs_auth = false;  // an on-session card intent that stops at requires_action
    bool retry = false;       // the operator runs retry-declined on its declined row
    bool fixed = false;       // the payment method was fixed (at the retry): it pays from then on
    bool replay = false;      // the operator replays its dead letter once its debit failed after processing
    bool replayed = false;
    // Not a valid event: an upstream bug published a period's event again under another customer id (so
    // another key) for the same customer, or for the period's whole expected total. Charging it moves money
    // nobody owes; only the vault's cap stands in its way.
    bool upstream_bug = false;
};

// A Stripe webhook event about a PaymentIntent.
std::string intent_event_json(const std::string& evt, const std::string& type, ms_t created,
                              const stripe_intent& pi, const std::string& latest_charge);

struct action {
    ms_t at;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const action& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

class world {
  public:
    explicit world(const config& c) : cfg_(c), rnd_{c.seed} {
        for (auto s : c.removed) removed_.insert(static_cast<int>(s));
        fsm_cfg_ = fsm_config();
        result_.seed = c.seed;
        faults_ = true;
    }

    run_result run();

  private:
    // ---- scheduling ----
    void at(ms_t t, std::function<void()> fn) { queue_.push({t, ++seq_, std::move(fn)}); }
    void note(const std::string& what) {
        // FNV-1a over the schedule: two runs of one seed agree iff their digests do.
        for (unsigned char ch : what) digest_ = (digest_ ^ ch) * 0x100000001b3ULL;
        digest_ = (digest_ ^ static_cast<std::uint64_t>(now_)) * 0x100000001b3ULL;
        if (cfg_.trace) result_.schedule.push_back(std::to_string(now_) + " " + what);
    }
    void violation(const std::string& what) {
        note("VIOLATION " + what);
        if (result_.violations.size() < 20)
            result_.violations.push_back("t=" + std::to_string(now_) + "ms " + what);
    }
    bool has(safeguard s) const { return !removed_.count(static_cast<int>(s)); }
    // A fault of the schedule: drawn from the seed, numbered in the order they fire; config::keep_faults
    // suppresses those it does not list (the draw is made all the same), which is how a schedule shrinks.
    bool fault(double p) { return faults_ && rnd_.chance(p) && kept_fault(); }
    bool kept_fault() {
        const std::uint32_t n = ++fault_n_;
        if (cfg_.keep_faults && !std::binary_search(cfg_.keep_faults->begin(), cfg_.keep_faults->end(), n))
            return false;
        ++result_.faults;
        note("fault #" + std::to_string(n));
        return true;
    }
    ms_t pg() { return rnd_.range(1, 20); }

    // ---- ledger (ledger_sql.hpp's statements) ----
    row* find_row(const std::string& key) {
        auto it = rows_.find(key);
        return it == rows_.end() ? nullptr : &it->second;
    }
    // A statement's write: updated_at now, and the row as it was journalled — unless the write is one the
    // simulated standby always has (then every earlier commit too: replication keeps the commit order).
    void commit(const row* before, row& after, bool losable = true);
    void supersede_payments(const row& r);  // the reopen's billing_retries row: the old payment's ids
    void set_status(row& r, record_status to);
    void left_pending(row& r);
    bool insert(const delivery& d);
    std::optional<std::int64_t> take(const std::string& key);
    struct attempted {
        std::int32_t gen;
        std::int64_t epoch;
    };
    std::optional<attempted> attempt(const std::string& key, std::int64_t epoch);
    std::optional<std::int64_t> renew(const std::string& key, std::int64_t epoch);
    void in_flight_note(const std::string& key, std::int32_t gen);
    bool settle(const std::string& key, record_status s, const std::string& charge_id,
                const std::string& payment_intent = {});
    void indeterminate(const std::string& key, std::int64_t epoch);
    void release(const std::string& key, std::int64_t epoch);

    // ---- Stripe ----
    void stripe_execute(int req);
    void money_check(const std::string& billing_key);
    void emit_webhook(int charge);
    void emit_intent_webhook(int intent);
    void create_intent(request& q, const event_spec& e);
    void settle_debit(int charge);
    void receive_webhook(const billing::payment_fact& f, bool foreign);
    std::optional<billing::payment_fact> read_webhook(const std::string& body);
    void apply_to_row(row& r, const billing::payment_fact& f, bool foreign);
    void poll();
    void authenticate(int intent);

    // ---- the operator: retry-declined (app/declined_retry.cpp, billing/store/retry_store.hpp) ----
    void operator_run();
    void retry_look(int event, int round);
    void reopen(int event);

    // ---- nsqd ----
    void publish(int event);
    void deliver(int msg);
    void fin(const delivery& d);
    void req(const delivery& d, ms_t delay);
    void touch(const delivery& d);
    void timeout_check(int msg, std::uint64_t token);
    ms_t day_outage();

    // ---- the sidecars: the charge fsm's commands run against the models (sidecar.cpp, recover.cpp) ----
    billing::machine::flow_config fsm_config() const;
    bool alive(int id);
    void crash(int sc);
    void start(int id);
    void resume(int id, const billing::machine::fsm_input& in);
    void exec(int id, billing::machine::command c);
    void ledger_step(int id, const billing::machine::command& c);
    void settle_step(int id, const billing::machine::command& c);
    void call(int id);
    void send(int id, int call, int attempt);
    void transmit(int id, int call, int attempt, int req);
    void answered(int id, int call, int attempt, int req, bool timed_out);
    void finish_call(int id, const stripe::charge_outcome& out);
    billing::machine::fsm_input search_charges(int id, const billing::machine::search_query& q);
    billing::machine::fsm_input search_intents(int id, const billing::machine::search_query& q);
    billing::machine::fsm_input bump(int id, const billing::machine::command& c);
    void renew_tick(int id, int call);

    // ---- the healers and PostgreSQL's failover (sweeper.cpp) ----
    void failover();
    void sweep_tick(int sc);
    void failover_sweeps(int sc, std::uint64_t incarnation, ms_t failed_over, ms_t until);
    void sweep(int sc, ms_t written_before);
    void sweep_row(int sc, const std::string& key, bool after_failover);
    void start_swept(int id);
    void replay_letters();
    int event_of(const std::string& key) const;

    // ---- the vault proxy (vault_model.cpp) ----
    void vault_open();
    bool vault_forward(int rq);
    void vault_account(int rq, bool timed_out);
    void vault_settled(vault_key& k, spend_row& r, const request& q);
    void resolve(const std::string& period, int row);
    void resolver_search(vault_key& k, spend_row& r);
    stripe::movement vault_payment_now(const spend_row& r) const;
    void vault_check_in_flight(vault_key& k, spend_row& r);
    void vault_payments_ended();
    void vault_cancel(int intent);
    void money_moves(const stripe_charge& ch, int sign);
    void cap_exceeded(const std::string& period, std::int64_t moving);
    void cap_check();
    std::int64_t counted_once(const vault_key& k) const;
    void upstream_bug(rng& bug);

    void check_final();

    config cfg_;
    params p_;
    billing::machine::flow_config fsm_cfg_;
    rng rnd_;
    std::unordered_set<int> removed_;
    bool faults_ = true;
    ms_t now_ = 0;
    std::uint64_t seq_ = 0;
    std::uint64_t digest_ = 0xcbf29ce484222325ULL;
    std::priority_queue<action, std::vector<action>, std::greater<>> queue_;
    run_result result_;

    std::vector<event_spec> events_;
    std::unordered_map<std::string, row> rows_;
    struct journalled {
        std::string key;
        row before;
        ms_t at;
    };
    std::deque<journalled> journal_;  // the last commits the standby may lack, oldest first
    bool failover_armed_ = false;     // a failover strikes soon after the next commit
    int sweep_ticks_ = 0;             // the sweepers' regular ticks scheduled
    std::uint32_t fault_n_ = 0;
    std::unordered_map<std::string, std::vector<std::pair<billing::payment_fact, bool>>>
        stashed_;  // for pending rows
    std::vector<stripe_charge> charges_;
    std::vector<stripe_intent> intents_;
    std::unordered_map<std::string, saved_answer> saved_;
    std::unordered_map<std::string, int> live_;         // succeeded or pending charges by billing key
    std::unordered_set<std::string> retried_payments_;  // billing_retries: the old payments of a retried row
    std::vector<request> requests_;
    bool vault_on_ = false;                             // the sidecars call Stripe through the vault proxy
    std::unordered_map<std::string, vault_key> vault_;  // by billing period
    std::unordered_map<std::string, std::string> period_of_;  // billing key → its period
    std::unordered_map<std::string, std::int64_t> moving_;    // succeeded or pending cents by period
    // Valid events the cap refused: true while every refusal was one the cap owed (the reservations that
    // may still move money, each counted once, left no room), false once one was not.
    std::unordered_map<int, bool> cap_refused_;
    std::vector<message> messages_;
    std::vector<delivery> deliveries_;
    std::vector<sidecar> sidecars_;
    std::uint64_t tokens_ = 0;
    int events_sent_ = 0;
    ms_t fleet_down_until_ = -1;  // every sidecar down until then
    ms_t storm_until_ = -1;       // a 429 storm: Stripe refuses most requests, the client waits for its pacer
};

// resolver.cpp's followed() (in an anonymous namespace there), mirrored: a reservation settled while its
// payment may still move money without having moved is followed until Stripe says how it ended.
bool followed(stripe::movement m);

// A Stripe webhook event about a charge, as Stripe sends it.
std::string charge_event_json(const std::string& evt, const std::string& type, ms_t created,
                              const std::string& id, const std::string& status, const std::string& key,
                              const std::string& payment_intent = {});

}  // namespace cg::sim::detail
