#include "vault/proxy.hpp"

#include <array>
#include <asio/co_spawn.hpp>
#include <cstdio>

#include "net/tls.hpp"
#include "vault/proxy_state.hpp"
#include "vault/secret.hpp"

namespace cg::vault {

// A settled answer whose payment is still in flight is followed by the resolver (background.cpp).
void note_in_flight(std::shared_ptr<proxy::state> st, const std::string& key_id, const std::string& idem,
                    std::string_view body);

namespace {

using clock = std::chrono::steady_clock;
using state_ptr = std::shared_ptr<proxy::state>;

double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
}

// Request headers a client may send on to Stripe. Everything else stays behind: Authorization (the vault
// key), Stripe-Account (a vault key spends the platform's own account, never a connected one), cookies,
// proxies' headers.
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

// What one request came to, filled in as the handler goes and written as its audit row.
struct ledger_line {
    audit_row row;
    clock::time_point started = clock::now();
    double upstream_seconds = 0;
    // Stage boundaries of a forwarded create (zero where the request did not get that far): key checked,
    // queued for its reservation batch, that batch's statement sent and answered, forwarded, Stripe answered.
    clock::time_point authed, queued, stmt_sent, stmt_done, up_sent, up_done;
    std::size_t batch_creates = 0, batch_settlements = 0;
};

double micros(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
}

// Per-stage timings of a create that was forwarded: the stage histograms, and one debug line per request
// (the benchmark's --trace-burst reads them to show where a burst's time goes).
void observe_stages(proxy::state& st, const ledger_line& l, clock::time_point end) {
    if (l.up_done == clock::time_point{} || l.stmt_done == clock::time_point{}) return;
    double auth = micros(l.started, l.authed), wait = micros(l.queued, l.stmt_sent),
           stmt = micros(l.stmt_sent, l.stmt_done), up = micros(l.up_sent, l.up_done),
           answer = micros(l.up_done, end);
    st.stage_auth->Observe(auth / 1e6);
    st.stage_wait->Observe(wait / 1e6);
    st.stage_statement->Observe(stmt / 1e6);
    st.stage_upstream->Observe(up / 1e6);
    st.stage_answer->Observe(answer / 1e6);
    if (!st.log.enabled(log_level::debug)) return;
    auto us = [](double v) { return static_cast<std::int64_t>(v); };
    st.log.debug("vault request stages", {{"t_us", us(micros(clock::time_point{}, l.started))},
                                          {"auth_us", us(auth)},
                                          {"parse_us", us(micros(l.authed, l.queued))},
                                          {"wait_us", us(wait)},
                                          {"stmt_us", us(stmt)},
                                          {"batch", l.batch_creates},
                                          {"settlements", l.batch_settlements},
                                          {"to_upstream_us", us(micros(l.stmt_done, l.up_sent))},
                                          {"upstream_us", us(up)},
                                          {"answer_us", us(answer)},
                                          {"total_us", us(micros(l.started, end))}});
}

std::string next_request_id(proxy::state& st) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "req_vault_%08llx", static_cast<unsigned long long>(++st.next_request_id));
    return buf;
}

// A Stripe-shaped refusal. `retry`: Stripe-Should-Retry (the SDKs obey it; absent → their defaults).
http::response refuse(proxy::state& st, const refusal& r, std::optional<bool> retry) {
    auto resp = http::make_response(r.status, error_body(r), "application/json");
    resp.headers.add("Request-Id", next_request_id(st));
    if (retry) resp.headers.add("Stripe-Should-Retry", *retry ? "true" : "false");
    return resp;
}

// A revoked or expired key: refused when its row is read and again when the reservation step finds it so.
refusal key_unusable() {
    return {401,
            "authentication_error",
            "api_key_expired",
            "This vault key has been revoked or has expired.",
            {}};
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
    refusal r{503,
              "api_error",
              "vault_unavailable",
              "The spend-cap vault cannot reach its database; nothing was sent to Stripe. Retry later.",
              {}};
    return finish(st, l, "unavailable", refuse(st, r, true));
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
// request went out and no answer came (retry with the same Idempotency-Key: Stripe replays or executes once).
http::response transport_failure(proxy::state& st, const http::client_result& r) {
    refusal e;
    e.type = "api_error";
    if (r.request_sent) {
        e.status = 504;
        e.code = "upstream_timeout";
        e.message =
            "Stripe did not answer in time; the request may have been executed. Retry with the same "
            "Idempotency-Key.";
    } else {
        e.status = 502;
        e.code = "upstream_unreachable";
        e.message = "Stripe could not be reached; nothing was sent.";
    }
    return refuse(st, e, true);
}

net::awaitable<http::client_result> forward(state_ptr st, http::request up, ledger_line& l) {
    auto t0 = clock::now();
    l.up_sent = t0;
    auto* client = st->upstreams[st->next_upstream++ % st->upstreams.size()].get();
    auto r = co_await client->request(std::move(up));
    l.up_done = clock::now();
    l.upstream_seconds = std::chrono::duration<double>(l.up_done - t0).count();
    if (r.ok()) {
        l.row.upstream_status = r.resp.status;
        if (auto id = r.resp.headers.get("Request-Id")) l.row.request_id = std::string(*id);
    }
    co_return r;
}

// A GET the key may make: forwarded as it is, no accounting.
net::awaitable<http::response> forward_read(state_ptr st, http::request& req, ledger_line& l) {
    auto r = co_await forward(st, upstream_request(*st, req, {}), l);
    if (!r.ok()) co_return finish(*st, l, "upstream_failed", transport_failure(*st, r));
    co_return finish(*st, l, "read", relay(r.resp));
}

// After a create came back: what happens to the reservation, queued to be written with the key's next batch
// (the client does not wait for it). Only the request that made (or re-made) the reservation owns it; a retry
// of a row still in flight or unresolved only settles it on a 2xx (the same answer the owner gets from
// Stripe's replay). Returns the audit outcome.
void start_drain(state_ptr st, const std::string& key_id);
void start_quick_drain(state_ptr st);

std::string account(const state_ptr& stp, const reserve_result& res, const std::string& key_id,
                    const std::string& idem, const http::client_result& r) {
    auto& st = *stp;
    auto queue = [&](settlement_request s) {
        st.queue_settlement(key_id, std::move(s));
        start_drain(stp, key_id);
    };
    int status = r.ok() ? r.resp.status : 0;
    auto how = owner_settlement(status, r.request_sent);
    settlement_request s;
    s.idempotency_key = idem;
    if (how == settlement::settle) {
        s.state = "settled";
        s.object_id = object_id(r.resp.body).value_or("unknown");
        note_in_flight(stp, key_id, idem, r.resp.body);
        if (res.owner() || res.state == "uncertain" || res.state == "reserved") {
            st.queue_quick_settlement(key_id, std::move(s));
            start_quick_drain(stp);
        }
        return res.owner() ? "settled" : "retry_forwarded";
    }
    if (!res.owner()) return "retry_forwarded";
    s.why = r.ok() ? "HTTP " + std::to_string(status) : r.err.describe();
    if (how == settlement::release) {
        s.state = "released";
        queue(std::move(s));
        return r.ok() ? "released" : "upstream_unreachable";
    }
    s.state = "uncertain";
    s.retry_in = st.cfg.first_resolve_delay;
    queue(std::move(s));
    return "uncertain";
}

void wake_settle_waiters(proxy::state& st) {
    for (auto* t : st.settle_waiters) t->cancel();
}

// One key's pipeline to PostgreSQL: everything waiting — the settlements of answers already sent, then the
// creates to reserve, in arrival order — goes as one cg_vault_step call (one statement, one transaction, one
// acquisition of the key's lock); what arrives meanwhile forms the next batch. A create alone pays one round
// trip. Settlements with no create to ride along wait `settle_linger` for one, then go alone.
net::awaitable<void> drain_key(state_ptr st, std::string key_id) {
    constexpr std::size_t max_batch = 256;
    for (;;) {
        auto* q = &st->key_queues[key_id];
        if (q->waiting.empty() && q->settlements.empty()) {
            st->key_queues.erase(key_id);
            wake_settle_waiters(*st);
            co_return;
        }
        if (q->waiting.empty() && !st->stopping && st->flushing == 0 && st->cfg.settle_linger.count() > 0) {
            net::steady_timer linger(st->main, st->cfg.settle_linger);
            q->linger = &linger;
            co_await linger.async_wait();  // cancelled when a create arrives or a flush is asked for
            q = &st->key_queues[key_id];
            q->linger = nullptr;
        }
        std::vector<proxy::state::pending_reserve*> batch;
        while (!q->waiting.empty() && batch.size() < max_batch) {
            batch.push_back(q->waiting.front());
            q->waiting.pop_front();
        }
        std::vector<settlement_request> settles(std::make_move_iterator(q->settlements.begin()),
                                                std::make_move_iterator(q->settlements.end()));
        q->settlements.clear();
        std::vector<reserve_request> reqs;
        reqs.reserve(batch.size());
        for (auto* p : batch) reqs.push_back(p->req);
        result<std::vector<reserve_result>> r = error(core_errc::io_error, "not run");
        auto sent = clock::now();
        std::size_t n_settles = settles.size();
        try {
            r = co_await st->store.step(key_id, settles, std::move(reqs));
        } catch (const std::exception& e) {
            // A broken invariant (schema and code disagree): every waiter fails rather than hangs.
            st->log.error("vault proxy: reservation batch failed", {{"key_id", key_id}, {"error", e.what()}});
            r = error(core_errc::io_error, e.what());
        }
        auto done = clock::now();
        for (std::size_t i = 0; i < batch.size(); ++i) {
            batch[i]->sent = sent;
            batch[i]->done = done;
            batch[i]->batch_creates = batch.size();
            batch[i]->batch_settlements = n_settles;
            if (r)
                batch[i]->out.emplace((*r)[i]);
            else
                batch[i]->out.emplace(r.err());
            batch[i]->wake->cancel();
        }
        q = &st->key_queues[key_id];
        if (r) {
            // The key's utilisation gauge, once per batch: its last reservation saw the batch's final total.
            for (auto it = r->rbegin(); it != r->rend(); ++it)
                if (it->cap_cents > 0) {
                    st->utilisation->Add({{"key", key_id}})
                        .Set(static_cast<double>(it->committed_cents) / static_cast<double>(it->cap_cents));
                    break;
                }
            q->failures = 0;
            st->settlements_pending -= settles.size();
        } else if (!settles.empty()) {
            ++st->settle_failures;
            if (++q->failures >= st->cfg.settle_attempts) {
                // Given up: the rows stay `reserved` (counted); the resolver settles them once stale.
                st->log.error(
                    "vault proxy: cannot record Stripe's answers; the resolver will settle them",
                    {{"key_id", key_id}, {"settlements", settles.size()}, {"error", r.err().describe()}});
                st->settlements_dropped->Increment(static_cast<double>(settles.size()));
                st->settlements_pending -= settles.size();
                q->failures = 0;
            } else {
                // Back to the front, in order, for the next batch.
                for (auto it = settles.rbegin(); it != settles.rend(); ++it)
                    q->settlements.push_front(std::move(*it));
                if (q->waiting.empty() && !st->stopping && st->flushing == 0) {
                    bool more = co_await nap(st, std::chrono::milliseconds(100) * q->failures);
                    (void)more;
                }
            }
        }
        wake_settle_waiters(*st);
    }
}

// The settled answers of every key: one cg_vault_settle_many statement per batch (no key's lock, so it
// neither waits for nor lengthens a reservation batch), after `settle_linger` to gather the answers of a
// burst. A row found in another state (released: a retry's 2xx that must count again) goes on through its
// key's step. A failed batch is retried like a key's (settle_attempts, then dropped: rows stay `reserved`,
// counted, until the resolver settles them).
net::awaitable<void> drain_quick_settlements(state_ptr st) {
    constexpr std::size_t max_batch = 1024;
    for (;;) {
        if (st->quick_settlements.empty()) {
            st->quick_draining = false;
            wake_settle_waiters(*st);
            co_return;
        }
        if (!st->stopping && st->flushing == 0 && st->cfg.settle_linger.count() > 0) {
            net::steady_timer linger(st->main, st->cfg.settle_linger);
            st->quick_linger = &linger;
            co_await linger.async_wait();  // cancelled when a flush is asked for
            st->quick_linger = nullptr;
        }
        std::vector<store::keyed_settlement> batch;
        while (!st->quick_settlements.empty() && batch.size() < max_batch) {
            batch.push_back(std::move(st->quick_settlements.front()));
            st->quick_settlements.pop_front();
        }
        result<std::vector<std::size_t>> r = error(core_errc::io_error, "not run");
        try {
            r = co_await st->store.settle_many(batch);
        } catch (const std::exception& e) {
            st->log.error("vault proxy: settlement batch failed", {{"error", e.what()}});
            r = error(core_errc::io_error, e.what());
        }
        if (r) {
            st->quick_failures = 0;
            st->settlements_pending -= batch.size();
            for (auto i : *r) {
                settlement_request s;
                s.idempotency_key = std::move(batch[i].idempotency_key);
                s.state = "settled";
                s.object_id = std::move(batch[i].object_id);
                ++st->settlements_pending;
                st->key_queues[batch[i].key_id].settlements.push_back(std::move(s));
                start_drain(st, batch[i].key_id);
            }
        } else {
            ++st->settle_failures;
            if (++st->quick_failures >= st->cfg.settle_attempts) {
                st->log.error("vault proxy: cannot record Stripe's answers; the resolver will settle them",
                              {{"settlements", batch.size()}, {"error", r.err().describe()}});
                st->settlements_dropped->Increment(static_cast<double>(batch.size()));
                st->settlements_pending -= batch.size();
                st->quick_failures = 0;
            } else {
                for (auto it = batch.rbegin(); it != batch.rend(); ++it)
                    st->quick_settlements.push_front(std::move(*it));
                if (!st->stopping && st->flushing == 0) {
                    bool more = co_await nap(st, std::chrono::milliseconds(100) * st->quick_failures);
                    (void)more;
                }
            }
        }
        wake_settle_waiters(*st);
    }
}

void start_quick_drain(state_ptr st) {
    if (st->quick_draining) return;
    st->quick_draining = true;
    asio::co_spawn(st->main, drain_quick_settlements(st), [log = st->log](std::exception_ptr e) {
        if (!e) return;
        log.error("vault proxy: settlement drain failed", {{"error", describe_exception(e)}});
    });
}

void start_drain(state_ptr st, const std::string& key_id) {
    auto& q = st->key_queues[key_id];
    if (q.draining) {
        if (q.linger) q.linger->cancel();
        return;
    }
    q.draining = true;
    asio::co_spawn(st->main, drain_key(st, key_id), [log = st->log](std::exception_ptr e) {
        if (!e) return;
        log.error("vault proxy: reservation drain failed", {{"error", describe_exception(e)}});
    });
}

// The atomic find-or-reserve step for one create, batched with the other creates of its key.
net::awaitable<result<reserve_result>> reserve_batched(state_ptr st, reserve_request rq, ledger_line& l) {
    l.queued = clock::now();
    net::steady_timer wake(st->main, clock::time_point::max());
    proxy::state::pending_reserve p;
    p.req = std::move(rq);
    p.wake = &wake;
    std::string key_id = p.req.key_id;
    st->key_queues[key_id].waiting.push_back(&p);
    start_drain(st, key_id);
    while (!p.out) co_await wake.async_wait();
    l.stmt_sent = p.sent;
    l.stmt_done = p.done;
    l.batch_creates = p.batch_creates;
    l.batch_settlements = p.batch_settlements;
    co_return std::move(*p.out);
}

net::awaitable<http::response> forward_create(state_ptr st, http::request& req, ledger_line& l,
                                              const key_record& key) {
    if (req.body.size() > st->cfg.max_body_bytes)
        co_return finish(
            *st, l, "too_large",
            refuse(*st,
                   {413,
                    "invalid_request_error",
                    "request_too_large",
                    "The request body exceeds " + std::to_string(st->cfg.max_body_bytes) + " bytes.",
                    {}},
                   false));
    auto idem = req.headers.get("Idempotency-Key").value_or("");
    if (idem.empty() || idem.size() > 255)
        co_return finish(
            *st, l, "bad_request",
            refuse(*st,
                   {400, "invalid_request_error", "idempotency_key_required",
                    "The vault requires an Idempotency-Key header (1 to 255 characters) on every "
                    "POST, so a retry can never charge or count twice.",
                    "Idempotency-Key"},
                   false));
    l.row.idempotency_key = std::string(idem);
    // Only the body is counted, stored and replayed: a query string or another encoding would make what
    // Stripe executes differ from what the vault reserved.
    if (auto bad = check_create_envelope(req.query(), req.headers.get("Content-Type")))
        co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
    auto parsed = parse_create(req.body, key.currency);
    if (auto* bad = std::get_if<refusal>(&parsed))
        co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
    auto& p = std::get<create_params>(parsed);
    l.row.amount_cents = p.amount;
    std::string body = with_vault_tag(req.body, idem);

    reserve_request rq;
    rq.key_id = key.id;
    rq.idempotency_key = std::string(idem);
    rq.amount_cents = p.amount;
    rq.path = std::string(req.path());
    rq.body = body;
    rq.customer = p.customer;
    rq.same_key_window = st->cfg.same_key_window;
    auto res = co_await reserve_batched(st, std::move(rq), l);
    if (!res) co_return unavailable(*st, l, res.err());
    switch (res->outcome) {
        case reserve_outcome::key_unusable:
            co_return finish(*st, l, "unauthenticated", refuse(*st, key_unusable(), false));
        case reserve_outcome::cap_exceeded: {
            // 402 with type invalid_request_error and code spend_cap_exceeded. stripe-node (pinned 23.1.0)
            // picks the error class from the status alone (402 → StripeCardError), so `type` only decides
            // what callers branching on err.rawType see: card_error would tell them "the customer's card
            // failed" and start dunning (ask the customer for a new card) for what is our own budget;
            // invalid_request_error says "this request cannot succeed as sent", and err.code ===
            // 'spend_cap_exceeded' names why. chargeguard's own client maps 402 + spend_cap_exceeded to
            // cap_blocked whatever the type.
            std::string msg = "This request would take the vault key's spend past its cap of " +
                              std::to_string(res->cap_cents) + " " + key.currency + " (" +
                              std::to_string(res->committed_cents) +
                              " already committed); Stripe was not contacted.";
            co_return finish(
                *st, l, "cap_exceeded",
                refuse(*st, {402, "invalid_request_error", "spend_cap_exceeded", msg, "amount"}, false));
        }
        case reserve_outcome::amount_mismatch:
            co_return finish(
                *st, l, "bad_request",
                refuse(*st,
                       {400,
                        "idempotency_error",
                        "",
                        "Keys for idempotent requests can only be used with the same parameters they "
                        "were first used with (the vault recorded another amount for this key).",
                        {}},
                       false));
        case reserve_outcome::key_expired:
            co_return finish(*st, l, "bad_request",
                             refuse(*st,
                                    {400,
                                     "idempotency_error",
                                     "idempotency_key_expired",
                                     "This Idempotency-Key was first used more than " +
                                         std::to_string(st->cfg.same_key_window.count() / 3600) +
                                         " hours ago; Stripe may have forgotten it. Use a new key.",
                                     {}},
                                    false));
        default:
            break;
    }
    auto r = co_await forward(st, upstream_request(*st, req, body), l);
    std::string outcome = account(st, *res, key.id, std::string(idem), r);
    if (!r.ok()) co_return finish(*st, l, outcome, transport_failure(*st, r));
    co_return finish(*st, l, outcome, relay(r.resp));
}

// The presented vault secret: "Authorization: Bearer cgvk_…", what the SDKs send.
std::string presented_secret(const http::request& req) {
    auto h = req.headers.get("Authorization").value_or("");
    if (h.size() > 7 && iequals(h.substr(0, 7), "Bearer ")) return std::string(h.substr(7));
    return {};
}

void cache_key(proxy::state& st, const std::string& id, const key_record& k, clock::time_point fetched) {
    if (st.keys.size() >= 10'000) st.keys.clear();  // bounded: only real keys get here, but be safe
    st.keys[id] = proxy::state::cached_key{k, fetched};
}

// Re-reads a cached key's row in the background (one read per key at a time).
net::awaitable<void> refresh_key(state_ptr st, std::string id) {
    auto now = clock::now();
    auto r = co_await st->store.find_key(id);
    st->keys_refreshing.erase(id);
    if (!r) co_return;  // PostgreSQL away: the next create's reservation step says so
    if (*r)
        cache_key(*st, id, **r, now);
    else
        st->keys.erase(id);
}

// The key's row, from the cache when it is younger than key_cache_ttl. A create may also take an older
// cached row (then one background read refreshes it): nothing it decides on can loosen — the secret's hash,
// currency and allow list never change, and revocation and expiry are checked again by the reservation
// step under the key's lock — so a create never waits for a key read once its key has been seen. A read
// (GET) has no reservation step: it waits for a fresh row once the cached one is older than the TTL.
net::awaitable<result<std::optional<key_record>>> find_key(state_ptr st, std::string id, bool creates) {
    auto now = clock::now();
    if (st->cfg.key_cache_ttl.count() > 0) {
        if (auto it = st->keys.find(id); it != st->keys.end()) {
            if (now - it->second.fetched < st->cfg.key_cache_ttl)
                co_return std::optional<key_record>(it->second.key);
            if (creates) {
                if (st->keys_refreshing.insert(id).second)
                    asio::co_spawn(st->main, refresh_key(st, id), [log = st->log](std::exception_ptr e) {
                        if (!e) return;
                        log.error("vault proxy: key refresh failed", {{"error", describe_exception(e)}});
                    });
                co_return std::optional<key_record>(it->second.key);
            }
        }
    }
    auto r = co_await st->store.find_key(id);
    if (r && *r && st->cfg.key_cache_ttl.count() > 0) cache_key(*st, id, **r, now);
    co_return r;
}

net::awaitable<http::response> run_handle(state_ptr st, http::request& req) {
    ledger_line l;
    l.row.method = req.method.empty() ? "?" : req.method;
    l.row.path = req.path().empty() ? "/" : std::string(req.path());
    if (!l.row.path.starts_with("/v1/"))
        co_return finish(*st, l, "not_found",
                         refuse(*st,
                                {404,
                                 "invalid_request_error",
                                 "",
                                 "Unrecognized request URL (" + req.method + ": " + l.row.path + ").",
                                 {}},
                                false));
    auto secret = presented_secret(req);
    auto id = secret_id(secret);
    refusal unauth{
        401, "authentication_error", "", "Invalid vault key provided: " + redact_secret(secret), {}};
    if (!id) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    auto op = operation_for(req.method, req.path());
    auto key = co_await find_key(st, *id, op.creates);
    if (!key) co_return unavailable(*st, l, key.err());
    if (!*key) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    // A wrong secret for a real id is audited under that id: someone is guessing that key.
    l.row.key_id = (*key)->id;
    if (!verify_secret(secret, (*key)->secret_hash))
        co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    if (!(*key)->usable) co_return finish(*st, l, "unauthenticated", refuse(*st, key_unusable(), false));
    l.authed = clock::now();
    if (op.name.empty() || !(*key)->allows(op.name)) {
        std::string what = op.name.empty() ? req.method + " " + l.row.path : op.name;
        co_return finish(
            *st, l, "forbidden",
            refuse(*st, {403, "permission_error", "", "This vault key does not allow " + what + ".", {}},
                   false));
    }
    if (!op.creates) co_return co_await forward_read(st, req, l);
    co_return co_await forward_create(st, req, l, **key);
}

}  // namespace

void proxy::state::queue_audit(audit_row row) {
    if (audit.size() >= cfg.audit_queue_limit) {
        audit.pop_front();
        audit_dropped->Increment();
    }
    audit.push_back(std::move(row));
}

bool proxy::state::room_for_settlement(const std::string& key_id, const settlement_request& s) {
    if (settlements_pending < cfg.settlement_queue_limit) return true;
    // PostgreSQL has been away long enough to fill the queue: this row stays `reserved` (counted) and the
    // resolver settles it once it is stale.
    log.error("vault proxy: settlement queue full; the resolver will settle the reservation",
              {{"key_id", key_id}, {"idempotency_key", s.idempotency_key}, {"state", s.state}});
    settlements_dropped->Increment();
    return false;
}

void proxy::state::queue_settlement(const std::string& key_id, settlement_request s) {
    if (!room_for_settlement(key_id, s)) return;
    ++settlements_pending;
    key_queues[key_id].settlements.push_back(std::move(s));
}

void proxy::state::queue_quick_settlement(const std::string& key_id, settlement_request s) {
    if (!room_for_settlement(key_id, s)) return;
    ++settlements_pending;
    quick_settlements.push_back({key_id, std::move(s.idempotency_key), std::move(s.object_id)});
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

    st->requests = &reg.counter("chargeguard_vault_requests_total", "Proxied requests by outcome");
    st->resolutions = &reg.counter("chargeguard_vault_resolutions_total",
                                   "Uncertain or abandoned reservations the resolver looked at, by result");
    st->utilisation =
        &reg.gauge("chargeguard_vault_cap_utilisation_ratio",
                   "Committed spend (settled + reserved + uncertain) over the cap, per vault key");
    st->reservations = &reg.gauge("chargeguard_vault_reservations", "vault_spend rows by state");
    st->upstream_latency = &reg.histogram("chargeguard_vault_upstream_latency_seconds",
                                          "Time from forwarding a request to Stripe's complete answer")
                                .Add({}, metrics::latency_buckets());
    st->added_latency = &reg.histogram("chargeguard_vault_added_latency_seconds",
                                       "Time the proxy adds to a forwarded request (total minus upstream)")
                             .Add({}, metrics::latency_buckets());
    st->audit_dropped =
        &reg.counter("chargeguard_vault_audit_dropped_total",
                     "Audit rows dropped because PostgreSQL stayed unreachable and the queue was full")
             .Add({});
    st->settlements_dropped = &reg.counter("chargeguard_vault_settlements_dropped_total",
                                           "Answers not recorded (PostgreSQL away): the rows stay reserved "
                                           "until the resolver settles them")
                                   .Add({});
    auto& stages =
        reg.histogram("chargeguard_vault_stage_seconds",
                      "Forwarded creates, time per stage: auth (key checked), reserve_wait (queued for "
                      "the key's next batch), reserve_statement (cg_vault_step round trip), upstream, "
                      "answer (Stripe's answer to the response handed back)");
    st->stage_auth = &stages.Add({{"stage", "auth"}}, metrics::latency_buckets());
    st->stage_wait = &stages.Add({{"stage", "reserve_wait"}}, metrics::latency_buckets());
    st->stage_statement = &stages.Add({{"stage", "reserve_statement"}}, metrics::latency_buckets());
    st->stage_upstream = &stages.Add({{"stage", "upstream"}}, metrics::latency_buckets());
    st->stage_answer = &stages.Add({{"stage", "answer"}}, metrics::latency_buckets());
    st->audit_written = &reg.counter("chargeguard_vault_audit_written_total", "Audit rows written").Add({});
    return std::unique_ptr<proxy>(new proxy(std::move(st)));
}

proxy::proxy(std::shared_ptr<state> st) : st_(std::move(st)) {}
proxy::~proxy() = default;

http::router proxy::routes() {
    http::router r;
    r.add_prefix("", "/", [this](http::request& q) { return handle(q); });
    return r;
}

net::awaitable<http::response> proxy::handle(http::request& req) {
    return run_handle(st_, req);
}

std::size_t proxy::audit_queued() const {
    return st_->audit.size();
}

}  // namespace cg::vault
