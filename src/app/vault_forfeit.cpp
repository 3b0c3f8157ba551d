#include "app/vault_forfeit.hpp"

#include <cstdio>
#include <vector>

#include "app/vault_listing.hpp"
#include "pg/types.hpp"

namespace cg::app::vault_forfeit {

using vault_listing::fail;

net::awaitable<int> forfeit_lease(vault::store& s, flags f) {
    auto leases = co_await s.open_leases(f.id);
    if (!leases) co_return fail("forfeit-lease", leases.err());
    std::vector<vault::store::open_lease> match;
    for (auto& l : *leases)
        if ((!f.lease || l.id == *f.lease) && (f.holder.empty() || l.holder == f.holder)) match.push_back(l);
    if (match.empty()) {
        std::string which;
        if (f.lease) which += " " + std::to_string(*f.lease);
        if (!f.holder.empty()) which += " of holder " + f.holder;
        std::fprintf(stderr, "chargeguard vault forfeit-lease: vault key %s has no open lease%s\n",
                     f.id.c_str(), which.c_str());
        co_return 1;
    }
    if (match.size() > 1) {
        std::fprintf(
            stderr,
            "chargeguard vault forfeit-lease: vault key %s has %zu open leases; name one with --lease:\n",
            f.id.c_str(), match.size());
        for (const auto& l : match)
            std::fprintf(stderr, "  lease %lld  holder %s  held %lld cents  expires %s%s\n",
                         static_cast<long long>(l.id), l.holder.c_str(), static_cast<long long>(l.held()),
                         pg::format_timestamptz(l.expires_at).c_str(), l.expired ? "  (expired)" : "");
        co_return 1;
    }
    const auto& l = match.front();
    if (!l.expired && !f.force) {
        std::fprintf(
            stderr,
            "chargeguard vault forfeit-lease: lease %lld of vault key %s (holder %s) has not expired "
            "(expires %s): its holder may be alive and spending; nothing forfeited (--force to forfeit "
            "it anyway)\n",
            static_cast<long long>(l.id), f.id.c_str(), l.holder.c_str(),
            pg::format_timestamptz(l.expires_at).c_str());
        co_return 1;
    }
    auto r = co_await s.forfeit_lease(f.id, l.id, f.keep_cents, f.force);
    if (!r) co_return fail("forfeit-lease", r.err());
    if (!*r) {
        std::fprintf(stderr,
                     "chargeguard vault forfeit-lease: lease %lld of vault key %s was closed or renewed "
                     "meanwhile; nothing forfeited\n",
                     static_cast<long long>(l.id), f.id.c_str());
        co_return 1;
    }
    std::fprintf(stderr,
                 "forfeited lease %lld of vault key %s (holder %s%s): %lld cents back to the cap, %lld cents "
                 "kept counted\n",
                 static_cast<long long>(l.id), f.id.c_str(), l.holder.c_str(),
                 l.expired ? ", expired" : ", not expired: forced",
                 static_cast<long long>((*r)->given_back_cents), static_cast<long long>((*r)->kept_cents));
    co_return 0;
}

}  // namespace cg::app::vault_forfeit
