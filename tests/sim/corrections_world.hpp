// The correction simulator's world (corrections.cpp: the deliveries, the process, the revision fsm's driver
// and the call with its lease renewals; corrections_ledger.cpp: the corrections ledger's statements;
// corrections_stripe.cpp: Stripe's create, answer and search, and the final checks).
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "billing/machine/key.hpp"
#include "billing/machine/machine.hpp"
#include "billing/machine/revision_fsm.hpp"
#include "models.hpp"
#include "sim.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"

namespace cg::sim::corrections_world {

using billing::machine::table;

struct move_row {
    std::string status = "pending";
    bool refund = true;
    std::int64_t amount = 0;
    std::int32_t gen = 1;
    ms_t first_attempt = -1;
    ms_t indeterminate_since = -1;
    ms_t last_life = -1;  // last_stripe_attempt_at
    std::string object_id;
};

struct revision_row {
    std::string status = "waiting";
    ms_t lease_until = -1;
    std::int64_t epoch = 0;
    std::optional<move_row> move;
};

struct period {
    std::string base;
    std::string charge_id;  // the original charge, charged
    std::int64_t original = 0;
    std::int64_t total = 0;     // revision 1's total
    billing::billing_event ev;  // revision 1, as its delivery parses it
    std::optional<revision_row> rev;
};

struct object {  // a refund or an extra charge at Stripe
    std::string id;
    std::string move_key;  // metadata[billing_key]
    bool refund = true;
    std::int64_t amount = 0;
    std::string status;
    ms_t visible_at = 0;  // listed from then on (list lag)
    int period = 0;
};

struct saved_answer {
    int http = 0;
    int obj = -1;
    ms_t at = 0;
};

struct msg {
    int period = 0;
    std::uint64_t token = 0;
    bool inflight = false;
    bool done = false;
    ms_t timeout_at = 0;
};

struct dlv {
    int m = 0;
    std::uint64_t token = 0;
    int sc = 0;
    std::uint64_t inc = 0;
    int call = 0;
    bool calling = false;
    std::optional<billing::machine::revision_fsm> fsm;  // the delivery's machine, as corrections.cpp runs it
    billing::machine::revision_command pending;         // its command awaiting the ledger or the search
};

struct req_t {  // a create as the fsm built it
    int d = 0;
    int call = 0;
    std::string idem;
    std::string move_key;  // metadata[billing_key]
    bool refund = true;
    std::int64_t amount = 0;
    int http = 0;  // 0: not executed (yet)
    int obj = -1;
};

struct act {
    ms_t at;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const act& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

constexpr ms_t lease = 60 * sec, renew_every = 15 * sec, msg_timeout = 60 * sec, client_timeout = 30 * sec;
constexpr ms_t quiet = 300 * sec, max_late = 240 * sec, idem_ttl = 24 * hour, window = 23 * hour;

class cworld {
  public:
    explicit cworld(const config& c);

    run_result run();

  private:
    bool has(safeguard s) const { return std::find(removed_.begin(), removed_.end(), s) == removed_.end(); }
    void at(ms_t t, std::function<void()> fn) { q_.push({t, ++seq_, std::move(fn)}); }
    bool fault(double p) { return faults_ && rnd_.chance(p); }
    ms_t pg() { return rnd_.range(1, 20); }
    void note(const std::string& what) {
        for (unsigned char ch : what) digest_ = (digest_ ^ ch) * 0x100000001b3ULL;
        digest_ = (digest_ ^ static_cast<std::uint64_t>(now_)) * 0x100000001b3ULL;
        if (cfg_.trace) res_.schedule.push_back(std::to_string(now_) + " " + what);
    }
    void violation(const std::string& what) {
        note("VIOLATION " + what);
        if (res_.violations.size() < 20)
            res_.violations.push_back("t=" + std::to_string(now_) + "ms " + what);
    }
    std::string move_key(int p) const { return periods_[p].base + "-r1"; }

    // States move only along the money machine's table.
    void set_rev(revision_row& r, const std::string& to) {
        if (!billing::machine::allowed(table::revision, r.status, to))
            violation("state order: revision " + r.status + " -> " + to);
        r.status = to;
    }
    void set_move(move_row& m, const std::string& to) {
        if (!billing::machine::allowed(table::move, m.status, to))
            violation("state order: move " + m.status + " -> " + to);
        m.status = to;
    }

    // ---- nsqd ----
    void publish(int p);
    void deliver(int m);
    void timeout_check(int m, std::uint64_t tok);
    bool owns(const dlv& d) const { return msgs_[d.m].inflight && msgs_[d.m].token == d.token; }
    void fin(const dlv& d);
    void req(const dlv& d, ms_t delay);
    void touch(const dlv& d);

    // ---- the process ----
    bool alive(int id);

    // ---- the revision fsm's driver (billing::corrections) ----
    billing::machine::flow_config fsm_config() const;
    void start(int id);
    void resume(int id, const billing::machine::revision_input& i);
    void exec(int id, billing::machine::revision_command c);
    revision_row& rev_of(const dlv& d) { return *periods_[msgs_[d.m].period].rev; }
    // ---- the corrections ledger's statements (correction_ledger.cpp, migration 0018's admit) ----
    billing::machine::revision_input statement(int id, const billing::machine::revision_command& c);
    billing::machine::revision_input admit(int id);
    std::vector<billing::machine::move_view> moves(const dlv& d) const;
    void release(revision_row& r, std::int64_t epoch);
    void call(int id, const billing::machine::revision_command& c);
    void renew_tick(int id, int c);

    // ---- Stripe ----
    void execute(int rq);
    void answered(int rq, bool timed_out);

    // The search by metadata[billing_key] (correction ledger's search_move): what the lists show.
    billing::machine::revision_input search(int id, const billing::machine::revision_command& c);

    void check_final();

    config cfg_;
    rng rnd_;
    std::vector<safeguard> removed_;
    billing::machine::flow_config fsm_cfg_;
    run_result res_;
    bool faults_ = true;
    ms_t now_ = 0;
    std::uint64_t seq_ = 0, tokens_ = 0;
    std::uint64_t digest_ = 0xcbf29ce484222325ULL;
    std::priority_queue<act, std::vector<act>, std::greater<>> q_;
    std::vector<std::pair<bool, std::uint64_t>> sidecars_;  // up, incarnation
    std::vector<period> periods_;
    std::vector<object> objects_;
    std::unordered_map<std::string, saved_answer> saved_;
    std::vector<msg> msgs_;
    std::vector<dlv> dlvs_;
    std::vector<req_t> reqs_;
};

}  // namespace cg::sim::corrections_world
