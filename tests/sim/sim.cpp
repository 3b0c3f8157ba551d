#include "sim.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "billing/decision.hpp"
#include "billing/event.hpp"
#include "billing/key.hpp"
#include "billing/outcome.hpp"
#include "billing/settlement.hpp"
#include "models.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"

namespace cg::sim {

std::string_view to_string(safeguard s) noexcept {
    switch (s) {
        case safeguard::write_before_call:
            return "write_before_call";
        case safeguard::lease_renewal:
            return "lease_renewal";
        case safeguard::search_before_new_key:
            return "search_before_new_key";
        case safeguard::same_key_window:
            return "same_key_window";
        case safeguard::quiet_period:
            return "quiet_period";
        case safeguard::same_payment:
            return "same_payment";
        case safeguard::in_flight_not_charged:
            return "in_flight_not_charged";
    }
    return "?";
}

namespace {

using billing::record_status;

// The pipeline's defaults (billing/pipeline.hpp pipeline_config, stripe/config.hpp), and the fault model.
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
};

struct message {
    int event = 0;
    std::string body;
    std::optional<billing::billing_event> parsed;  // the body through billing::parse_event, once
    int attempts = 0;
    std::uint64_t token = 0;
    bool inflight = false;
    bool done = false;
    ms_t timeout_at = 0;
};

struct delivery {
    int msg = 0;
    std::uint64_t token = 0;
    int sidecar = 0;
    std::uint64_t incarnation = 0;
    billing::billing_event ev;
    std::string key;
    std::int64_t epoch = 0;
    std::int32_t gen = 1;
    int call = 0;  // which call of this delivery is outstanding (a late answer to an older one is ignored)
    bool calling = false;
    bool row_written = true;  // false: write_before_call removed and the call went first
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
};

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
    bool fault(double p) { return faults_ && rnd_.chance(p); }
    ms_t pg() { return rnd_.range(1, 20); }

    // ---- ledger (ledger_sql.hpp's statements) ----
    row* find_row(const std::string& key) {
        auto it = rows_.find(key);
        return it == rows_.end() ? nullptr : &it->second;
    }
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
    bool settle(const std::string& key, record_status s, const std::string& charge_id);
    void indeterminate(const std::string& key, std::int64_t epoch);
    void release(const std::string& key, std::int64_t epoch);

    // ---- Stripe ----
    void stripe_execute(int req);
    void money_check(const std::string& billing_key);
    void emit_webhook(int charge);
    void settle_debit(int charge);
    void receive_webhook(const billing::payment_fact& f, bool foreign);
    std::optional<billing::payment_fact> read_webhook(const std::string& body);
    void apply_to_row(row& r, const billing::payment_fact& f, bool foreign);
    void poll();

    // ---- nsqd ----
    void publish(int event);
    void deliver(int msg);
    void fin(const delivery& d);
    void req(const delivery& d, ms_t delay);
    void touch(const delivery& d);
    void timeout_check(int msg, std::uint64_t token);

    // ---- the sidecars: one delivery's steps (docs/design.md §4) ----
    bool alive(int id);
    void crash(int sc);
    void start(int id);
    void preflight(int id);
    void decide(int id, const row& r);
    void take_step(int id);
    void attempt_then_call(int id);
    void call(int id);
    void send(int id, int call, int attempt);
    void transmit(int id, int call, int attempt, int req);
    void answered(int id, int call, int attempt, int req, bool timed_out);
    void finish_call(int id, const stripe::charge_outcome& out, int charge);
    void search(int id);
    void bump(int id);
    void renew_tick(int id, int call);

    void check_final();

    config cfg_;
    params p_;
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
    std::unordered_map<std::string, std::vector<std::pair<billing::payment_fact, bool>>>
        stashed_;  // for pending rows
    std::vector<stripe_charge> charges_;
    std::unordered_map<std::string, saved_answer> saved_;
    std::unordered_map<std::string, int> live_;  // succeeded or pending charges by billing key
    std::vector<request> requests_;
    std::vector<message> messages_;
    std::vector<delivery> deliveries_;
    std::vector<sidecar> sidecars_;
    std::uint64_t tokens_ = 0;
    int events_sent_ = 0;
    ms_t storm_until_ = -1;  // a 429 storm: Stripe refuses most requests, the client waits for its pacer
};

// ---------------------------------------------------------------- ledger

void world::set_status(row& r, record_status to) {
    using rs = record_status;
    const rs from = r.rec.status;
    bool ok = (from == rs::pending && (to == rs::charged || to == rs::declined || to == rs::processing)) ||
              (from == rs::processing && (to == rs::charged || to == rs::failed_after_processing));
    if (!ok)
        violation("state order: " + r.rec.key + " " + std::string(billing::to_string(from)) + " -> " +
                  std::string(billing::to_string(to)));
    r.rec.status = to;
}

bool world::insert(const delivery& d) {
    if (rows_.count(d.key)) return false;
    row r;
    r.rec.key = d.key;
    r.rec.customer_id = d.ev.customer_id;
    r.rec.billing_period = d.ev.billing_period;
    r.rec.amount_cents = d.ev.amount_cents;
    r.rec.currency = d.ev.currency;
    r.rec.stripe_customer_id = d.ev.stripe_customer_id;
    r.rec.stripe_attempts = 1;
    r.lease_until = now_ + p_.lease;
    r.epoch = 1;
    r.first_attempt = now_;
    r.last_life = now_;
    rows_.emplace(d.key, std::move(r));
    return true;
}

std::optional<std::int64_t> world::take(const std::string& key) {
    row* r = find_row(key);
    if (!r || !r->pending() || (r->lease_until >= 0 && r->lease_until >= now_)) return std::nullopt;
    r->lease_until = now_ + p_.lease;
    return ++r->epoch;
}

std::optional<world::attempted> world::attempt(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return std::nullopt;
    ++r->rec.stripe_attempts;
    if (r->first_attempt < 0) r->first_attempt = now_;
    r->last_life = now_;
    r->lease_until = now_ + p_.lease;
    return attempted{r->rec.key_generation, ++r->epoch};
}

std::optional<std::int64_t> world::renew(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return std::nullopt;
    r->lease_until = now_ + p_.lease;
    r->last_life = now_;
    return ++r->epoch;
}

void world::in_flight_note(const std::string& key, std::int32_t gen) {
    row* r = find_row(key);
    if (r && r->pending() && r->rec.key_generation == gen) r->last_life = now_;
}

bool world::settle(const std::string& key, record_status s, const std::string& charge_id) {
    row* r = find_row(key);
    if (!r || !r->pending()) return false;
    set_status(*r, s);
    if (!charge_id.empty() && !r->rec.charge_id) r->rec.charge_id = charge_id;
    if (s == record_status::processing) r->processing_since = now_;
    r->lease_until = -1;
    ++r->epoch;
    left_pending(*r);
    return true;
}

void world::indeterminate(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending()) return;
    if (r->indeterminate_since < 0) r->indeterminate_since = now_;
    if (r->epoch == epoch) {
        r->lease_until = now_ - 1;
        ++r->epoch;
    }
}

void world::release(const std::string& key, std::int64_t epoch) {
    row* r = find_row(key);
    if (!r || !r->pending() || r->epoch != epoch) return;
    r->lease_until = now_ - 1;
    ++r->epoch;
}

// The events recorded while the row was pending are applied once the pipeline settled it.
void world::left_pending(row& r) {
    auto it = stashed_.find(r.rec.key);
    if (it == stashed_.end()) return;
    auto facts = std::move(it->second);
    stashed_.erase(it);
    for (const auto& [f, foreign] : facts) apply_to_row(r, f, foreign);
}

// ---------------------------------------------------------------- Stripe

void world::money_check(const std::string& billing_key) {
    if (live_[billing_key] > 1)
        violation("two payments moved (or moving) money for key " + billing_key + ": " +
                  std::to_string(live_[billing_key]));
}

void world::stripe_execute(int rq) {
    request& q = requests_[rq];
    note("stripe executes " + q.idempotency_key);
    ++result_.stripe_creates;
    auto s = saved_.find(q.idempotency_key);
    if (s != saved_.end() && now_ - s->second.first >= p_.idempotency_ttl) {
        saved_.erase(s);  // Stripe prunes keys after 24 h
        s = saved_.end();
    }
    if (s != saved_.end()) {  // a replay: the saved answer, whatever it was
        q.http = s->second.http;
        q.charge = s->second.charge;
        return;
    }
    const event_spec& e = events_[q.event];
    const bool storm = now_ < storm_until_;
    if (fault(storm ? 0.5 : 0.04)) {  // 429: nothing happened, nothing saved
        q.http = 429;
        return;
    }
    if (fault(0.03)) {  // a 500 before the create ran: nothing saved
        q.http = 500;
        return;
    }
    stripe_charge ch;
    ch.id = "ch_" + std::to_string(charges_.size() + 1);
    ch.billing_key = q.billing_key;
    ch.idempotency_key = q.idempotency_key;
    ch.amount = q.amount;
    ch.created = now_;
    ch.visible_at = now_ + (fault(0.3) ? rnd_.range(0, 20 * sec) : 0);
    ch.payment_method_type = e.debit ? (rnd_.chance(0.5) ? "ach_debit" : "sepa_debit") : "card";
    ch.status = e.declines ? "failed" : e.debit ? "pending" : "succeeded";
    int idx = static_cast<int>(charges_.size());
    charges_.push_back(ch);
    q.charge = idx;
    q.http = e.declines ? 402 : 200;
    if (fault(0.03)) q.http = 500;  // the create ran, then Stripe failed: the 500 is saved and replayed
    saved_[q.idempotency_key] = {now_, q.http, idx};
    if (ch.status != "failed") {
        ++live_[ch.billing_key];
        money_check(ch.billing_key);
    }
    emit_webhook(idx);
    if (e.debit) at(now_ + rnd_.range(10 * minute, 12 * hour), [this, idx] { settle_debit(idx); });
}

void world::settle_debit(int idx) {
    stripe_charge& ch = charges_[idx];
    ch.status = rnd_.chance(0.75) ? "succeeded" : "failed";
    note("debit " + ch.id + " " + ch.status);
    if (ch.status == "failed") --live_[ch.billing_key];
    emit_webhook(idx);
}

std::string charge_event_json(const std::string& evt, const std::string& type, ms_t created,
                              const std::string& id, const std::string& status, const std::string& key) {
    return "{\"id\":\"" + evt + "\",\"object\":\"event\",\"type\":\"" + type +
           "\",\"created\":" + std::to_string(created / 1000) +
           ",\"livemode\":false,\"data\":{\"object\":{\"id\":\"" + id +
           "\",\"object\":\"charge\",\"status\":\"" + status +
           "\",\"amount_refunded\":0,\"metadata\":{\"billing_key\":\"" + key + "\"}}}}";
}

// Stripe's webhooks: at least once, in any order; some lost while faults last.
void world::emit_webhook(int idx) {
    const stripe_charge& ch = charges_[idx];
    std::string body = charge_event_json("evt_" + std::to_string(++seq_), "charge." + ch.status, now_, ch.id,
                                         ch.status, ch.billing_key);
    if (fault(0.1)) return;  // lost
    auto f = read_webhook(body);
    if (!f) return;
    int copies = fault(0.2) ? 2 : 1;
    for (int i = 0; i < copies; ++i)
        at(now_ + rnd_.range(0, faults_ ? 10 * minute : 2 * sec), [this, f] { receive_webhook(*f, false); });
}

// The receiver reads the body with the real parser (once per event: its copies are the same bytes).
std::optional<billing::payment_fact> world::read_webhook(const std::string& body) {
    auto f = billing::parse_event_fact(body);
    if (!f) {
        violation("webhook body unreadable: " + f.err().describe());
        return std::nullopt;
    }
    return std::move(*f);
}

// The webhook receiver: the row by charge id, else by metadata[billing_key]; a pending row's facts wait.
void world::receive_webhook(const billing::payment_fact& f, bool foreign) {
    note("webhook " + f.source + " " + f.charge_id);
    row* r = nullptr;
    for (auto& [k, x] : rows_)
        if (x.rec.charge_id && *x.rec.charge_id == f.charge_id) r = &x;
    if (!r) r = find_row(f.billing_key);
    if (!r || r->pending()) {
        stashed_[f.billing_key].emplace_back(f, foreign);
        return;
    }
    apply_to_row(*r, f, foreign);
}

void world::apply_to_row(row& r, const billing::payment_fact& fact, bool foreign) {
    billing::payment_fact f = fact;
    const auto before = r.settlement();
    if (!has(safeguard::same_payment)) {
        // A matcher that takes the key's metadata for the row's payment (no id comparison).
        if (r.rec.charge_id) f.charge_id = *r.rec.charge_id;
        if (r.payment_intent_id) f.payment_intent_id = *r.payment_intent_id;
    }
    auto c = billing::apply_fact(before, f);
    if (c.result != billing::settle_result::applied) return;
    if (foreign) violation("a fact about another payment changed row " + r.rec.key + " (" + f.source + ")");
    if (c.row.status != r.rec.status) set_status(r, c.row.status);
    r.rec.charge_id = c.row.charge_id;
    r.payment_intent_id = c.row.payment_intent_id;
    r.refunded_cents = c.row.refunded_cents;
    r.disputed_cents = c.row.disputed_cents;
    r.dispute_status = c.row.dispute_status;
    note("settled " + r.rec.key + " " + std::string(billing::to_string(r.rec.status)));
}

// The poll of rows left processing: each retrieved by its charge id and read as settlement reads it.
void world::poll() {
    for (auto& [k, r] : rows_) {
        if (r.rec.status != record_status::processing || now_ - r.processing_since < p_.poll_after) continue;
        if (fault(0.2) || !r.rec.charge_id) continue;  // the retrieve failed: next poll
        const stripe_charge* ch = nullptr;
        for (const auto& c : charges_)
            if (c.id == *r.rec.charge_id) ch = &c;
        if (!ch) {
            violation("row " + k + " names a charge Stripe does not have");
            continue;
        }
        billing::payment_fact f;
        f.kind = billing::fact_kind_for_charge_status(ch->status);
        f.source = "retrieve charge";
        f.charge_id = ch->id;
        f.billing_key = ch->billing_key;
        f.status = ch->status;
        f.created = now_ / 1000;
        apply_to_row(r, f, false);
    }
    // The poll runs while anything else may still happen, or a row still waits for it.
    bool waiting = !queue_.empty();
    for (const auto& [k, r] : rows_) waiting = waiting || r.rec.status == record_status::processing;
    if (waiting && now_ < cfg_.fault_ms + p_.horizon) at(now_ + p_.poll_every, [this] { poll(); });
}

// ---------------------------------------------------------------- nsqd

void world::publish(int event) {
    message m;
    m.event = event;
    m.body = billing::to_json(events_[event].ev);
    messages_.push_back(std::move(m));
    int id = static_cast<int>(messages_.size()) - 1;
    at(now_ + rnd_.range(1, 50), [this, id] { deliver(id); });
}

void world::deliver(int id) {
    message& m = messages_[id];
    if (m.done || m.inflight) return;
    std::vector<int> up;
    for (int i = 0; i < static_cast<int>(sidecars_.size()); ++i)
        if (sidecars_[i].up) up.push_back(i);
    if (up.empty()) {
        at(now_ + sec, [this, id] { deliver(id); });
        return;
    }
    int sc = up[rnd_.next() % up.size()];
    ++m.attempts;
    m.token = ++tokens_;
    m.inflight = true;
    m.timeout_at = now_ + p_.msg_timeout;
    ++result_.deliveries;
    delivery d;
    d.msg = id;
    d.token = m.token;
    d.sidecar = sc;
    d.incarnation = sidecars_[sc].incarnation;
    deliveries_.push_back(std::move(d));
    int did = static_cast<int>(deliveries_.size()) - 1;
    note("deliver m" + std::to_string(id) + " to s" + std::to_string(sc));
    at(m.timeout_at, [this, id, tok = m.token] { timeout_check(id, tok); });
    at(now_ + pg(), [this, did] { start(did); });
}

void world::timeout_check(int id, std::uint64_t token) {
    message& m = messages_[id];
    if (!m.inflight || m.token != token) return;
    if (now_ < m.timeout_at) {
        at(m.timeout_at, [this, id, token] { timeout_check(id, token); });
        return;
    }
    m.inflight = false;  // nsqd redelivers; the worker that had it may still be running
    ms_t held = fault(0.01) ? rnd_.range(24 * hour, 27 * hour) : 0;  // nsqd or the fleet down for a day
    at(now_ + held, [this, id] { deliver(id); });
}

void world::fin(const delivery& d) {
    message& m = messages_[d.msg];
    if (m.inflight && m.token == d.token) {
        m.inflight = false;
        m.done = true;
    }
}

void world::req(const delivery& d, ms_t delay) {
    message& m = messages_[d.msg];
    if (!m.inflight || m.token != d.token) return;
    m.inflight = false;
    ms_t held = fault(0.01) ? rnd_.range(24 * hour, 27 * hour) : 0;
    int id = d.msg;
    at(now_ + delay + held, [this, id] { deliver(id); });
}

void world::touch(const delivery& d) {
    message& m = messages_[d.msg];
    if (m.inflight && m.token == d.token && !fault(0.05)) m.timeout_at = now_ + p_.msg_timeout;
}

// ---------------------------------------------------------------- sidecars

bool world::alive(int id) {
    const delivery& d = deliveries_[id];
    const sidecar& s = sidecars_[d.sidecar];
    if (!s.up || s.incarnation != d.incarnation) return false;
    if (fault(0.008)) {  // the process dies between two steps
        crash(d.sidecar);
        return false;
    }
    return true;
}

void world::crash(int sc) {
    note("crash s" + std::to_string(sc));
    sidecars_[sc].up = false;
    ++sidecars_[sc].incarnation;
    at(now_ + rnd_.range(sec, 60 * sec), [this, sc] { sidecars_[sc].up = true; });
}

void world::start(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    message& m = messages_[d.msg];
    if (!m.parsed) {
        auto ev = billing::parse_event(m.body);
        if (!ev) {
            violation("a valid event did not parse: " + ev.err().describe());
            return fin(d);
        }
        m.parsed = std::move(*ev);
    }
    d.ev = *m.parsed;
    d.key = billing::base_key("sim", d.ev.customer_id, d.ev.billing_period, d.ev.stripe_account);
    if (!has(safeguard::write_before_call) && !find_row(d.key)) {
        d.row_written = false;  // Stripe first, the row after
        d.gen = 1;
        return call(id);
    }
    at(now_ + pg(), [this, id] { preflight(id); });
}

void world::preflight(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    if (insert(d)) {
        d.epoch = 1;
        d.gen = 1;
        note("insert " + d.key);
        return call(id);
    }
    decide(id, *find_row(d.key));
}

void world::decide(int id, const row& r) {
    delivery& d = deliveries_[id];
    const auto window = has(safeguard::same_key_window) ? std::chrono::seconds(billing::same_key_window)
                                                        : std::chrono::seconds(std::chrono::hours(24 * 365));
    auto act = billing::decide_existing(r.view(now_), d.ev, at_ms(now_), window);
    note("decide " + d.key + " " + std::string(billing::to_string(act)));
    switch (act) {
        case billing::existing_action::duplicate_finish:
            return fin(d);
        case billing::existing_action::payload_conflict:
            violation("payload conflict for an unchanged event");
            return fin(d);
        case billing::existing_action::lease_held_requeue: {
            auto v = r.view(now_);
            auto delay =
                billing::lease_held_requeue_delay(v.lease_remaining, std::chrono::milliseconds(p_.lease),
                                                  std::chrono::milliseconds(p_.lease_held_floor),
                                                  std::chrono::milliseconds(p_.max_requeue), rnd_.unit());
            return req(d, delay.count());
        }
        case billing::existing_action::recover_same_key:
        case billing::existing_action::recover_search:
            at(now_ + pg(), [this, id] { take_step(id); });
            return;
    }
}

void world::take_step(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    auto e = take(d.key);
    if (!e) return req(d, p_.retry_same_key_delay);  // requeued_lease_lost
    d.epoch = *e;
    const row& r = *find_row(d.key);
    d.gen = r.rec.key_generation;
    const auto window = has(safeguard::same_key_window) ? std::chrono::seconds(billing::same_key_window)
                                                        : std::chrono::seconds(std::chrono::hours(24 * 365));
    auto mode = billing::recovery_mode(r.view(now_), at_ms(now_), window);
    note("take " + d.key + " " + std::string(billing::to_string(mode)));
    if (mode == billing::existing_action::recover_same_key) {
        at(now_ + pg(), [this, id] { attempt_then_call(id); });
    } else if (has(safeguard::search_before_new_key)) {
        at(now_ + rnd_.range(50, 800), [this, id] { search(id); });
    } else {
        at(now_ + pg(), [this, id] { bump(id); });
    }
}

void world::attempt_then_call(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    auto a = attempt(d.key, d.epoch);
    if (!a) return req(d, p_.retry_same_key_delay);
    d.epoch = a->epoch;
    d.gen = a->gen;
    call(id);
}

void world::call(int id) {
    delivery& d = deliveries_[id];
    d.calling = true;
    int c = ++d.call;
    note("call " + billing::stripe_idempotency_key(d.key, d.gen));
    at(now_ + p_.renew, [this, id, c] { renew_tick(id, c); });
    send(id, c, 1);
}

// One request attempt of the client: it reaches Stripe (or not), Stripe runs it (maybe long after we gave up)
// and answers; the client waits client_timeout at most.
void world::send(int id, int c, int attempt) {
    delivery& d = deliveries_[id];
    request q;
    q.delivery = id;
    q.call = c;
    q.attempt = attempt;
    q.idempotency_key = billing::stripe_idempotency_key(d.key, d.gen);
    q.billing_key = d.key;
    q.amount = d.ev.amount_cents;
    q.event = messages_[d.msg].event;
    requests_.push_back(q);
    int rq = static_cast<int>(requests_.size()) - 1;
    // In a 429 storm the client's rate control holds each request back for a slot (minutes, under pressure).
    ms_t wait = now_ < storm_until_ ? rnd_.range(0, 4 * minute) : 0;
    at(now_ + wait, [this, id, c, attempt, rq] { transmit(id, c, attempt, rq); });
}

void world::transmit(int id, int c, int attempt, int rq) {
    const delivery& d = deliveries_[id];
    const sidecar& sc = sidecars_[d.sidecar];
    if (!sc.up || sc.incarnation != d.incarnation) return;  // the process died while the request waited
    if (fault(0.01)) {                                      // the connection failed before a byte was sent
        at(now_ + rnd_.range(1, 100), [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
        return;
    }
    // Stripe runs it at once, or (a stall) later, maybe after our client gave up on it.
    ms_t exec =
        now_ + (fault(0.03) ? rnd_.range(p_.client_timeout / 2, p_.max_late_execution) : rnd_.range(5, 300));
    at(exec, [this, rq] { stripe_execute(rq); });
    ms_t back = exec + rnd_.range(5, 200);
    if (back - now_ > p_.client_timeout)
        at(now_ + p_.client_timeout, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, true); });
    else
        at(back, [this, id, c, attempt, rq] { answered(id, c, attempt, rq, false); });
}

void world::answered(int id, int c, int attempt, int rq, bool timed_out) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    if (!alive(id)) return;
    const request& q = requests_[rq];
    stripe::charge_outcome out;
    out.attempts = static_cast<unsigned>(attempt);
    int charge = -1;
    if (timed_out) {
        out.cls = stripe::classify_transport_failure(true);
    } else if (q.http == 0) {
        out.cls = stripe::classify_transport_failure(false);
    } else {
        stripe::response_facts rf;
        rf.status = q.http;
        if (q.http == 402) rf.error_type = "card_error";
        if (q.http == 500) rf.error_type = "api_error";
        if (q.http == 429) rf.error_type = "rate_limit_error";
        out.cls = stripe::classify_response(rf);
        out.http_status = q.http;
    }
    if (out.cls == stripe::outcome_class::retry_same_key && attempt < p_.client_tries) {
        ms_t backoff = std::min<ms_t>(sec << (attempt - 1), 60 * sec);
        at(now_ + backoff, [this, id, c, attempt] { send(id, c, attempt + 1); });
        return;
    }
    if (!timed_out && (q.http == 200 || q.http == 402)) {
        // The create's 2xx body or its 402 (which names the failed charge), read as stripe/client.cpp reads
        // it: through the fact. The body is the one Stripe saved: the charge as it was when created.
        charge = q.charge;
        const stripe_charge& ch = charges_[charge];
        stripe::charge sc;
        sc.id = ch.id;
        sc.payment_method_type = ch.payment_method_type;
        sc.status = q.http == 402                                ? "failed"
                    : stripe::bank_debit(ch.payment_method_type) ? "pending"
                                                                 : "succeeded";
        out.charge_id = ch.id;
        auto f = stripe::read(sc);
        if (f.moved == stripe::movement::in_flight && has(safeguard::in_flight_not_charged))
            out.in_flight_status = sc.status;
    } else {
        charge = -1;
    }
    note("answer " + std::string(stripe::to_string(out.cls)) +
         (out.in_flight_status.empty() ? "" : " in flight"));
    d.calling = false;
    finish_call(id, out, charge);
}

void world::finish_call(int id, const stripe::charge_outcome& out, int charge) {
    delivery& d = deliveries_[id];
    if (!d.row_written) {
        // write_before_call removed: the row is written only now, its first attempt now.
        if (!insert(d)) return req(d, p_.retry_same_key_delay);
        d.row_written = true;
        d.epoch = 1;
    }
    auto step = billing::step_for(out);
    std::string ch = charge >= 0 ? charges_[charge].id : std::string();
    at(now_ + pg(), [this, id, step, ch] {
        if (!alive(id)) return;
        delivery& d = deliveries_[id];
        switch (step) {
            case billing::charge_step::mark_charged:
                settle(d.key, record_status::charged, ch);
                return fin(d);
            case billing::charge_step::mark_processing:
                settle(d.key, record_status::processing, ch);
                return fin(d);
            case billing::charge_step::mark_declined:
                settle(d.key, record_status::declined, ch);
                return fin(d);
            case billing::charge_step::release_requeue:
                release(d.key, d.epoch);
                return req(d, p_.retry_same_key_delay);
            case billing::charge_step::mark_indeterminate_requeue:
                indeterminate(d.key, d.epoch);
                return req(d, p_.indeterminate_delay);
            default:
                violation("an answer the simulated Stripe never gives: " +
                          std::string(billing::to_string(step)));
                return fin(d);
        }
    });
}

// RECOVER's search: the customer's charges carrying the key in metadata (recovery.cpp found_charge: the
// fact says what the charge did).
void world::search(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    if (fault(0.02)) {  // the list failed
        release(d.key, d.epoch);
        return req(d, p_.indeterminate_delay);
    }
    const row& r = *find_row(d.key);
    const stripe_charge* found = nullptr;
    for (auto it = charges_.rbegin(); it != charges_.rend(); ++it) {  // newest first, as Stripe lists
        const auto& c = *it;
        if (c.billing_key != d.key || c.visible_at > now_ || c.created < r.first_attempt - 24 * hour)
            continue;
        if (!found || (found->status == "failed" && c.status != "failed")) found = &c;
    }
    if (found && found->status == "failed" && found->created < r.first_attempt - 300 * sec) found = nullptr;
    if (!found) {
        note("search " + d.key + " none");
        at(now_ + pg(), [this, id] { bump(id); });
        return;
    }
    stripe::charge sc;
    sc.id = found->id;
    sc.status = found->status;
    sc.payment_method_type = found->payment_method_type;
    auto f = stripe::read(sc);
    note("search " + d.key + " found " + sc.id + " " + std::string(stripe::to_string(f.moved)));
    record_status s;
    if (f.moved == stripe::movement::in_flight || (f.moved == stripe::movement::failed && f.bank_debit))
        s = has(safeguard::in_flight_not_charged) || f.moved == stripe::movement::failed
                ? record_status::processing
                : record_status::charged;
    else if (f.moved == stripe::movement::failed)
        s = record_status::declined;
    else if (f.moved == stripe::movement::charged)
        s = record_status::charged;
    else
        return req(d, p_.indeterminate_delay);
    std::string ch = sc.id;
    at(now_ + pg(), [this, id, s, ch] {
        if (!alive(id)) return;
        delivery& d = deliveries_[id];
        settle(d.key, s, ch);
        fin(d);
    });
}

// A new key generation, once no call under the current one has shown life for the quiet period.
void world::bump(int id) {
    if (!alive(id)) return;
    delivery& d = deliveries_[id];
    row* r = find_row(d.key);
    if (!r || !r->pending() || r->epoch != d.epoch || r->rec.key_generation != d.gen)
        return req(d, p_.retry_same_key_delay);
    ms_t quiet = has(safeguard::quiet_period) ? p_.quiet : 0;
    ms_t life = r->last_life >= 0 ? r->last_life : r->first_attempt >= 0 ? r->first_attempt : now_ - quiet;
    ms_t wait = std::max<ms_t>(0, life + quiet - now_);
    if (wait > 0) {
        release(d.key, d.epoch);
        return req(d, std::min(wait, p_.max_requeue));
    }
    ++r->rec.key_generation;
    r->indeterminate_since = -1;
    d.gen = r->rec.key_generation;
    note("bump " + d.key + " g" + std::to_string(d.gen));
    at(now_ + pg(), [this, id] { attempt_then_call(id); });
}

// While a call is awaited: TOUCH the message and renew the lease; a worker whose lease was taken over keeps
// noting its call in flight.
void world::renew_tick(int id, int c) {
    delivery& d = deliveries_[id];
    if (d.call != c || !d.calling) return;
    const sidecar& s = sidecars_[d.sidecar];
    if (!s.up || s.incarnation != d.incarnation) return;
    touch(d);
    if (fault(0.02)) {
        // The connection to nsqd dropped: nsqd puts the message back at once; this worker carries on (its
        // FIN will be refused), and another sidecar gets the message.
        message& m = messages_[d.msg];
        if (m.inflight && m.token == d.token) {
            m.inflight = false;
            int msg = d.msg;
            at(now_ + rnd_.range(1, 500), [this, msg] { deliver(msg); });
        }
    }
    if (has(safeguard::lease_renewal) && d.row_written) {
        if (auto e = renew(d.key, d.epoch))
            d.epoch = *e;
        else
            in_flight_note(d.key, d.gen);
    }
    at(now_ + p_.renew, [this, id, c] { renew_tick(id, c); });
}

// ---------------------------------------------------------------- the run

void world::check_final() {
    for (int i = 0; i < static_cast<int>(events_.size()); ++i) {
        const auto& e = events_[i];
        const row* r = find_row(e.key);
        std::vector<const stripe_charge*> moved;
        for (const auto& c : charges_)
            if (c.billing_key == e.key && c.status != "failed") moved.push_back(&c);
        if (!r) {
            violation("event " + std::to_string(i) + " has no ledger row once faults stopped");
            continue;
        }
        using rs = record_status;
        const rs s = r->rec.status;
        if (s != rs::charged && s != rs::declined && s != rs::failed_after_processing) {
            violation("event " + std::to_string(i) +
                      " not final once faults stopped: " + std::string(billing::to_string(s)));
            continue;
        }
        if (s == rs::charged && (moved.size() != 1 || moved[0]->id != r->rec.charge_id.value_or("") ||
                                 moved[0]->status != "succeeded"))
            violation("ledger != Stripe: " + e.key + " charged " + r->rec.charge_id.value_or("?") +
                      ", Stripe has " + std::to_string(moved.size()) + " payment(s)" +
                      (moved.empty() ? "" : " (" + moved[0]->id + " " + moved[0]->status + ")"));
        if (s != rs::charged && !moved.empty())
            violation("ledger != Stripe: " + e.key + " " + std::string(billing::to_string(s)) +
                      ", Stripe has " + moved[0]->id + " " + moved[0]->status);
    }
    for (std::size_t i = 0; i < messages_.size(); ++i)
        if (!messages_[i].done) violation("message m" + std::to_string(i) + " never finished");
}

run_result world::run() {
    sidecars_.resize(static_cast<std::size_t>(cfg_.sidecars));
    for (int i = 0; i < cfg_.events; ++i) {
        event_spec e;
        e.ev.customer_id = "cust" + std::to_string(i);
        e.ev.billing_period = "2026-11";
        e.ev.amount_cents = 100 + static_cast<std::int64_t>(rnd_.next() % 10'000);
        e.ev.currency = "usd";
        e.ev.stripe_customer_id = "cus_" + std::to_string(i);
        e.key = billing::base_key("sim", e.ev.customer_id, e.ev.billing_period);
        e.declines = rnd_.chance(0.1);
        e.debit = !e.declines && rnd_.chance(0.2);
        events_.push_back(std::move(e));
    }
    for (int i = 0; i < cfg_.events; ++i) {
        ms_t t = rnd_.range(0, cfg_.fault_ms / 2);
        at(t, [this, i] { publish(i); });
        if (rnd_.chance(0.2))  // the producer publishes it again (re-publication, `reconcile`)
            at(rnd_.range(t, cfg_.fault_ms), [this, i] { publish(i); });
    }
    // Faults of the world beside the flow: foreign webhooks, 429 storms, crashes of idle sidecars.
    for (ms_t t = 0; t < cfg_.fault_ms; t += rnd_.range(5 * minute, 40 * minute)) {
        at(t, [this] {
            if (!faults_) return;
            int i = static_cast<int>(rnd_.next() % events_.size());
            bool ok = rnd_.chance(0.5);
            const std::string n = std::to_string(++seq_);
            std::string body =
                charge_event_json("evt_f" + n, ok ? "charge.succeeded" : "charge.failed", now_,
                                  "ch_foreign" + n, ok ? "succeeded" : "failed", events_[i].key);
            if (auto f = read_webhook(body)) receive_webhook(*f, true);
        });
        if (rnd_.chance(0.1)) at(t, [this] { storm_until_ = now_ + rnd_.range(2 * minute, 10 * minute); });
    }
    at(cfg_.fault_ms, [this] {
        faults_ = false;
        storm_until_ = -1;
        note("faults stop");
    });
    at(p_.poll_every, [this] { poll(); });
    const ms_t end = cfg_.fault_ms + p_.horizon;
    while (!queue_.empty()) {
        action a = queue_.top();
        queue_.pop();
        if (a.at > end) break;
        now_ = std::max(now_, a.at);
        ++result_.steps;
        a.fn();
    }
    now_ = end;
    check_final();
    result_.digest = digest_;
    return std::move(result_);
}

}  // namespace

run_result run(const config& c) {
    world w(c);
    return w.run();
}

}  // namespace cg::sim
