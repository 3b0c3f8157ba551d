// /healthz, /readyz and /metrics on a router.
#pragma once

#include "http/router.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"

namespace cg::http {

// `reg` and `h` must outlive the router. /healthz → 200/503 from liveness checks; /readyz → 200/503 from
// readiness checks; /metrics → Prometheus text.
void add_health_routes(router& r, metrics::registry& reg, metrics::health& h);

}  // namespace cg::http
