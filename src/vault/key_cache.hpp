// The proxy's cache of vault key rows: the rule for using a cached row. A row younger than key_cache_ttl is
// used as it is. A create may also take an older one (then one background read refreshes it): nothing it
// decides on can loosen — the secret's hash, currency and allow list never change, and revocation and
// expiry are checked again by the reservation step under the key's lock — so a create never waits for a
// key read once its key has been seen. A read (GET) has no reservation step: it waits for a fresh row once
// the cached one is older than the TTL. Pure.
#pragma once

#include <chrono>
#include <cstddef>

namespace cg::vault {

enum class cached_key_use {
    fresh,         // use it
    stale_usable,  // use it, and refresh it in the background
    read,          // read the row now (and cache it)
};

// A cached row of `age`, for a request that creates or not; ttl 0 turns the cache off.
cached_key_use use_cached_key(std::chrono::steady_clock::duration age, std::chrono::milliseconds ttl,
                              bool creates);

// The cache holds at most this many rows (only real keys get there); past it, it starts afresh.
inline constexpr std::size_t key_cache_limit = 10'000;

}  // namespace cg::vault
