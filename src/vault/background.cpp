// The proxy's background tasks and their start and stop: the audit writer, the flush of queued settlements,
// the gauge refresher and the upstream probe; the resolver (resolver.cpp) is started and stopped with them.
// All run on the main executor.
#include <asio/co_spawn.hpp>
#include <asio/strand.hpp>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "http/client_connection.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "vault/proxy_state.hpp"

namespace cg::vault {

// The completion handler holds only a weak reference: the task's own frame keeps the state alive while it
// runs, and stop() waits for every task, so the state (and its clients on the offload pool) never outlives
// the proxy's owner by hiding in a finished frame.
void spawn_logged(state_ptr st, net::awaitable<void> task, const char* name) {
    ++st->running;
    asio::co_spawn(
        st->main, std::move(task),
        [w = std::weak_ptr<proxy::state>(st), log = st->log, name](std::exception_ptr e) {
            if (auto s = w.lock()) {
                if (--s->running == 0 && s->all_stopped) s->all_stopped->cancel();
            }
            if (!e) return;
            log.error("vault proxy task failed", {{"task", name}, {"error", describe_exception(e)}});
        });
}

namespace {

using ms = std::chrono::milliseconds;

// One writer at a time (the audit loop, flush_audit, stop): rows reach the table in the order they were
// queued, and a flush returns only once the batch another writer had in flight is written too.
net::awaitable<bool> run_flush(state_ptr st) {
    while (st->audit_writing) {
        net::steady_timer t(st->main, std::chrono::steady_clock::time_point::max());
        st->audit_waiters.insert(&t);
        co_await t.async_wait();  // cancelled when the writer ends
        st->audit_waiters.erase(&t);
    }
    st->audit_writing = true;
    struct end_writing {
        proxy::state& st;
        ~end_writing() {
            st.audit_writing = false;
            for (auto* t : st.audit_waiters) t->cancel();
        }
    } writing{*st};
    while (!st->audit.empty()) {
        std::size_t n = std::min<std::size_t>(st->audit.size(), 1000);
        std::vector<audit_row> batch(
            std::make_move_iterator(st->audit.begin()),
            std::make_move_iterator(st->audit.begin() + static_cast<std::ptrdiff_t>(n)));
        st->audit.erase(st->audit.begin(), st->audit.begin() + static_cast<std::ptrdiff_t>(n));
        auto copy = batch;
        auto r = co_await st->store.write_audit(std::move(batch));
        if (!r) {
            // Back to the front, in order; the queue limit drops the oldest if PostgreSQL stays away.
            for (auto it = copy.rbegin(); it != copy.rend(); ++it) st->audit.push_front(std::move(*it));
            while (st->audit.size() > st->cfg.audit_queue_limit) {
                st->audit.pop_front();
                st->audit_dropped->Increment();
            }
            st->log.warn("vault audit: cannot write",
                         {{"queued", st->audit.size()}, {"error", r.err().describe()}});
            co_return false;
        }
        st->audit_written->Increment(static_cast<double>(n));
    }
    co_return true;
}

// Waits until every queued settlement has been written (the drains skip their linger while a flush waits).
// False when a batch carrying settlements failed meanwhile.
net::awaitable<bool> run_flush_settlements(state_ptr st) {
    ++st->flushing;
    auto failures = st->settle_failures;
    for (auto& [key, q] : st->key_queues)
        if (q.linger) q.linger->cancel();
    if (st->quick_linger) st->quick_linger->cancel();
    // A lease spend's settlement is queued once its row is written: those rows first.
    while ((st->settlements_pending > 0 || st->lease_records_pending > 0) &&
           st->settle_failures == failures) {
        net::steady_timer t(st->main, std::chrono::steady_clock::time_point::max());
        st->settle_waiters.insert(&t);
        co_await t.async_wait();  // cancelled after every batch
        st->settle_waiters.erase(&t);
    }
    --st->flushing;
    co_return st->settle_failures == failures && st->settlements_pending == 0 &&
        st->lease_records_pending == 0;
}

net::awaitable<void> audit_loop(state_ptr st) {
    while (!st->stopping) {
        bool ok = co_await run_flush(st);
        ms pause = ok ? st->cfg.audit_flush_interval : ms(500);
        bool more = co_await nap(st, pause);
        if (!more) break;
    }
}

net::awaitable<void> refresh_gauges(state_ptr st) {
    auto usage = co_await st->store.usage();
    if (usage) {
        for (const auto& u : *usage) {
            if (!u.key.usable) continue;
            double ratio = u.key.cap_cents > 0
                               ? static_cast<double>(u.committed()) / static_cast<double>(u.key.cap_cents)
                               : 0.0;
            st->utilisation->Add({{"key", u.key.id}}).Set(ratio);
        }
    }
    auto states = co_await st->store.reservations_by_state();
    if (states) {
        for (std::string_view s : {"reserved", "settled", "released", "uncertain"}) {
            std::int64_t n = 0;
            for (const auto& [name, count] : *states)
                if (name == s) n = count;
            st->reservations->Add({{"state", std::string(s)}}).Set(static_cast<double>(n));
        }
    }
    auto expired = co_await st->store.expired_lease_cents();
    if (expired) st->expired_lease_cents->Set(static_cast<double>(*expired));
}

net::awaitable<void> gauge_loop(state_ptr st) {
    while (!st->stopping) {
        co_await refresh_gauges(st);
        bool more = co_await nap(st, st->cfg.gauge_interval);
        if (!more) break;
    }
}

// DNS + TCP + TLS handshake with certificate verification, on the offload executor.
net::awaitable<std::string> probe_once(std::shared_ptr<asio::ssl::context> tls, http::origin o, ms timeout) {
    auto ex = co_await asio::this_coro::executor;
    http::client_connection c(ex, o.tls ? tls : nullptr);
    auto r = co_await net::with_timeout(c.connect(o, timeout), timeout);
    if (!r) co_return "connect timed out after " + net::describe_timeout(timeout);
    if (!*r) co_return r->err().describe();
    co_return std::string();
}

net::awaitable<void> probe_loop(state_ptr st) {
    auto o = st->upstreams.front()->target();
    while (!st->stopping) {
        // On a strand of the pool: the probe's timeout (net/timeout.hpp) needs a serial executor.
        auto why = co_await net::offload(asio::make_strand(st->offload),
                                         probe_once(st->tls, o, st->cfg.connect_timeout));
        {
            std::lock_guard lock(st->probe_mu);
            st->upstream_ok = why.empty();
            st->upstream_ever_ok = st->upstream_ever_ok || why.empty();
            st->upstream_detail = why.empty() ? o.to_string() + " reachable" : o.to_string() + ": " + why;
        }
        bool more = co_await nap(st, st->cfg.upstream_probe_interval);
        if (!more) break;
    }
}

}  // namespace

net::awaitable<bool> nap(std::shared_ptr<proxy::state> st, std::chrono::steady_clock::duration d) {
    if (st->stopping) co_return false;
    net::steady_timer t(st->main, d);
    st->sleepers.insert(&t);
    co_await t.async_wait();
    st->sleepers.erase(&t);
    co_return !st->stopping;
}

void proxy::start() {
    if (st_->started) return;
    st_->started = true;
    spawn_logged(st_, resolver_loop(st_), "resolver");
    spawn_logged(st_, audit_loop(st_), "audit");
    spawn_logged(st_, gauge_loop(st_), "gauges");
    spawn_logged(st_, probe_loop(st_), "upstream_probe");
    if (st_->cfg.cap_lease.count() > 0) spawn_logged(st_, lease_loop(st_), "cap_leases");
}

net::awaitable<void> proxy::stop() {
    st_->stopping = true;
    for (auto* t : st_->sleepers) t->cancel();
    // The tasks end at their next check (a resolver pass or a probe in progress finishes first, bounded by
    // the upstream timeouts).
    if (st_->running > 0) {
        net::steady_timer done(st_->main, std::chrono::steady_clock::time_point::max());
        st_->all_stopped = &done;
        co_await done.async_wait();
        st_->all_stopped = nullptr;
    }
    co_await run_flush_settlements(st_);
    // Every spend written (or its lease stranded): what the leases still hold goes back to the cap.
    co_await return_leases(st_);
    co_await run_flush(st_);
}

void proxy::add_readiness(metrics::health& h) {
    h.add_readiness("upstream", [st = st_]() {
        std::lock_guard lock(st->probe_mu);
        return metrics::check_status{st->upstream_ok, st->upstream_detail};
    });
}

bool proxy::upstream_reached_once() const {
    std::lock_guard lock(st_->probe_mu);
    return st_->upstream_ever_ok;
}

net::awaitable<bool> proxy::flush_settlements() {
    co_return co_await run_flush_settlements(st_);
}
net::awaitable<bool> proxy::flush_audit() {
    co_return co_await run_flush(st_);
}

}  // namespace cg::vault
