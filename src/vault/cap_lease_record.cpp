// Cap leases (cap_lease.cpp): the spends of a key's lease written to PostgreSQL in the background, one
// writer per key: each batch of spends as one cg_vault_lease_record statement, and what each row says of its
// spend (a retry already counted gives its cents back to the lease).
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "vault/proxy_state.hpp"

namespace cg::vault {
namespace {

using clock = std::chrono::steady_clock;
using lease_spend = proxy::state::lease_spend;

// After the row of a spend whose answer came first is written: what the answer means for it.
void account_recorded(const state_ptr& st, lease_spend& sp) {
    if (!sp.recorded || !sp.answer) return;
    (void)account(st, *sp.recorded, sp.req.key_id, sp.req.idempotency_key, *sp.answer);
    sp.answer.reset();
}

// The key's spends, written in batches: what is waiting goes as one cg_vault_lease_record statement, what
// arrives meanwhile forms the next. A batch that fails is retried (a pause growing with the failures) for
// as long as the proxy runs; at stop, after settle_attempts, it is given up and the lease stranded.
net::awaitable<void> record_task(state_ptr st, std::string key) {
    constexpr std::size_t max_batch = 256;
    for (;;) {
        auto* kl = &st->leases[key];
        if (kl->unrecorded.empty()) {
            kl->recording = false;
            wake_settle_waiters(*st);
            co_return;
        }
        std::vector<std::shared_ptr<lease_spend>> batch;
        while (!kl->unrecorded.empty() && batch.size() < max_batch) {
            batch.push_back(std::move(kl->unrecorded.front()));
            kl->unrecorded.pop_front();
        }
        std::vector<reserve_request> reqs;
        reqs.reserve(batch.size());
        for (auto& sp : batch) reqs.push_back(std::move(sp->req));
        const std::int64_t lease = kl->id;
        result<std::vector<reserve_result>> r = error(core_errc::io_error, "not run");
        try {
            r = co_await st->store.lease_record(key, lease, reqs);
        } catch (const std::exception& e) {
            st->log.error("vault proxy: lease record failed", {{"key_id", key}, {"error", e.what()}});
            r = error(core_errc::io_error, e.what());
        }
        for (std::size_t i = 0; i < batch.size(); ++i) batch[i]->req = std::move(reqs[i]);
        kl = &st->leases[key];
        if (!r) {
            ++st->settle_failures;
            if (++kl->record_failures >= st->cfg.settle_attempts && st->stopping) {
                // Their rows will never be written: the lease keeps holding their cents (it is never given
                // back), so the cap still counts them; an operator forfeits it once Stripe is checked.
                st->log.error("vault proxy: cannot write the spends of a cap lease; its cents stay counted",
                              {{"key_id", key},
                               {"lease", lease},
                               {"spends", batch.size()},
                               {"error", r.err().describe()}});
                if (!kl->stranded && st->leases_stranded) st->leases_stranded->Increment();
                kl->stranded = true;
                kl->remaining = 0;
                show_lease(*st, key, *kl);
                st->lease_records_pending -= batch.size();
                kl->record_failures = 0;
                wake_settle_waiters(*st);
                continue;
            }
            for (auto it = batch.rbegin(); it != batch.rend(); ++it)
                kl->unrecorded.push_front(std::move(*it));
            wake_settle_waiters(*st);
            if (!st->stopping) {
                auto pause = std::min<clock::duration>(std::chrono::milliseconds(100) * kl->record_failures,
                                                       std::chrono::seconds(5));
                (void)co_await nap(st, pause);
            }
            continue;
        }
        kl->record_failures = 0;
        const std::int64_t remaining_before = kl->remaining;
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto& sp = *batch[i];
            const auto& res = (*r)[i];
            if (res.outcome == reserve_outcome::existing || res.outcome == reserve_outcome::amount_mismatch) {
                // A retry of a row already counted (or one Stripe refuses): the cents were never spent.
                if (kl->id == lease) kl->remaining += sp.req.amount_cents;
            } else if (res.outcome == reserve_outcome::key_expired) {
                st->log.error(
                    "vault proxy: a retry past the same-key window went through a cap lease; counted "
                    "again without a row",
                    {{"key_id", key},
                     {"idempotency_key", sp.req.idempotency_key},
                     {"amount_cents", sp.req.amount_cents}});
            }
            sp.recorded = res;
            if (res.outcome == reserve_outcome::key_expired)
                sp.answer.reset();  // no row of its own to settle
            account_recorded(st, sp);
            // The row holds what the resolver needs: the request need not stay in memory.
            std::string().swap(sp.req.body);
        }
        if (kl->remaining != remaining_before) show_lease(*st, key, *kl);
        st->lease_records_pending -= batch.size();
        wake_settle_waiters(*st);
    }
}

}  // namespace

void start_record(const state_ptr& st, const std::string& key) {
    auto& kl = st->leases[key];
    if (kl.recording) return;
    kl.recording = true;
    // Posted, not dispatched: the spend's create is forwarded before its row is even sent.
    asio::post(st->main, [st, key] {
        asio::co_spawn(st->main, record_task(st, key), [log = st->log](std::exception_ptr e) {
            if (e) log.error("vault proxy: cap lease record failed", {{"error", describe_exception(e)}});
        });
    });
}

}  // namespace cg::vault
