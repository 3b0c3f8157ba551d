#include "vault/proxy.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <variant>

#include "net/tls.hpp"
#include "vault/proxy_state.hpp"
#include "vault/refusals.hpp"
#include "vault/secret.hpp"

namespace cg::vault {

using clock = std::chrono::steady_clock;

// A request waiting for a place to forward (proxy::state::forward_waiters): woken by the place handed
// over, or by its deadline. Leaves the queue with its frame if neither came (the loop's shutdown).
struct forward_waiter {
    forward_waiter(proxy::state& s, clock::time_point deadline) : st(s), timer(s.main, deadline) {}
    forward_waiter(const forward_waiter&) = delete;
    forward_waiter& operator=(const forward_waiter&) = delete;
    ~forward_waiter() {
        if (admitted) return;
        auto& q = st.forward_waiters;
        if (auto it = std::find(q.begin(), q.end(), this); it != q.end()) q.erase(it);
    }
    proxy::state& st;
    net::steady_timer timer;
    bool admitted = false;  // taken off the queue with the place of a request that left
};

namespace {

// A place among the requests going on to the reservation and the upstream (proxy_config::max_forwarding).
// Dropping it hands it to the oldest waiter, else frees it.
class forward_place {
  public:
    forward_place() = default;
    explicit forward_place(std::shared_ptr<proxy::state> st) : st_(std::move(st)) {}
    forward_place(forward_place&& o) noexcept = default;
    forward_place& operator=(forward_place&&) = delete;
    forward_place(const forward_place&) = delete;
    forward_place& operator=(const forward_place&) = delete;
    ~forward_place() {
        if (!st_) return;
        auto& q = st_->forward_waiters;
        if (q.empty()) {
            --st_->forwarding;
            return;
        }
        forward_waiter* w = q.front();
        q.pop_front();
        w->admitted = true;  // the place passes to it: `forwarding` stays
        w->timer.cancel();
    }
    bool held() const noexcept { return st_ != nullptr; }

  private:
    std::shared_ptr<proxy::state> st_;
};

// A place at once when one is free and nobody waits, else the oldest waiter's turn; an empty place when
// `deadline` passed first.
net::awaitable<forward_place> enter_forwarding(std::shared_ptr<proxy::state> st, clock::time_point deadline) {
    if (st->forwarding < st->forwarding_capacity && st->forward_waiters.empty()) {
        ++st->forwarding;
        co_return forward_place(std::move(st));
    }
    forward_waiter w(*st, deadline);
    st->forward_waiters.push_back(&w);
    co_await w.timer.async_wait();  // cancelled when admitted; else the deadline
    if (!w.admitted) co_return forward_place();
    co_return forward_place(std::move(st));
}

double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
}

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

// A transport failure as the client sees it: 502 when nothing reached Stripe (safe to retry), 504 when the

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

// The connection's socket can no longer be read (the listener's stop closed it) with the request's body still
// in it: nothing was reserved or sent, as for a request that found no place in time.
http::response client_gone(proxy::state& st, ledger_line& l, bool creates) {
    return finish(st, l, creates ? "upstream_unreachable" : "upstream_failed",
                  refuse(st, refusals::upstream_failure(false), true));
}

// A GET the key may make: forwarded as it is, no accounting.
net::awaitable<http::response> forward_read(state_ptr st, http::request& req, ledger_line& l,
                                            clock::duration budget) {
    auto r = co_await forward(st, upstream_request(*st, req, {}), l, budget);
    if (!r.ok()) co_return finish(*st, l, "upstream_failed", transport_failure(*st, r));
    co_return finish(*st, l, "read", relay(r.resp));
}

// What every request that moves money must be, refunds and creates alike: a body within the bound and an
// Idempotency-Key Stripe accepts, which the audit line records. The refusal, or nullopt to go on.
std::optional<http::response> refuse_unkeyed_write(proxy::state& s, const http::request& req,
                                                   ledger_line& l) {
    if (req.body_size() > s.cfg.max_body_bytes)
        return finish(s, l, "too_large", refuse(s, refusals::too_large(s.cfg.max_body_bytes), false));
    auto idem = req.headers.get("Idempotency-Key").value_or("");
    if (idem.empty() || idem.size() > 255)
        return finish(s, l, "bad_request", refuse(s, refusals::idempotency_key_required(), false));
    l.row.idempotency_key = std::string(idem);
    return std::nullopt;
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

// After a create came back: what happens to the reservation, queued to be written with the key's next batch
// (the client does not wait for it). Only the request that made (or re-made) the reservation owns it; a retry
// of a row still in flight or unresolved only settles it on a 2xx (the same answer the owner gets from

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

// The presented vault secret: "Authorization: Bearer cgvk_…", what the SDKs send.
std::string presented_secret(const http::request& req) {
    auto h = req.headers.get("Authorization").value_or("");
    if (h.size() > 7 && iequals(h.substr(0, 7), "Bearer ")) return std::string(h.substr(7));
    return {};
}

// What a request that passed every check made before forwarding goes on with.
struct checked {
    operation op;
    std::string key_id, key_currency;  // the key's, not its whole row: a waiting request holds this
    create_params create;              // a create's parameters
};

// Every check that needs neither a reservation nor the upstream: the path, the key and its scope, and for a
// write its Idempotency-Key and body. The refusal (finished), or what the request goes on with.
// Fills `c` and returns nullopt when the request goes on.
net::awaitable<std::optional<http::response>> check_request(state_ptr st, http::request& req, ledger_line& l,
                                                            checked& c) {
    l.row.method = req.method.empty() ? "?" : req.method;
    l.row.path = req.path().empty() ? "/" : std::string(req.path());
    if (!l.row.path.starts_with("/v1/"))
        co_return finish(*st, l, "not_found",
                         refuse(*st, refusals::not_found(req.method, l.row.path), false));
    auto secret = presented_secret(req);
    auto id = secret_id(secret);
    auto unauth = refusals::unauthenticated(secret);
    if (!id) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    auto op = operation_for(req.method, req.path());
    if (st->cfg.key_cache_ttl.count() > 0 && st->key_reads.contains(*id)) co_await await_key_read(st, *id);
    auto key = co_await find_key(st, *id, op.creates);
    if (!key) co_return unavailable(*st, l, key.err());
    if (!*key) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    // A wrong secret for a real id is audited under that id: someone is guessing that key.
    l.row.key_id = (*key)->id;
    if (!verify_secret(secret, (*key)->secret_hash))
        co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    if (!(*key)->usable)
        co_return finish(*st, l, "unauthenticated", refuse(*st, refusals::key_unusable(), false));
    l.authed = clock::now();
    if (op.name.empty() || !(*key)->allows(op.name)) {
        std::string what = op.name.empty() ? req.method + " " + l.row.path : op.name;
        co_return finish(*st, l, "forbidden", refuse(*st, refusals::forbidden(what), false));
    }
    // Stripe Connect: a key acts in exactly one account — its connected account, or the platform's own — and
    // a request for any other is refused, never forwarded (the cap counts one account's spend).
    auto presented_account = req.headers.get("Stripe-Account");
    if (presented_account.value_or("") != (*key)->stripe_account ||
        (presented_account && presented_account->empty()))
        co_return finish(
            *st, l, "forbidden",
            refuse(*st, refusals::account_forbidden(presented_account.value_or(""), (*key)->stripe_account),
                   false));
    if (op.refund || op.creates)
        if (auto refused = refuse_unkeyed_write(*st, req, l)) co_return std::move(*refused);
    if (op.creates) {
        // Only the body is counted, stored and replayed: a query string or another encoding would make what
        // Stripe executes differ from what the vault reserved.
        if (auto bad = check_create_envelope(req.query(), req.headers.get("Content-Type")))
            co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
        // The body as the server left it: in the connection, read again once the request may go on.
        auto body = req.peek_body();
        if (!body) co_return client_gone(*st, l, true);
        auto parsed = parse_create(*body, (*key)->currency);
        std::string().swap(*body);
        if (auto* bad = std::get_if<refusal>(&parsed))
            co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
        c.create = std::move(std::get<create_params>(parsed));
        l.row.amount_cents = c.create.amount;
    }
    c.op = std::move(op);
    c.key_id = (*key)->id;
    c.key_currency = (*key)->currency;
    co_return std::nullopt;
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
