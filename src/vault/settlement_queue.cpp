#include <asio/co_spawn.hpp>

#include "vault/proxy_state.hpp"

namespace cg::vault {

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

bool settlements_retry(proxy::state& st, int& failures, std::size_t n, const std::string& key_id,
                       const error& e) {
    ++st.settle_failures;
    if (++failures < st.cfg.settle_attempts) return true;
    // Given up: the rows stay `reserved` (counted); the resolver settles them once stale.
    constexpr std::string_view msg =
        "vault proxy: cannot record Stripe's answers; the resolver will settle them";
    if (key_id.empty())
        st.log.error(msg, {{"settlements", n}, {"error", e.describe()}});
    else
        st.log.error(msg, {{"key_id", key_id}, {"settlements", n}, {"error", e.describe()}});
    st.settlements_dropped->Increment(static_cast<double>(n));
    st.settlements_pending -= n;
    failures = 0;
    return false;
}

net::awaitable<void> settle_backoff(state_ptr st, int failures) {
    if (st->stopping || st->flushing != 0) co_return;
    bool more = co_await nap(st, std::chrono::milliseconds(100) * failures);
    (void)more;
}

namespace {

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
        } else if (settlements_retry(*st, st->quick_failures, batch.size(), {}, r.err())) {
            for (auto it = batch.rbegin(); it != batch.rend(); ++it)
                st->quick_settlements.push_front(std::move(*it));
            co_await settle_backoff(st, st->quick_failures);
        }
        wake_settle_waiters(*st);
    }
}

}  // namespace

void start_quick_drain(state_ptr st) {
    if (st->quick_draining) return;
    st->quick_draining = true;
    asio::co_spawn(st->main, drain_quick_settlements(st), [log = st->log](std::exception_ptr e) {
        if (!e) return;
        log.error("vault proxy: settlement drain failed", {{"error", describe_exception(e)}});
    });
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

}  // namespace cg::vault
