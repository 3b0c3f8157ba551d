// vault::proxy: set-up, routes, and the request path — checked (request_checks.cpp), a place among the
// requests going on (forward_places.cpp), then a read or refund forwarded as it is, a cancel of an intent
// the vault created forwarded and its reservation released, or a create reserved
// against the key's cap, forwarded with the vault tag and accounted (settlement_queue.cpp).
#include "vault/proxy.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <variant>

#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "stripe/error.hpp"
#include "stripe/fact.hpp"
#include "stripe/json.hpp"
#include "vault/proxy_state.hpp"
#include "vault/refusals.hpp"
#include "vault/secret.hpp"

namespace cg::vault {

using clock = std::chrono::steady_clock;

namespace {

double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
}

}  // namespace

// Ends the request: counts the outcome, queues the audit row, observes the latencies.
http::response finish(proxy::state& st, ledger_line& l, std::string outcome, http::response resp) {
    l.row.outcome = std::move(outcome);
    double total = seconds_since(l.started);
    l.row.latency_ms = total * 1000.0;
    st.count(l.row.outcome);
    if (l.row.upstream_status || l.upstream_seconds > 0) {
        st.upstream_latency->Observe(l.upstream_seconds);
        st.added_latency->Observe(std::max(0.0, total - l.upstream_seconds));
    }
    observe_stages(st, l, clock::now());
    st.queue_audit(std::move(l.row));
    return resp;
}

http::response unavailable(proxy::state& st, ledger_line& l, const error& e) {
    st.log.warn("vault proxy: PostgreSQL unavailable, nothing forwarded",
                {{"path", l.row.path}, {"key_id", l.row.key_id.value_or("")}, {"error", e.describe()}});
    return finish(st, l, "unavailable", refuse(st, refusals::vault_unavailable(), true));
}

// The connection's socket can no longer be read (the listener's stop closed it) with the request's body still
// in it: nothing was reserved or sent, as for a request that found no place in time.
http::response client_gone(proxy::state& st, ledger_line& l, bool creates) {
    return finish(st, l, creates ? "upstream_unreachable" : "upstream_failed",
                  refuse(st, refusals::upstream_failure(false), true));
}

namespace {

// Request headers a client may send on to Stripe. Everything else stays behind: Authorization (the vault
// key), cookies, proxies' headers. Stripe-Account is forwarded only after run_handle checked it is the
// key's own connected account (upstream_request).
constexpr std::array<std::string_view, 6> forwarded_request_headers{
    "Content-Type",    "Accept",     "Stripe-Version",
    "Idempotency-Key", "User-Agent", "X-Stripe-Client-User-Agent"};

// Response headers that describe the hop, not the answer.
bool hop_by_hop(std::string_view name) {
    for (std::string_view h : {"Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length",
                               "Proxy-Connection", "Upgrade", "TE", "Trailer"})
        if (iequals(name, h)) return true;
    return false;
}

// The upstream request: the client's method, target and body with the real key. A create goes to its path
// alone (the handler refused one with a query), exactly what its row stores for the resolver's replay.
http::request upstream_request(const proxy::state& st, const http::request& req, std::string body) {
    http::request up;
    up.method = req.method;
    up.target = req.method == "POST" ? std::string(req.path()) : req.target;
    up.body = std::move(body);
    up.headers.add("Authorization", "Bearer " + st.cfg.upstream_key);
    for (auto name : forwarded_request_headers)
        if (auto v = req.headers.get(name)) up.headers.add(std::string(name), std::string(*v));
    // Checked against the key's scope before anything is forwarded (run_handle): the key's own account.
    if (auto acct = req.headers.get("Stripe-Account")) up.headers.add("Stripe-Account", std::string(*acct));
    if (up.method == "POST" && !up.headers.has("Content-Type"))
        up.headers.add("Content-Type", "application/x-www-form-urlencoded");
    return up;
}

// Stripe's answer as the client gets it: status, body and every end-to-end header (Request-Id,
// Idempotent-Replayed, Original-Request, Stripe-Should-Retry, …).
http::response relay(const http::response& up) {
    http::response out;
    out.status = up.status;
    out.reason = up.reason;
    out.body = up.body;
    for (const auto& [k, v] : up.headers)
        if (!hop_by_hop(k)) out.headers.add(k, v);
    return out;
}
// `budget`: the upstream timeout less what the request waited for its place (enter_forwarding).
net::awaitable<http::client_result> forward(state_ptr st, http::request up, ledger_line& l,
                                            clock::duration budget) {
    auto t0 = clock::now();
    l.up_sent = t0;
    auto* client = st->upstreams[st->next_upstream++ % st->upstreams.size()].get();
    auto r = co_await client->request(std::move(up), t0 + budget);
    l.up_done = clock::now();
    l.upstream_seconds = std::chrono::duration<double>(l.up_done - t0).count();
    if (r.ok()) {
        l.row.upstream_status = r.resp.status;
        if (auto id = r.resp.headers.get("Request-Id")) l.row.request_id = std::string(*id);
    }
    co_return r;
}

// A GET the key may make: forwarded as it is, no accounting.
net::awaitable<http::response> forward_read(state_ptr st, http::request& req, ledger_line& l,
                                            clock::duration budget) {
    auto r = co_await forward(st, upstream_request(*st, req, {}), l, budget);
    if (!r.ok()) co_return finish(*st, l, "upstream_failed", transport_failure(*st, r));
    co_return finish(*st, l, "read", relay(r.resp));
}
// A refund the key may make (its body and Idempotency-Key checked as a create's, by check_request):
// forwarded as sent, never counted against the cap — it moves money back. What it gives back to the cap is
// the key's policy's, applied when Stripe reports the refund (webhooks, refunds_reopen_cap).
net::awaitable<http::response> forward_refund(state_ptr st, http::request& req, ledger_line& l,
                                              clock::duration budget) {
    if (!req.take_body()) co_return client_gone(*st, l, false);
    auto r = co_await forward(st, upstream_request(*st, req, req.body), l, budget);
    if (!r.ok()) co_return finish(*st, l, "upstream_failed", transport_failure(*st, r));
    co_return finish(*st, l, "refund", relay(r.resp));
}
// A cancel of a PaymentIntent (allowed by payment_intents.create). It moves no money, and a caller giving up
// on a payment — an intent waiting for an authentication nobody will give, retry-declined before charging
// a declined customer again — must be able to make it never succeed. Forwarded only for an intent the
// vault tagged for a reservation of this key (retrieved first with the real key, in the key's account), so
// a key cannot cancel other callers' payments. Once Stripe canceled it the reservation is released before
// the answer goes back: the caller's next create finds the room.
net::awaitable<http::response> forward_cancel(state_ptr st, http::request& req, ledger_line& l,
                                              const std::string& key_id, clock::duration budget) {
    if (req.body_size() > st->cfg.max_body_bytes)
        co_return finish(*st, l, "too_large",
                         refuse(*st, refusals::too_large(st->cfg.max_body_bytes), false));
    if (auto idem = req.headers.get("Idempotency-Key")) l.row.idempotency_key = std::string(*idem);
    const std::string id(cancelled_intent(req.path()));
    auto not_ours = [&] {
        return finish(
            *st, l, "forbidden",
            refuse(*st, refusals::forbidden("canceling " + id + ", which the vault did not create"), false));
    };
    std::string account(req.headers.get("Stripe-Account").value_or(""));  // the key's own (checked)
    auto pi = co_await st->stripe->retrieve_payment_intent(id, std::move(account));
    if (!pi && pi.err().code == stripe::errc::rejected) co_return not_ours();
    if (!pi)
        co_return finish(*st, l, "upstream_failed", refuse(*st, refusals::upstream_failure(false), true));
    auto tag = stripe::metadata_value(pi->metadata, vault_tag_key);
    if (!tag) co_return not_ours();
    const std::string idem(*tag);
    auto owns = co_await st->store.owns_intent(key_id, idem, id);
    if (!owns) co_return unavailable(*st, l, owns.err());
    if (!*owns) co_return not_ours();
    if (!req.take_body()) co_return client_gone(*st, l, false);
    auto r = co_await forward(st, upstream_request(*st, req, req.body), l, budget);
    if (!r.ok()) co_return finish(*st, l, "upstream_failed", transport_failure(*st, r));
    // The intent as Stripe now has it: the cancel's answer, or (refused: already canceled, or succeeded)
    // as retrieved.
    bool canceled = stripe::read(*pi).moved == stripe::movement::canceled;
    if (r.resp.status / 100 == 2) {
        auto after = stripe::parse_payment_intent(r.resp.body);
        canceled = after && stripe::read(*after).moved == stripe::movement::canceled;
    }
    if (canceled) {
        auto released = co_await st->store.release_canceled(
            key_id, idem, id, "PaymentIntent " + id + " canceled through the vault");
        if (!released)  // a followed reservation is still released by the resolver once it sees the cancel
            st->log.warn(
                "vault: cannot release a canceled PaymentIntent's reservation",
                {{"key_id", key_id}, {"idempotency_key", idem}, {"error", released.err().describe()}});
        else if (*released)
            st->log.info("vault reservation released: its PaymentIntent was canceled",
                         {{"key_id", key_id}, {"idempotency_key", idem}, {"payment_intent", id}});
    }
    co_return finish(*st, l, "cancel", relay(r.resp));
}
// A create that passed check_request (`p`: its parameters): reserved, then forwarded.
net::awaitable<http::response> forward_create(state_ptr st, http::request& req, ledger_line& l,
                                              const std::string& key_id, const std::string& currency,
                                              const create_params& p, clock::duration budget) {
    const std::string idem = *l.row.idempotency_key;  // checked and recorded by refuse_unkeyed_write
    if (!req.take_body()) co_return client_gone(*st, l, true);
    std::string body = with_vault_tag(req.body, idem);
    // Nothing reads the client's body past here (the tagged copy is what is reserved and forwarded): its
    // memory goes back now rather than being held for the whole upstream call.
    std::string().swap(req.body);

    reserve_request rq;
    rq.key_id = key_id;
    rq.idempotency_key = std::string(idem);
    rq.amount_cents = p.amount;
    rq.path = std::string(req.path());
    rq.body = body;
    rq.customer = p.customer;
    rq.same_key_window = st->cfg.same_key_window;
    auto reservation = co_await reserve_create(st, std::move(rq), l);
    auto& res = reservation.res;
    if (!res) co_return unavailable(*st, l, res.err());
    switch (res->outcome) {
        case reserve_outcome::key_unusable:
            co_return finish(*st, l, "unauthenticated", refuse(*st, refusals::key_unusable(), false));
        case reserve_outcome::cap_exceeded:
            co_return finish(
                *st, l, "cap_exceeded",
                refuse(*st, refusals::cap_exceeded(res->cap_cents, res->committed_cents, currency), false));
        case reserve_outcome::amount_mismatch:
            co_return finish(*st, l, "bad_request", refuse(*st, refusals::amount_mismatch(), false));
        case reserve_outcome::key_expired:
            co_return finish(*st, l, "bad_request",
                             refuse(*st, refusals::key_expired(st->cfg.same_key_window), false));
        default:
            break;
    }
    // The tagged body moves into the upstream request: one copy held during the call, not two.
    auto r = co_await forward(st, upstream_request(*st, req, std::move(body)), l, budget);
    std::string outcome = account_create(st, reservation, key_id, std::string(idem), r);
    if (!r.ok()) co_return finish(*st, l, outcome, transport_failure(*st, r));
    co_return finish(*st, l, outcome, relay(r.resp));
}
// The request in two halves with a wait between them: the checks (check_request, whose state is gone once
// it returns), then — once a place among proxy_config::max_forwarding is free — the reservation and the
// upstream call. A request that finds no place within the upstream timeout is answered as one that found
// no pooled connection in time: 502, nothing sent, Stripe-Should-Retry: true (and nothing reserved).
net::awaitable<http::response> run_handle(state_ptr st, http::request& req) {
    ledger_line l;
    checked c;
    if (auto done = co_await check_request(st, req, l, c)) co_return std::move(*done);
    const auto deadline = clock::now() + st->cfg.request_timeout;
    auto place = co_await enter_forwarding(st, deadline);
    if (!place.held())
        co_return finish(*st, l, c.op.creates ? "upstream_unreachable" : "upstream_failed",
                         refuse(*st, refusals::upstream_failure(false), true));
    // The wait counts against the upstream timeout, as a wait for a pooled connection does; a create's
    // reservation, as before, does not.
    const auto budget = deadline - clock::now();
    if (c.op.refund) co_return co_await forward_refund(st, req, l, budget);
    if (c.op.cancel) co_return co_await forward_cancel(st, req, l, c.key_id, budget);
    if (!c.op.creates) co_return co_await forward_read(st, req, l, budget);
    co_return co_await forward_create(st, req, l, c.key_id, c.key_currency, c.create, budget);
}

}  // namespace

void proxy::state::queue_audit(audit_row row) {
    if (audit.size() >= cfg.audit_queue_limit) {
        audit.pop_front();
        audit_dropped->Increment();
    }
    audit.push_back(std::move(row));
}

result<std::unique_ptr<proxy>> proxy::create(asio::any_io_executor main, asio::any_io_executor offload,
                                             proxy_config cfg, std::shared_ptr<pg::pool> pool, logger log,
                                             metrics::registry& reg) {
    if (cfg.upstream_key.empty()) return error(core_errc::invalid_argument, "no upstream Stripe key");
    if (secret_id(cfg.upstream_key))
        return error(core_errc::invalid_argument, "the upstream key is a vault key, not a Stripe key");
    if (auto why = same_key_window_problem(cfg.same_key_window))
        return error(core_errc::invalid_argument, "same_key_window " + *why);
    auto st = std::make_shared<state>(main, offload, cfg, std::move(pool), log);
    st->forwarding_capacity =
        cfg.max_forwarding ? cfg.max_forwarding : 2 * std::max<std::size_t>(1, cfg.max_connections);
    http::client_options o;
    std::size_t n = std::max<std::size_t>(1, cfg.upstream_clients);
    o.max_connections = std::max<std::size_t>(1, cfg.max_connections / n);
    o.connect_timeout = cfg.connect_timeout;
    o.request_timeout = cfg.request_timeout;
    if (cfg.upstream.starts_with("https://")) {
        auto tls = net::make_tls_client_context({cfg.ca_file});
        if (!tls) return tls.err();
        o.tls = *tls;
        st->tls = *tls;
    }
    for (std::size_t i = 0; i < n; ++i) {
        auto up = http::client::create(cfg.upstream_on_main ? main : offload, cfg.upstream, o, log);
        if (!up) return error(core_errc::invalid_argument, "--upstream: " + up.err().message);
        st->upstreams.push_back(std::move(*up));
    }

    stripe::client_config sc;
    sc.api_base = cfg.upstream;
    sc.api_key = cfg.upstream_key;
    sc.ca_file = cfg.ca_file;
    sc.stripe_version = cfg.stripe_version;
    sc.max_connections = 4;
    sc.connect_timeout = cfg.connect_timeout;
    sc.request_timeout = cfg.request_timeout;
    auto sc_client = stripe::client::create(offload, std::move(sc), log);
    if (!sc_client) return sc_client.err();
    st->stripe = std::move(*sc_client);

    register_metrics(*st, reg);
    return std::unique_ptr<proxy>(new proxy(std::move(st)));
}

proxy::proxy(std::shared_ptr<state> st) : st_(std::move(st)) {}
proxy::~proxy() = default;

http::router proxy::routes() {
    http::router r;
    r.add_prefix("", "/", [this](http::request& q) { return handle(q); });
    // A request waiting for its key, its place or its reservation holds no copy of its body: the handler
    // reads it from the connection when it checks a create and when it forwards.
    r.leave_bodies_unread();
    return r;
}

net::awaitable<http::response> proxy::handle(http::request& req) {
    return run_handle(st_, req);
}

}  // namespace cg::vault
