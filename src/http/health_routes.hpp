// /healthz, /readyz and /metrics on a router.
#pragma once

#include "http/router.hpp"
#include "metrics/health.hpp"
#include "metrics/registry.hpp"
#include "metrics/startup.hpp"

namespace cg::http {

struct health_route_options {
    // /readyz and /startupz show only what each check declares public (no hosts, ports or users): set when
    // the listener is reachable beyond this host.
    bool redact_details = false;
};

// `reg`, `h` and `s` must outlive the router. /healthz → 200/503 from liveness checks (the event loop);
// /readyz → 200/503 from readiness checks (dependencies now); /startupz → 503 until every startup
// condition has held once, then 200 for good; /metrics → Prometheus text.
void add_health_routes(router& r, metrics::registry& reg, metrics::health& h, metrics::startup& s,
                       health_route_options opts = {});

}  // namespace cg::http
