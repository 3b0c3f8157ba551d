// What the rate_control tests share (rate_control_test.cpp, rate_control_sharing_test.cpp,
// rate_control_peers_test.cpp, rate_control_calibration_test.cpp): simulated time from t0, a caller with
// unbounded demand, a server-side token bucket, and sidecars exchanging their pacing state. No I/O.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "stripe/rate_control.hpp"

using namespace cg::stripe;
using namespace std::chrono_literals;
using tp = rate_control::time_point;

namespace {

const tp t0{std::chrono::seconds(1000)};

// Admissions in [from, from + span) when asking every `step` (a caller with unbounded demand).
inline int admitted(rate_control& rc, tp from, std::chrono::milliseconds span,
                    std::chrono::microseconds step = 100us) {
    int n = 0;
    for (auto t = from; t < from + span; t += step)
        while (rc.try_take(t)) ++n;
    return n;
}

// A server-side token bucket like fake-stripe's: `rate` per second, `burst` deep.
struct server_bucket {
    double rate, burst, tokens;
    tp last;
    bool take(tp now) {
        tokens = std::min(burst, tokens + std::chrono::duration<double>(now - last).count() * rate);
        last = now;
        if (tokens < 1) return false;
        tokens -= 1;
        return true;
    }
    // A new rate while running, the bucket one second deep and keeping its tokens (fake-stripe's limiter).
    void set(double r, tp now) {
        tokens = std::min(burst, tokens + std::chrono::duration<double>(now - last).count() * rate);
        last = now;
        rate = r;
        burst = r;
        tokens = std::min(tokens, burst);
    }
};

// Sidecars sharing their state every `exchange` (each at its own phase, reading the others' last rows: the
// peer table's delay), as billing::pace_peers does; a zero `exchange` shares nothing.
struct peer_exchange {
    std::chrono::milliseconds every{0};
    struct row {
        peer_load load;
        std::uint64_t episodes = 0;
        double account_limit = 0;
    };
    std::vector<row> rows;
    std::vector<std::vector<std::uint64_t>> seen;  // seen[i][j]: j's episodes as i last read them
    void init(int n) {
        rows.assign(n, {});
        seen.assign(n, std::vector<std::uint64_t>(n, 0));
    }
    void tick(std::vector<rate_control>& rcs, tp t, tp t_start) {
        if (every.count() == 0) return;
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - t_start).count();
        int n = static_cast<int>(rcs.size());
        for (int i = 0; i < n; ++i) {
            if ((ms + i * every.count() / n) % every.count() != 0) continue;
            auto& rc = rcs[i];
            rows[i] = {{rc.take_pressed(), rc.own_sent_rate(t)}, rc.throttled_episodes(), rc.account_limit()};
            std::vector<peer_view> views;
            for (int j = 0; j < n; ++j) {
                views.push_back({rows[j].load, rows[j].account_limit, rows[j].episodes > seen[i][j]});
                seen[i][j] = rows[j].episodes;
            }
            apply_peers(rc, views.data(), views.size(), static_cast<std::size_t>(i), t);
        }
    }
};

// Stripe's limiter as fake-stripe plays it (tests/doubles/stripe/limiter.hpp): one endpoint at `rate`, its

}  // namespace
