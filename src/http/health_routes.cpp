#include "http/health_routes.hpp"

namespace cg::http {

namespace {
response report(const metrics::health_report& rep) { return make_response(rep.ok ? 200 : 503, rep.body); }
}  // namespace

void add_health_routes(router& r, metrics::registry& reg, metrics::health& h) {
    r.add("GET", "/healthz", [&h](request&) -> asio::awaitable<response> { co_return report(h.live()); });
    r.add("GET", "/readyz", [&h](request&) -> asio::awaitable<response> { co_return report(h.ready()); });
    r.add("GET", "/metrics", [&reg](request&) -> asio::awaitable<response> {
        co_return make_response(200, reg.render(), metrics::registry::content_type);
    });
}

}  // namespace cg::http
