#include "http/health_routes.hpp"

namespace cg::http {

namespace {
response report(const metrics::health_report& rep) {
    return make_response(rep.ok ? 200 : 503, rep.body);
}

// Free coroutines (docs/contributing.md "Coroutine lifetimes": no capturing coroutine lambdas); the router's
// forwarding lambdas only pass the state, which the caller keeps alive as long as the router.
asio::awaitable<response> live(const metrics::health* h) {
    co_return report(h->live());
}
asio::awaitable<response> ready(const metrics::health* h, bool redact) {
    co_return report(h->ready(false, redact));
}
asio::awaitable<response> started(metrics::startup* s) {
    co_return report(s->report());
}
asio::awaitable<response> scrape(const metrics::registry* reg) {
    co_return make_response(200, reg->render(), metrics::registry::content_type);
}
}  // namespace

void add_health_routes(router& r, metrics::registry& reg, metrics::health& h, metrics::startup& s,
                       health_route_options opts) {
    r.add("GET", "/healthz", [&h](request&) { return live(&h); });
    r.add("GET", "/readyz", [&h, redact = opts.redact_details](request&) { return ready(&h, redact); });
    r.add("GET", "/startupz", [&s](request&) { return started(&s); });
    r.add("GET", "/metrics", [&reg](request&) { return scrape(&reg); });
}

}  // namespace cg::http
