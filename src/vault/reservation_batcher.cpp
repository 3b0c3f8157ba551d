#include <asio/co_spawn.hpp>

#include "vault/proxy_state.hpp"

namespace cg::vault {
namespace {

using clock = std::chrono::steady_clock;

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
        } else if (!settles.empty() && settlements_retry(*st, q->failures, settles.size(), key_id, r.err())) {
            // Back to the front, in order, for the next batch.
            for (auto it = settles.rbegin(); it != settles.rend(); ++it)
                q->settlements.push_front(std::move(*it));
            if (q->waiting.empty()) co_await settle_backoff(st, q->failures);
        }
        wake_settle_waiters(*st);
    }
}

}  // namespace

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

}  // namespace cg::vault
