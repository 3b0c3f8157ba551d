#include "billing/report/expected_run.hpp"
#include "lab/run_state.hpp"
#include "pg/params.hpp"
#include "vault/cap.hpp"
#include "vault/policy.hpp"
#include "vault/secret.hpp"
#include "vault/store.hpp"

namespace cg::lab {

// The vault for one run: a key for the period capped at floor(expected × 1.10), expected summed over the
// run's events as `vault issue --expected-file` sums the billing run; the proxy (its own pool, as a separate
// `chargeguard proxy` process would have) listening on loopback with fake-stripe as its upstream; and the
// consumer's Stripe client pointed at it with the vault secret as its key.
net::awaitable<void> lab::start_vault(variant_run& v) {
    auto vr = std::make_unique<vault_run>();
    std::string run;
    for (const auto& body : v.bodies) run += body + "\n";
    vr->fig.expected_cents = billing::sum_expected(run, billing_period, "usd").total_cents;
    vr->fig.cap_cents = need(
        vault::cap_for(vr->fig.expected_cents, need(vault::parse_headroom("1.10"), "headroom")), "vault cap");

    vr->pool = make_pool();
    auto secret = need(vault::issue_secret(), "vault secret");
    vault::new_key k;
    k.id = secret.id;
    k.name = "lab " + v.topic;
    k.secret_hash = secret.hash;
    k.billing_period = billing_period;
    k.cap_cents = vr->fig.cap_cents;
    k.currency = "usd";
    k.allowed = *vault::parse_allow_list(vault::default_allow);
    vault::store store(vr->pool);
    need(co_await store.insert_key(std::move(k)), "vault issue");
    vr->key_id = secret.id;

    vault::proxy_config pc;
    pc.upstream = stripe_base_;
    pc.upstream_key = stripe_key;
    pc.ca_file = opts_.certs_dir + "/ca.pem";
    pc.request_timeout = 10s;
    pc.connect_timeout = 2s;
    vr->proxy = need(vault::proxy::create(io_.get_executor(), offload_.get_executor(), std::move(pc),
                                          vr->pool, log_, vr->reg),
                     "vault proxy");
    http::server_options so;
    so.limits.max_body_bytes = 1024 * 1024;
    vr->server = std::make_unique<http::server>(io_.get_executor(), vr->proxy->routes(), std::move(so), log_);
    auto ep = need(vr->server->listen(net::host_port{"127.0.0.1", 0}), "vault proxy listen");
    vr->client = need(stripe::client::create(offload_.get_executor(),
                                             stripe_config("http://127.0.0.1:" + std::to_string(ep.port()),
                                                           secret.secret, opts_.certs_dir + "/ca.pem"),
                                             log_),
                      "stripe client for the vault proxy");
    // Nothing can fail from here on: once started, the proxy is stopped by stop_vault().
    vr->server->start();
    vr->proxy->start();
    v.stripe = vr->client.get();
    v.vault = std::move(vr);
}

// After the run: the listener closed, the proxy's audit rows written, its pool closed.
net::awaitable<void> lab::stop_vault(variant_run& v) {
    v.stripe = stripe_.get();
    v.vault->server->stop();
    co_await v.vault->proxy->stop();
    co_await v.vault->pool->close();
}

// The proxy's own account of the run (one audit row per request): creating POSTs, refused at the cap (never
// forwarded), sent on to Stripe.
net::awaitable<row::vault_figures> lab::vault_count(variant_run& v, std::int64_t charged_cents) {
    auto fig = v.vault->fig;
    fig.charged_cents = charged_cents;
    auto r = co_await sql(
        "SELECT count(*), count(*) FILTER (WHERE outcome = 'cap_exceeded'), "
        "count(*) FILTER (WHERE upstream_status IS NOT NULL) FROM vault_audit WHERE method = 'POST' AND "
        "vault_key_id = $1",
        pg::params(v.vault->key_id));
    fig.posts = std::stoull(std::string(r.text(0, 0)));
    fig.refused = std::stoull(std::string(r.text(0, 1)));
    fig.forwarded = std::stoull(std::string(r.text(0, 2)));
    co_return fig;
}

}  // namespace cg::lab
