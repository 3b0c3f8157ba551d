#include "pg/stats.hpp"

#include "pg/error.hpp"

namespace cg::pg {

stats::stats(metrics::registry& reg, const std::string& pool_name, std::size_t pool_size)
    : size(reg.gauge("chargeguard_pg_pool_size", "Configured PostgreSQL connections")
               .Add({{"pool", pool_name}})),
      open(reg.gauge("chargeguard_pg_pool_open_connections", "Open PostgreSQL connections (idle and in use)")
               .Add({{"pool", pool_name}})),
      in_use(reg.gauge("chargeguard_pg_pool_in_use_connections", "PostgreSQL connections handed out")
                 .Add({{"pool", pool_name}})),
      up(reg.gauge("chargeguard_pg_up", "1 while PostgreSQL answers, as last seen by the pool")
             .Add({{"pool", pool_name}})),
      waits(reg.counter("chargeguard_pg_pool_waits_total", "Acquisitions that waited for a busy connection")
                .Add({{"pool", pool_name}})),
      acquire_failures(reg.counter("chargeguard_pg_pool_acquire_failures_total",
                                   "Acquisitions that failed (PostgreSQL down or the pool exhausted)")
                           .Add({{"pool", pool_name}})),
      failovers(reg.counter("chargeguard_pg_failovers_detected_total",
                            "New connections that reached another PostgreSQL server than the last one (a "
                            "promoted standby, another cluster or address): a failover that may have lost "
                            "the last commits")
                    .Add({{"pool", pool_name}})),
      reg_(reg),
      pool_(pool_name),
      latency_(reg.histogram("chargeguard_pg_query_duration_seconds", "Statement or pipeline batch latency")
                   .Add({{"pool", pool_name}}, metrics::latency_buckets())),
      connects_ok_(reg.counter("chargeguard_pg_connects_total", "Connection attempts by outcome")
                       .Add({{"pool", pool_name}, {"outcome", "ok"}})),
      connects_failed_(reg.counter("chargeguard_pg_connects_total", "Connection attempts by outcome")
                           .Add({{"pool", pool_name}, {"outcome", "failed"}})) {
    size.Set(static_cast<double>(pool_size));
}

void stats::query_done(double seconds, const std::error_code& ec) {
    latency_.Observe(seconds);
    if (ec) error(ec);
}

void stats::error(const std::error_code& ec) {
    reg_.counter("chargeguard_pg_errors_total", "PostgreSQL errors by class")
        .Add({{"pool", pool_}, {"class", error_class(ec)}})
        .Increment();
}

void stats::connect_done(bool ok) {
    (ok ? connects_ok_ : connects_failed_).Increment();
}

}  // namespace cg::pg
