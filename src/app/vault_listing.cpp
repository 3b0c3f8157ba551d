// `chargeguard vault list` and `vault show` (app/vault_listing.hpp): a key's spend (settled, reserved,
// uncertain, released) against its cap, and its audit rows, as text for a person or JSON for a script.
#include "app/vault_listing.hpp"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "app/pg_flags.hpp"
#include "pg/types.hpp"
#include "vault/cap.hpp"
#include "vault/policy.hpp"

namespace cg::app::vault_listing {
namespace {

std::string json_str(const std::string& s) {
    return "\"" + vault::json_escape(s) + "\"";
}

std::string lease_json(const vault::store::open_lease& l) {
    return "{\"lease\":" + std::to_string(l.id) + ",\"holder\":" + json_str(l.holder) +
           ",\"held_cents\":" + std::to_string(l.held()) +
           ",\"granted_cents\":" + std::to_string(l.granted_cents) +
           ",\"spent_cents\":" + std::to_string(l.spent_cents) +
           ",\"taken_at\":" + json_str(pg::format_timestamptz(l.taken_at)) +
           ",\"expires_at\":" + json_str(pg::format_timestamptz(l.expires_at)) +
           ",\"expired\":" + (l.expired ? "true" : "false") + "}";
}

std::string usage_json(const vault::key_usage& u) {
    const auto& k = u.key;
    std::string allowed;
    for (const auto& a : k.allowed) allowed += (allowed.empty() ? "" : ",") + json_str(a);
    auto ts = [](const std::optional<pg::timestamp>& t) {
        return t ? json_str(pg::format_timestamptz(*t)) : std::string("null");
    };
    return "{\"id\":" + json_str(k.id) + ",\"name\":" + json_str(k.name) +
           ",\"period\":" + json_str(k.billing_period) + ",\"currency\":" + json_str(k.currency) +
           ",\"cap_cents\":" + std::to_string(k.cap_cents) +
           ",\"settled_cents\":" + std::to_string(u.settled_cents) +
           ",\"reserved_cents\":" + std::to_string(u.reserved_cents) +
           ",\"uncertain_cents\":" + std::to_string(u.uncertain_cents) +
           ",\"released_cents\":" + std::to_string(u.released_cents) +
           ",\"leased_cents\":" + std::to_string(u.leased_cents) + ",\"utilisation_pct\":" +
           vault::format_percent_bp(vault::utilisation_bp(u.committed(), k.cap_cents)) + ",\"allowed\":[" +
           allowed + "],\"expires_at\":" + ts(k.expires_at) + ",\"revoked_at\":" + ts(k.revoked_at) +
           ",\"created_at\":" + json_str(pg::format_timestamptz(k.created_at)) +
           ",\"usable\":" + (k.usable ? "true" : "false") + ",\"stripe_account\":" +
           (k.stripe_account.empty() ? std::string("null") : json_str(k.stripe_account)) + "}";
}

void print_table(const std::vector<vault::key_usage>& keys) {
    std::printf("%-16s  %-20s  %-10s  %-3s  %14s  %14s  %12s  %12s  %12s  %7s  %-22s  %s\n", "ID", "NAME",
                "PERIOD", "CUR", "CAP", "SETTLED", "RESERVED", "UNCERTAIN", "LEASED", "USED%", "EXPIRES",
                "REVOKED");
    for (const auto& u : keys) {
        const auto& k = u.key;
        std::printf(
            "%-16s  %-20.20s  %-10.10s  %-3s  %14lld  %14lld  %12lld  %12lld  %12lld  %7s  %-22s  %s\n",
            k.id.c_str(), k.name.c_str(), k.billing_period.c_str(), k.currency.c_str(),
            static_cast<long long>(k.cap_cents), static_cast<long long>(u.settled_cents),
            static_cast<long long>(u.reserved_cents), static_cast<long long>(u.uncertain_cents),
            static_cast<long long>(u.leased_cents),
            vault::format_percent_bp(vault::utilisation_bp(u.committed(), k.cap_cents)).c_str(),
            timestamp_or_dash(k.expires_at).c_str(), timestamp_or_dash(k.revoked_at).c_str());
    }
}

}  // namespace

int fail(const char* what, const error& e) {
    std::fprintf(stderr, "chargeguard vault %s: %s\n", what, e.describe().c_str());
    return 1;
}

net::awaitable<int> list(vault::store& s, bool json) {
    auto keys = co_await s.usage();
    if (!keys) co_return fail("list", keys.err());
    if (json) {
        std::printf("[");
        for (std::size_t i = 0; i < keys->size(); ++i)
            std::printf("%s%s", i ? ",\n " : "", usage_json((*keys)[i]).c_str());
        std::printf("]\n");
    } else {
        print_table(*keys);
    }
    co_return 0;
}

net::awaitable<int> show(vault::store& s, std::string id, int audit_rows, bool json) {
    auto keys = co_await s.usage(id);
    if (!keys) co_return fail("show", keys.err());
    if (keys->empty()) {
        std::fprintf(stderr, "chargeguard vault show: no vault key %s\n", id.c_str());
        co_return 1;
    }
    auto leases = co_await s.open_leases(id);
    if (!leases) co_return fail("show", leases.err());
    auto audit = co_await s.recent_audit(id, audit_rows);
    if (!audit) co_return fail("show", audit.err());
    const auto& u = keys->front();
    if (json) {
        std::string rows;
        for (const auto& a : *audit) {
            rows +=
                std::string(rows.empty() ? "" : ",") + "{\"at\":" + json_str(pg::format_timestamptz(*a.at)) +
                ",\"method\":" + json_str(a.method) + ",\"path\":" + json_str(a.path) +
                ",\"amount_cents\":" + (a.amount_cents ? std::to_string(*a.amount_cents) : "null") +
                ",\"idempotency_key\":" + (a.idempotency_key ? json_str(*a.idempotency_key) : "null") +
                ",\"upstream_status\":" + (a.upstream_status ? std::to_string(*a.upstream_status) : "null") +
                ",\"outcome\":" + json_str(a.outcome) + ",\"latency_ms\":" + std::to_string(a.latency_ms) +
                "}";
        }
        std::string open;
        for (const auto& l : *leases) open += (open.empty() ? "" : ",") + lease_json(l);
        std::printf("{\"key\":%s,\"leases\":[%s],\"audit\":[%s]}\n", usage_json(u).c_str(), open.c_str(),
                    rows.c_str());
        co_return 0;
    }
    print_table(*keys);
    std::string allowed;
    for (const auto& a : u.key.allowed) allowed += (allowed.empty() ? "" : ",") + a;
    std::printf("\nallows %s; acts in %s; created %s; released %lld\n", allowed.c_str(),
                u.key.stripe_account.empty() ? "the platform's account" : u.key.stripe_account.c_str(),
                pg::format_timestamptz(u.key.created_at).c_str(), static_cast<long long>(u.released_cents));
    // An open lease past its expiry has no holder renewing it: a dead proxy's, stranded until forfeited.
    std::printf("\n%zu open cap leases%s\n", leases->size(), leases->empty() ? "" : ":");
    for (const auto& l : *leases)
        std::printf("  lease %lld  holder %s  held %lld cents  taken %s  expires %s%s\n",
                    static_cast<long long>(l.id), l.holder.c_str(), static_cast<long long>(l.held()),
                    pg::format_timestamptz(l.taken_at).c_str(), pg::format_timestamptz(l.expires_at).c_str(),
                    l.expired ? "  (expired: stranded, see vault forfeit-lease)" : "");
    std::printf("\nlast %zu audit rows:\n", audit->size());
    for (const auto& a : *audit)
        std::printf("  %s  %-4s %-24s %10s  %-24.24s  %3s  %-16s %8.2f ms\n",
                    pg::format_timestamptz(*a.at).c_str(), a.method.c_str(), a.path.c_str(),
                    a.amount_cents ? std::to_string(*a.amount_cents).c_str() : "-",
                    a.idempotency_key.value_or("-").c_str(),
                    a.upstream_status ? std::to_string(*a.upstream_status).c_str() : "-", a.outcome.c_str(),
                    a.latency_ms);
    co_return 0;
}

}  // namespace cg::app::vault_listing
