#include "vault/key_cache.hpp"

#include <asio/co_spawn.hpp>

#include "vault/proxy_state.hpp"

namespace cg::vault {

cached_key_use use_cached_key(std::chrono::steady_clock::duration age, std::chrono::milliseconds ttl,
                              bool creates) {
    if (ttl.count() <= 0) return cached_key_use::read;
    if (age < ttl) return cached_key_use::fresh;
    return creates ? cached_key_use::stale_usable : cached_key_use::read;
}

namespace {

using clock = std::chrono::steady_clock;

void cache_key(proxy::state& st, const std::string& id, const key_record& k, clock::time_point fetched) {
    if (st.keys.size() >= key_cache_limit) st.keys.clear();
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

}  // namespace

net::awaitable<void> await_key_read(state_ptr st, std::string id) {
    auto it = st->key_reads.find(id);
    if (it == st->key_reads.end()) co_return;
    auto read = it->second;
    net::steady_timer wake(st->main, clock::time_point::max());
    read->waiters.push_back(&wake);
    struct leave {  // also when this frame is destroyed while it waits (the loop's shutdown)
        proxy::state::key_read& read;
        net::steady_timer* wake;
        ~leave() { std::erase(read.waiters, wake); }
    } left{*read, &wake};
    co_await wake.async_wait();  // cancelled once the read's answer is there
}

net::awaitable<result<std::optional<key_record>>> find_key(state_ptr st, std::string id, bool creates) {
    auto now = clock::now();
    if (auto it = st->keys.find(id); it != st->keys.end()) {
        switch (use_cached_key(now - it->second.fetched, st->cfg.key_cache_ttl, creates)) {
            case cached_key_use::fresh:
                co_return std::optional<key_record>(it->second.key);
            case cached_key_use::stale_usable:
                if (st->keys_refreshing.insert(id).second)
                    asio::co_spawn(st->main, refresh_key(st, id), [log = st->log](std::exception_ptr e) {
                        if (!e) return;
                        log.error("vault proxy: key refresh failed", {{"error", describe_exception(e)}});
                    });
                co_return std::optional<key_record>(it->second.key);
            case cached_key_use::read:
                break;
        }
    }
    const bool shared = st->cfg.key_cache_ttl.count() > 0;  // zero: every request reads the row itself
    if (auto it = st->key_reads.find(id); shared && it != st->key_reads.end()) {
        // Another request's read of this row is in flight (it started after this request's cache check
        // would have started its own): its answer is this request's.
        auto read = it->second;
        co_await await_key_read(st, id);
        if (read->out) co_return *read->out;
        co_return error(core_errc::io_error, "key read abandoned");
    }
    auto read = std::make_shared<proxy::state::key_read>();
    if (shared) st->key_reads.emplace(id, read);
    auto r = co_await st->store.find_key(id);
    if (shared) st->key_reads.erase(id);
    if (r && *r && st->cfg.key_cache_ttl.count() > 0) cache_key(*st, id, **r, now);
    read->out = r;
    for (auto* w : read->waiters) w->cancel();
    co_return r;
}

}  // namespace cg::vault
