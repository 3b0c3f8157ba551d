// The vault proxy's checks before anything is reserved or forwarded (vault/proxy_state.hpp): the path, the
// presented vault secret and its key, the key's scope and connected account, and for a write its
// Idempotency-Key, its size and its create parameters.
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "vault/proxy_state.hpp"
#include "vault/refusals.hpp"
#include "vault/secret.hpp"

namespace cg::vault {
namespace {

// What every request that moves money must be, refunds and creates alike: a body within the bound and an
// Idempotency-Key Stripe accepts, which the audit line records. The refusal, or nullopt to go on.
std::optional<http::response> refuse_unkeyed_write(proxy::state& s, const http::request& req,
                                                   ledger_line& l) {
    if (req.body_size() > s.cfg.max_body_bytes)
        return finish(s, l, "too_large", refuse(s, refusals::too_large(s.cfg.max_body_bytes), false));
    auto idem = req.headers.get("Idempotency-Key").value_or("");
    if (idem.empty() || idem.size() > 255)
        return finish(s, l, "bad_request", refuse(s, refusals::idempotency_key_required(), false));
    l.row.idempotency_key = std::string(idem);
    return std::nullopt;
}

// The presented vault secret: "Authorization: Bearer cgvk_…", what the SDKs send.
std::string presented_secret(const http::request& req) {
    auto h = req.headers.get("Authorization").value_or("");
    if (h.size() > 7 && iequals(h.substr(0, 7), "Bearer ")) return std::string(h.substr(7));
    return {};
}

}  // namespace

// Every check that needs neither a reservation nor the upstream: the path, the key and its scope, and for a
// write its Idempotency-Key and body. The refusal (finished), or what the request goes on with.
// Fills `c` and returns nullopt when the request goes on.
net::awaitable<std::optional<http::response>> check_request(state_ptr st, http::request& req, ledger_line& l,
                                                            checked& c) {
    l.row.method = req.method.empty() ? "?" : req.method;
    l.row.path = req.path().empty() ? "/" : std::string(req.path());
    if (!l.row.path.starts_with("/v1/"))
        co_return finish(*st, l, "not_found",
                         refuse(*st, refusals::not_found(req.method, l.row.path), false));
    auto secret = presented_secret(req);
    auto id = secret_id(secret);
    auto unauth = refusals::unauthenticated(secret);
    if (!id) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    auto op = operation_for(req.method, req.path());
    if (st->cfg.key_cache_ttl.count() > 0 && st->key_reads.contains(*id)) co_await await_key_read(st, *id);
    auto key = co_await find_key(st, *id, op.creates);
    if (!key) co_return unavailable(*st, l, key.err());
    if (!*key) co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    // A wrong secret for a real id is audited under that id: someone is guessing that key.
    l.row.key_id = (*key)->id;
    if (!verify_secret(secret, (*key)->secret_hash))
        co_return finish(*st, l, "unauthenticated", refuse(*st, unauth, false));
    if (!(*key)->usable)
        co_return finish(*st, l, "unauthenticated", refuse(*st, refusals::key_unusable(), false));
    l.authed = ledger_line::clock::now();
    if (op.name.empty() || !(*key)->allows(op.name)) {
        std::string what = op.name.empty() ? req.method + " " + l.row.path : op.name;
        co_return finish(*st, l, "forbidden", refuse(*st, refusals::forbidden(what), false));
    }
    // Stripe Connect: a key acts in exactly one account — its connected account, or the platform's own — and
    // a request for any other is refused, never forwarded (the cap counts one account's spend).
    auto presented_account = req.headers.get("Stripe-Account");
    if (presented_account.value_or("") != (*key)->stripe_account ||
        (presented_account && presented_account->empty()))
        co_return finish(
            *st, l, "forbidden",
            refuse(*st, refusals::account_forbidden(presented_account.value_or(""), (*key)->stripe_account),
                   false));
    if (op.refund || op.creates)
        if (auto refused = refuse_unkeyed_write(*st, req, l)) co_return std::move(*refused);
    if (op.creates) {
        // Only the body is counted, stored and replayed: a query string or another encoding would make what
        // Stripe executes differ from what the vault reserved.
        if (auto bad = check_create_envelope(req.query(), req.headers.get("Content-Type")))
            co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
        // The body as the server left it: in the connection, read again once the request may go on.
        auto body = req.peek_body();
        if (!body) co_return client_gone(*st, l, true);
        auto parsed = parse_create(*body, (*key)->currency);
        std::string().swap(*body);
        if (auto* bad = std::get_if<refusal>(&parsed))
            co_return finish(*st, l, "bad_request", refuse(*st, *bad, false));
        c.create = std::move(std::get<create_params>(parsed));
        l.row.amount_cents = c.create.amount;
    }
    c.op = std::move(op);
    c.key_id = (*key)->id;
    c.key_currency = (*key)->currency;
    co_return std::nullopt;
}

}  // namespace cg::vault
