// Client-side rate control for Stripe calls, needing no coordination between processes. Pure:
// time is passed in, no clock, no I/O; the client drives it (stripe/pacer.hpp) and the tests table-drive it.
//
// Two limits, the lower wins:
// - a hard ceiling (`max_rps`, --stripe-max-rps) this process never exceeds;
// - an adaptive limit driven by 429s, Stripe's only signal (it sends no rate-limit headers and no
//   Retry-After on a 429). It starts at `initial_rps` and doubles every `slow_start_step` while demand
//   presses on it (slow start, so a cold start of several sidecars is not one burst of 429s; initial_rps 0
//   starts unlimited). The first 429 ends it at `slow_start_exit` × the rate accepted lately (inflated by
//   the drain of Stripe's full bucket and the doubling's overshoot), from where the limit grows as
//   e^(calibrate_growth · t) until the next 429 measures the rate.
//   A 429 episode (at most one per `decrease_hold`, however many 429s it produced; a 429 to a request sent
//   after the decrease is a new episode) sets the *estimate*: Stripe's bucket is empty at a 429, so the
//   rate it accepted from this process since the episode before (at least `long_cycle` earlier) is its
//   rate; episodes close together (a lowered limit) are measured from the first of the run once it is
//   `run_min` long and something was accepted in it (until then the first dip holds: a bucket refilled in
//   whole tokens once a second accepts nothing between two ticks), found within about a second; otherwise
//   the last second, bounded by what was sent. A 429 while not probing (the
//   limit at or below the estimate: another sender's probe) lowers the estimate by at most `victim_step`.
//   The limit drops to `decrease_factor` × the estimate and climbs back to it in `recover` (linearly), then
//   probes past it: `increase_rps_per_s` per second plus `probe_growth` × estimate × t² (t: seconds past
//   the estimate), slow just above the rate that was last too much and faster the longer no 429 says so.
//   Stripe's limit is a token bucket of a depth and refill that cannot be seen from outside: a deep one
//   keeps what the dip leaves unsent for the climb above the estimate to spend, a shallow one (or one
//   refilled in whole tokens every second) loses it, so the dip is shallow and short and the probe slow,
//   which keeps the 429s rare. When the calibration's 429 came well above what it measured
//   (`fast_probe_above`: the bucket overflowed while the limit climbed from below), the probe also climbs
//   linearly back to that 429's limit in `fast_probe`.
//   The highest estimate of the last `recall` is remembered. While the estimate is below `reclaim_below` ×
//   that (a limit Stripe lowered), the limit holds at `reclaim_hold_factor` × the estimate for
//   1 / (`reclaim_budget` × estimate) seconds, so these attempts cost about `reclaim_budget` of the
//   requests in 429s, then climbs to the remembered rate in `reclaim` and past it by `regrow` × it per
//   second: a limit raised back is found within a few seconds, one raised above anything seen within the
//   last `recall` at the slow probe's pace.
//   An episode that comes while demand did not reach the limit within `decrease_hold` before it (an injected
//   or transient 429, another sender, a limit lowered below the demand) was not this process's rate emptying
//   Stripe's bucket: the limit drops as for any other, then doubles back under pressure as in the slow start
//   (`rebound`) until the next 429 measures the rate.
//   The limit only moves while demand presses on it (a request had to wait): an idle process does not wake
//   up with a limit it never tried. Sidecars sharing one Stripe account converge on shares of its limit
//   without talking to each other; a 429 reaches one of them, not always the one probing, so N sidecars
//   draw more 429s than one.
// The defaults were chosen by simulation (tests/unit/stripe/rate_control_test.cpp: one and three sidecars
// against one account's limit, steady and changing, against buckets 0.2–2 s deep refilled continuously or
// in whole tokens every 100 ms or 1 s; the test states the bounds it holds them to).
// Admission is a token bucket refilled at the current limit holding `burst_s` seconds of it (at least one
// token), so pacing stays smooth and a lowered limit takes effect at once.
//
// Shared pacing: sidecars that know each other (billing/flow/pace_peers.hpp) run the law above once for the
// account instead of one loop each fighting the others. One peer leads: it runs the law for the account's
// limit, admits `share` of it (set_share) and counts each of its own answers as 1 / share of the account's
// (so what it measures is the account's rate); the 429 episodes of the others reach it (on_peer_throttled)
// and their demand lets it grow (note_peer_pressed). The others follow its limit (follow) and admit their
// own share of it; a follower within `decrease_hold` of its own 429 keeps its decrease unless the leader's
// figure is lower. The account's floor is `min_rps` for each peer (set_peers), as N sidecars pacing alone
// never go below N × min_rps together: after a storm of 429s the probe climbs back from there as fast as
// theirs. The account probes and backs off as one sidecar would, with one sidecar's 429 share.
// Share 1 and leading (the default, no peers) is the law above unchanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace cg::stripe {

struct rate_config {
    double max_rps = 0;                             // hard ceiling; 0: none
    bool adaptive = true;                           // AIMD on 429
    double increase_rps_per_s = 0;                  // linear part of the probe past the estimate, per second
    double decrease_factor = 0.93;                  // the limit after a 429 episode, × the estimate
    std::chrono::milliseconds decrease_hold{1000};  // at most one decrease per hold
    std::chrono::milliseconds recover{2000};        // from the decreased limit back to the estimate
    double probe_growth = 0.0005;                   // quadratic part of the probe, × estimate per s²
    double min_rps = 1;                             // the adaptive limit never goes below
    double initial_rps = 10;                        // slow start from here (0: unlimited until the first 429)
    std::chrono::milliseconds slow_start_step{250};  // doubling period of the slow start
    double burst_s = 0.05;                           // bucket size, in seconds of the current limit
    double slow_start_exit = 0.5;   // the first 429 ends the slow start at this × the accepted rate
    double calibrate_growth = 0.3;  // then the limit grows by e^(this × seconds) until a 429
    std::chrono::milliseconds recall{60000};  // how long the highest recent estimate is remembered
    std::chrono::milliseconds reclaim{1500};  // from the estimate back up to the remembered one
    double reclaim_below = 0.9;               // reclaim when the estimate is below this × the remembered one
    double reclaim_hold_factor = 0.99;        // between attempts the limit holds at this × the estimate
    double reclaim_budget = 0.03;             // attempts spend at most this share of the requests as 429s
    std::chrono::milliseconds long_cycle{2000};  // 429s this far apart: the rate between them
    std::chrono::milliseconds run_min{700};      // a run of close episodes this long measures the rate
    double victim_step = 0.05;       // a 429 while not probing lowers the estimate at most by this
    double regrow = 0.2;             // past the remembered rate: + this × it per second
    double fast_probe_above = 1.15;  // a calibration's 429 this far above its estimate: probe faster,
    std::chrono::milliseconds fast_probe{5000};  // back to the limit of that 429 in this (linearly)
    bool rebound = true;  // an episode while demand did not reach the limit: double back under pressure
};

// What a peer sharing an account says of itself (billing/flow/pace_peers.hpp carries it between processes).
struct peer_load {
    bool pressed = false;  // a request of its had to wait lately (it could send more)
    double sent_rps = 0;   // what it sent lately, requests/s
};
// The share of the account's rate for `peers[self]`: peers whose demand reaches their admission weigh 1;
// one sending less weighs what it uses of an even split of `account_limit` (at least `idle_weight`), so
// what an idle peer leaves goes to those with a backlog. Even shares when the limit is not finite.
double peer_share(const peer_load* peers, std::size_t n, std::size_t self, double account_limit,
                  double idle_weight = 0.02);

class rate_control {
  public:
    using clock = std::chrono::steady_clock;
    using time_point = clock::time_point;
    static constexpr double unlimited = std::numeric_limits<double>::infinity();

    explicit rate_control(rate_config cfg, time_point now);

    // Takes one token if there is one (the request may go now). Counts it as sent.
    bool try_take(time_point now);
    // How long until a token will be there at the current limit (zero when one is there now).
    clock::duration until_next(time_point now);
    // An answer arrived: `throttled` for a 429. Drives the adaptive limit. `sent_at`: when its request was
    // admitted, if known (a 429 to a request sent after the last decrease decreases again at once; unknown,
    // it counts as sent before).
    void on_response(time_point now, bool throttled, time_point sent_at = {});
    // This process's share of the account's rate (0 < share ≤ 1; 1 without peers). Takes effect at once.
    void set_share(double share, time_point now);
    double share() const noexcept { return share_; }
    // How many processes share the account (1 without peers): the account's limit never goes below min_rps
    // for each, as N sidecars pacing alone never go below N × min_rps together.
    void set_peers(std::size_t n) noexcept;
    // A peer sharing the account had a 429 episode: decrease as if it were ours, unless ours came within
    // `decrease_hold` (the same episode). Only while leading.
    void on_peer_throttled(time_point now);
    // A peer's demand reaches its admission: the account's limit may grow (the leader's own demand may not).
    void note_peer_pressed(time_point now) noexcept {
        pressed_ = true;
        pressed_at_ = now;
        pressed_seen_ = true;
    }
    // Follow the account's limit the leading peer runs the law for (its own 429s still decrease at once, and
    // the leader's figure is ignored for `decrease_hold` after one, until the leader has heard of it).
    void follow(double account_limit, time_point now);
    // Run the law for the account (again): from a followed limit, it continues probing from there.
    void lead(time_point now);
    bool following() const noexcept { return following_; }
    // 429 episodes started by this process's own 429s (what peers hear of; a decrease a peer's episode
    // caused is not repeated back to it).
    std::uint64_t throttled_episodes() const noexcept { return own_episodes_; }
    // A request had to wait since the last call (demand reached this process's admission).
    bool take_pressed() noexcept {
        bool p = pressed_since_;
        pressed_since_ = false;
        return p;
    }
    // The account-wide limit the law is at (limit() is this process's part of it).
    double account_limit() const noexcept { return adaptive_; }
    // Requests/s this process itself sent lately (not weighted).
    double own_sent_rate(time_point now) const noexcept { return own_sent_.rate(now); }

    // The limit in force for this process (requests/s: its share of the account's), `unlimited` when
    // nothing limits.
    double limit() const noexcept;
    bool in_slow_start() const noexcept { return slow_start_; }
    // Doubling back after a 429 episode that came while demand did not reach the limit (until the next one).
    bool rebounding() const noexcept { return rebound_; }
    // Requests/s this process sent lately, and answers/s without a 429 (the last full second, else the
    // current partial one, at least 100 ms long), counted in the account's terms (each as 1 / share).
    double sent_rate(time_point now) const noexcept { return sent_.rate(now); }
    double accepted_rate(time_point now) const noexcept { return accepted_.rate(now); }
    // The rate the last 429 episode said was Stripe's share for this process (0 before the first one).
    double estimate() const noexcept { return estimate_; }
    // The highest estimate of the last `recall` (0 before the first long enough cycle).
    double recalled() const noexcept { return recalled_; }
    std::uint64_t decreases() const noexcept { return decreases_; }
    const rate_config& config() const noexcept { return cfg_; }

  private:
    // Events per second over one-second windows.
    struct rate_window {
        time_point start;
        double count = 0;
        double last = -1;  // -1: no full window yet
        void add(time_point now, double weight);
        double rate(time_point now) const noexcept;
    };
    // Counts over the last second in 100 ms bins (the decrease reads what Stripe accepted lately).
    struct recent {
        static constexpr int bins = 10;
        std::int64_t bin_of_[bins] = {};
        double count_[bins] = {};
        std::int64_t first_bin = -1;  // the first bin ever counted
        void add(time_point now, double weight);
        double rate(time_point now) const noexcept;  // per second over the last second (or since the first)
    };
    void refill(time_point now);
    void decrease(time_point now);
    void grow(time_point now);

    rate_config cfg_;
    double adaptive_ = unlimited;
    bool slow_start_ = false;
    bool pressed_ = false;      // a request had to wait since the limit last grew
    bool calibrating_ = false;  // since the slow start ended, until the next 429
    bool reclaiming_ = false;   // the last estimate was well below the remembered one
    bool rebound_ = false;      // the last episode came while demand did not reach the limit
    double fast_probe_to_ = 0;  // the limit at the calibration's 429, when well above its estimate
    time_point pressed_at_{};   // when demand last reached the limit (this process's, or a peer's)
    bool pressed_seen_ = false;
    double tokens_ = 1;
    time_point refilled_;
    time_point last_decrease_{};
    bool decreased_once_ = false;
    time_point last_increase_;
    double estimate_ = 0;
    double recalled_ = 0;        // the highest estimate of the last `recall`
    time_point recalled_at_{};   // when an estimate last came within reach of it
    double curve_s_ = 0;         // seconds of pressed demand since the last decrease
    double dip_from_ = 0;        // the limit right after the last decrease
    double accepted_since_ = 0;  // answers without a 429 since the last decrease (weighted)
    time_point run_from_{};      // the first of the last run of close episodes
    double run_accepted_ = 0;    // answers without a 429 since then (weighted)
    double share_ = 1;
    double floor_ = 0;  // the account's lowest limit: min_rps × peers
    bool following_ = false;
    bool pressed_since_ = false;  // for take_pressed()
    std::uint64_t own_episodes_ = 0;
    rate_window sent_, accepted_, own_sent_;
    recent recent_sent_, recent_accepted_;
    std::uint64_t decreases_ = 0;
};

// What one process's pacer of an account tells its peers.
struct pacer_report {
    peer_load load;
    double account_limit = 0;    // the account's limit its law is at
    std::uint64_t episodes = 0;  // 429 episodes started by its own 429s
};

// One peer of an account as an exchange read it (billing/flow/pace_peers.hpp).
struct peer_view {
    peer_load load;
    double account_limit = 0;      // the limit its law is at (what followers take from the leader)
    bool throttled_since = false;  // it had a 429 episode of its own since this process last read it
};
// Applies one exchange to `rc`: `peers` are the account's live peers in one fixed order (by id) that every
// peer sees, `self` this process among them. The first peer whose demand reaches its admission leads (the
// first of all when none does); this process takes its share (peer_share) and either leads (hearing the
// others' 429 episodes and demand) or follows the leader's limit.
void apply_peers(rate_control& rc, const peer_view* peers, std::size_t n, std::size_t self,
                 rate_control::time_point now);

}  // namespace cg::stripe
