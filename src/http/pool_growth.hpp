// When a connection pool may open one more connection to its origin. Pure (no clock of its own, no I/O):
// the client feeds it the time each exchange took on its connection and asks before every connect.
//
// Up to `eager` connections a pool opens one whenever a request finds none idle. Past that it
// opens another only when Little's law says the origin could use it: while the pool is smaller than
// `headroom` × (answers per second) × (the fastest exchange of the last one or two `window`s) — the
// connections the current rate would need if every answer came as fast as the fastest, with room for the
// rate to grow fourfold per round trip while the pool is what limits it — and while the recent exchange time
// (an exponential average, and the last exchange too) is within `ratio` × that fastest one plus `slack`. And
// only as fast as paced answers come in: each grants `per_answer` connections (at most `max_credit` banked),
// so the pool at most quadruples per round trip (like TCP's slow start), instead of opening a connection per
// waiting request before the answers on the new connections show whether the origin kept its pace.
//
// An origin that answers slowly but steadily (every answer about as slow as the fastest, and the rate grows
// with the pool) keeps getting connections, because more of them mean more answers per second. A fast
// origin does not (a handful of connections carries its rate), nor one whose answers slow down as requests
// pile up (saturated, or our own CPU is): more connections would only add TLS handshakes, buffers and
// queueing on both sides, and a pool grown past what the origin's pace needs charges less per second, not
// more (docs/benchmarks/pipeline.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace cg::http {

struct pool_growth_config {
    // Connections opened on demand, whatever the origin's pace (SIZE_MAX: the rule never applies; 0 counts
    // as 1, so a pool can always open its first connection).
    std::size_t eager = std::numeric_limits<std::size_t>::max();
    // Past `eager`: the pool may be at most headroom × rate × fastest, and the recent exchange time at most
    // ratio × fastest + slack.
    double headroom = 4.0;
    double ratio = 2.0;
    std::chrono::steady_clock::duration slack = std::chrono::milliseconds(1);
    // The fastest exchange is the minimum over the current and the previous window.
    std::chrono::steady_clock::duration window = std::chrono::seconds(10);
    // Connections past `eager` each paced answer allows, and how many may be banked.
    unsigned per_answer = 3;
    unsigned max_credit = 16;
};

class pool_growth {
  public:
    using clock = std::chrono::steady_clock;

    explicit pool_growth(pool_growth_config c = {}) : c_(c) {}

    // A request was written and its response read on a connection in `took`, ending at `now`.
    void exchanged(clock::duration took, clock::time_point now);
    // May a pool with `open` connections (idle, busy and connecting) open one more? Past `eager`: only under
    // the rule above (never before an exchange was seen in the last two windows) and with a credit left.
    // try_open() takes the credit: call it only when the connection will be opened.
    bool may_open(std::size_t open, clock::time_point now) const;
    bool try_open(std::size_t open, clock::time_point now);

    // Readouts (zero before the first exchange).
    clock::duration recent() const { return clock::duration(static_cast<clock::rep>(ewma_)); }
    clock::duration fastest() const;
    // Answers per second over the current rate bucket and the one before (each max(100 ms, fastest) long).
    double rate(clock::time_point now) const;
    // headroom × rate × fastest: the connections Little's law would give the origin now.
    double wanted(clock::time_point now) const;
    const pool_growth_config& config() const { return c_; }

  private:
    bool stale(clock::time_point now) const;  // no exchange seen, or none for two windows
    bool eager(std::size_t open) const;       // still below the eager size (at least one connection)
    bool paced(clock::time_point now) const;
    bool room(std::size_t open, clock::time_point now) const;

    pool_growth_config c_;
    bool seen_ = false;
    unsigned credit_ = 0;
    double ewma_ = 0;  // clock ticks
    clock::rep last_ = 0;
    clock::rep min_cur_ = std::numeric_limits<clock::rep>::max();
    clock::rep min_prev_ = std::numeric_limits<clock::rep>::max();
    clock::time_point window_start_{};
    // Answers counted in the current and the previous rate bucket.
    std::uint64_t n_cur_ = 0, n_prev_ = 0;
    clock::time_point bucket_start_{}, prev_start_{};
    clock::duration bucket_len_{};
};

}  // namespace cg::http
