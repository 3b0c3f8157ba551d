// Client-side rate control for Stripe calls, needing no coordination between processes. Pure:
// time is passed in, no clock, no I/O; the client drives it (stripe/pacer.hpp) and the tests table-drive it.
//
// Two limits, the lower wins:
// - a hard ceiling (`max_rps`, --stripe-max-rps) this process never exceeds;
// - an adaptive limit (AIMD): it starts at `initial_rps` and doubles every `slow_start_step` while demand
//   presses on it (slow start, so a cold start of several sidecars is not one burst of 429s; initial_rps 0
//   starts unlimited), until Stripe answers 429; then the rate Stripe was
//   actually accepting from this process (answers without a 429, never more than it sent) times
//   `decrease_factor`, at most once per `decrease_hold` (one overload episode is
//   one decrease, however many 429s it produced); between 429s it probes upward by `increase_rps_per_s`
//   for every second of answers without one. The limit only grows while demand presses on it (a request
//   had to wait): an idle process does not wake up with a limit it never tried. Sidecars sharing one Stripe
//   account each see the account's 429s and converge on a share of its limit without talking to each other.
// The defaults were chosen by simulation (tests/unit/stripe/rate_control_test.cpp: several sidecars against
// one account's limit, with and without Stripe latency; the test states the bounds it holds them to).
// Admission is a token bucket refilled at the current limit holding `burst_s` seconds of it (at least one
// token), so pacing stays smooth and a lowered limit takes effect at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace cg::stripe {

struct rate_config {
    double max_rps = 0;                             // hard ceiling; 0: none
    bool adaptive = true;                           // AIMD on 429
    double increase_rps_per_s = 0.2;                // additive probe, per second without a 429
    double decrease_factor = 0.7;                   // multiplicative back-off on a 429
    std::chrono::milliseconds decrease_hold{1000};  // at most one decrease per hold
    double min_rps = 1;                             // the adaptive limit never goes below
    double initial_rps = 10;                        // slow start from here (0: unlimited until the first 429)
    std::chrono::milliseconds slow_start_step{250};  // doubling period of the slow start
    double burst_s = 0.05;                           // bucket size, in seconds of the current limit
};

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
    // An answer arrived: `throttled` for a 429. Drives the adaptive limit.
    void on_response(time_point now, bool throttled);

    // The limit in force (requests/s), `unlimited` when nothing limits.
    double limit() const noexcept;
    bool in_slow_start() const noexcept { return slow_start_; }
    // Requests/s this process sent lately, and answers/s without a 429 (the last full second, else the
    // current partial one, at least 100 ms long).
    double sent_rate(time_point now) const noexcept { return sent_.rate(now); }
    double accepted_rate(time_point now) const noexcept { return accepted_.rate(now); }
    std::uint64_t decreases() const noexcept { return decreases_; }
    const rate_config& config() const noexcept { return cfg_; }

  private:
    // Events per second over one-second windows.
    struct rate_window {
        time_point start;
        std::uint64_t count = 0;
        double last = -1;  // -1: no full window yet
        void add(time_point now);
        double rate(time_point now) const noexcept;
    };
    void refill(time_point now);

    rate_config cfg_;
    double adaptive_ = unlimited;
    bool slow_start_ = false;
    bool pressed_ = false;  // a request had to wait since the limit last grew
    double tokens_ = 1;
    time_point refilled_;
    time_point last_decrease_{};
    bool decreased_once_ = false;
    time_point last_increase_;
    rate_window sent_, accepted_;
    std::uint64_t decreases_ = 0;
};

}  // namespace cg::stripe
