// vault::store: the vault keys — issued, found by id (with the key's scope), listed with what each has spent,
// revoked. The rest of the store is in store.cpp.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pg/array_literal.hpp"
#include "pg/rows.hpp"
#include "vault/store.hpp"

namespace cg::vault {
namespace {

#define CG_KEY_COLUMNS                                                                                       \
    "k.id, k.name, k.secret_hash, k.billing_period, k.cap_cents, k.currency, k.allowed_endpoints::text, "    \
    "k.expires_at, k.revoked_at, k.created_at, "                                                             \
    "(k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())), coalesce(k.stripe_account, " \
    "'')"

const std::string insert_key_sql =
    "INSERT INTO vault_keys (id, name, secret_hash, billing_period, cap_cents, currency, allowed_endpoints, "
    "expires_at, stripe_account) VALUES ($1, $2, $3, $4, $5, $6, $7::text[], $8::timestamptz, "
    "nullif($9::text, ''))";

const std::string find_key_sql = "SELECT " CG_KEY_COLUMNS " FROM vault_keys k WHERE k.id = $1";

const std::string usage_sql =
    "SELECT " CG_KEY_COLUMNS
    ", coalesce(sum(s.amount_cents - s.reopened_cents) FILTER (WHERE s.state = 'settled'), 0)::bigint, "
    "coalesce(sum(s.amount_cents) FILTER (WHERE s.state = 'reserved'), 0)::bigint, "
    "coalesce(sum(s.amount_cents) FILTER (WHERE s.state = 'uncertain'), 0)::bigint, "
    "coalesce(sum(s.amount_cents) FILTER (WHERE s.state = 'released'), 0)::bigint, k.leased_cents "
    "FROM vault_keys k LEFT JOIN vault_spend s ON s.vault_key_id = k.id "
    "WHERE $1::text IS NULL OR k.id = $1::text GROUP BY k.id ORDER BY k.created_at DESC, k.id";

const std::string revoke_sql =
    "UPDATE vault_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL";

#undef CG_KEY_COLUMNS

// {a,b,"c d"} → [a, b, c d]. Our names never need quoting, but PostgreSQL may quote anything.
std::vector<std::string> parse_text_array(std::string_view s) {
    std::vector<std::string> out;
    if (s.size() < 2 || s.front() != '{' || s.back() != '}') return out;
    s = s.substr(1, s.size() - 2);
    std::string cur;
    bool quoted = false, any = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (quoted) {
            if (c == '\\' && i + 1 < s.size())
                cur += s[++i];
            else if (c == '"')
                quoted = false;
            else
                cur += c;
        } else if (c == '"') {
            quoted = any = true;
        } else if (c == ',') {
            out.push_back(std::move(cur));
            cur.clear();
            any = false;
        } else {
            cur += c;
            any = true;
        }
    }
    if (any || !cur.empty() || !out.empty()) out.push_back(std::move(cur));
    return out;
}

key_record decode_key(const pg::rows& r, std::size_t i) {
    key_record k;
    k.id = r.get<std::string>(i, 0);
    k.name = r.get<std::string>(i, 1);
    k.secret_hash = r.get<bytes>(i, 2);
    k.billing_period = r.get<std::string>(i, 3);
    k.cap_cents = r.get<std::int64_t>(i, 4);
    k.currency = r.get<std::string>(i, 5);
    k.allowed = parse_text_array(r.get<std::string_view>(i, 6));
    k.expires_at = r.get<std::optional<pg::timestamp>>(i, 7);
    k.revoked_at = r.get<std::optional<pg::timestamp>>(i, 8);
    k.created_at = r.get<pg::timestamp>(i, 9);
    k.usable = r.get<bool>(i, 10);
    k.stripe_account = r.get<std::string>(i, 11);
    return k;
}

}  // namespace

bool key_record::allows(std::string_view op) const {
    return std::find(allowed.begin(), allowed.end(), op) != allowed.end();
}

net::awaitable<result<void>> store::insert_key(new_key k) {
    std::vector<std::optional<std::string>> allowed(k.allowed.begin(), k.allowed.end());
    pg::params p;
    p.add(k.id).add(k.name).add(k.secret_hash).add(k.billing_period).add(k.cap_cents).add(k.currency);
    p.add(pg::text_array_literal(allowed)).add(k.expires_at).add(k.stripe_account);
    auto r = co_await pg::exec_pooled(pool_, insert_key_sql, std::move(p));
    if (!r) co_return r.err();
    co_return result<void>{};
}

net::awaitable<result<std::optional<key_record>>> store::find_key(std::string id) {
    auto r = co_await pg::exec_pooled(pool_, find_key_sql, pg::params(std::move(id)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<key_record>();
    co_return std::optional<key_record>(decode_key(*r, 0));
}

net::awaitable<result<std::vector<key_usage>>> store::usage(std::optional<std::string> id) {
    auto r = co_await pg::exec_pooled(pool_, usage_sql, pg::params(id));
    if (!r) co_return r.err();
    std::vector<key_usage> out;
    for (std::size_t i = 0; i < r->size(); ++i) {
        key_usage u;
        u.key = decode_key(*r, i);
        u.settled_cents = r->get<std::int64_t>(i, 12);
        u.reserved_cents = r->get<std::int64_t>(i, 13);
        u.uncertain_cents = r->get<std::int64_t>(i, 14);
        u.released_cents = r->get<std::int64_t>(i, 15);
        u.leased_cents = r->get<std::int64_t>(i, 16);
        out.push_back(std::move(u));
    }
    co_return out;
}

net::awaitable<result<bool>> store::revoke(std::string id) {
    auto r = co_await pg::exec_pooled(pool_, revoke_sql, pg::params(std::move(id)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

}  // namespace cg::vault
