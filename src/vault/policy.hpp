// The proxy's pure decisions, table-tested: which operation a request is, what a create request asks for,
// what an upstream answer means for the reservation, and the Stripe-shaped error bodies. No I/O.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/result.hpp"

namespace cg::vault {

// Operation names as stored in vault_keys.allowed_endpoints.
inline constexpr std::string_view op_charges_create = "charges.create";
inline constexpr std::string_view op_intents_create = "payment_intents.create";
inline constexpr std::string_view op_charges_read = "charges.read";
inline constexpr std::string_view op_intents_read = "payment_intents.read";
inline constexpr std::string_view default_allow =
    "charges.create,payment_intents.create,charges.read,payment_intents.read";
// Refunds: only on keys issued (or set) with them, never by default — a refund spends nothing against the
// cap, but a leaked key that may refund can give a period's money away. The corrections of a billing run
// (docs/design.md §4a) need both: POST /v1/refunds, and GET /v1/refunds for the search.
inline constexpr std::string_view op_refunds_create = "refunds.create";
inline constexpr std::string_view op_refunds_read = "refunds.read";

struct operation {
    std::string name;      // one of the op_* names; empty when the endpoint is not one the vault governs
    bool creates = false;  // a POST that moves money: needs Idempotency-Key, amount, currency; is capped
    bool refund = false;   // POST /v1/refunds: needs Idempotency-Key; forwarded as sent, not capped
    // POST /v1/payment_intents/pi_…/cancel, under payment_intents.create (a key that may create intents may
    // cancel the ones it created): forwarded only for an intent the vault reserved under the key, whose
    // reservation it then releases. It moves no money and gives the cap its room back.
    bool cancel = false;
};

// The intent a POST /v1/payment_intents/pi_…/cancel path names, or empty for any other path.
std::string_view cancelled_intent(std::string_view path);

// The operation of `method path` (path without the query). POST /v1/charges and POST /v1/payment_intents
// create; GET of those collections, of one object (/v1/charges/ch_…), and /v1/charges/search read; POST
// /v1/refunds refunds and GET /v1/refunds (or one refund) reads refunds; POST
// /v1/payment_intents/pi_…/cancel cancels (named payment_intents.create). Anything else under /v1 has an
// empty name (→ 403); the caller answers 404 outside /v1.
operation operation_for(std::string_view method, std::string_view path);

// "charges.create, charges.read" → the names, validated and deduplicated, in order. Empty input → error.
result<std::vector<std::string>> parse_allow_list(std::string_view csv);

// What a create request asks for, read from its form body.
struct create_params {
    std::int64_t amount = 0;  // minor units, > 0
    std::string currency;     // lower-cased
    std::string customer;     // may be empty
    int metadata_keys = 0;    // distinct metadata keys, as Stripe's (Rack's) parser reads the names
};

// A request the proxy refuses before forwarding: HTTP status plus Stripe's error fields.
struct refusal {
    int status = 400;
    std::string type = "invalid_request_error";
    std::string code;
    std::string message;
    std::string param;
};

// The envelope of a create, checked before its body: parameters only in the body (a query string would be
// forwarded but neither counted nor stored, so the resolver's replay would differ from what was sent), and a
// body in the one encoding the proxy parses. `content_type` nullopt: absent (the proxy adds the form type);
// parameters such as "; charset=utf-8" are allowed. nullopt when the envelope is fine.
std::optional<refusal> check_create_envelope(std::string_view query,
                                             std::optional<std::string_view> content_type);

// The metadata key the proxy adds to every create so a reservation can be found on Stripe later.
inline constexpr std::string_view vault_tag_key = "cg_vault_idempotency_key";
// Stripe's limit on metadata keys; the vault needs one of them for its tag.
inline constexpr int stripe_max_metadata_keys = 50;

// Parses `amount` (a positive integer of at most 12 digits), `currency` (3 letters, must equal
// `key_currency`), `customer` and counts metadata keys. Names are read as Stripe's Rack-style parser reads
// them: a name that parser would take for amount, currency or customer without being exactly that name
// (`amount]`, `[amount`, `amount[]`, `amount[x]`), and any name it would take for
// metadata[cg_vault_idempotency_key], are refused, so what Stripe executes is what the proxy counted and
// tagged. A body that is not form-encoded, a parameter given twice, a missing or bad amount or currency, a
// currency other than the key's, or 50 metadata keys (no room for the vault's tag) → refusal (400).
std::variant<create_params, refusal> parse_create(std::string_view body, std::string_view key_currency);

// `body` plus metadata[cg_vault_idempotency_key]=<idempotency key>. parse_create has refused a body that
// names the tag itself or leaves no room for it, so every forwarded create carries exactly one tag.
// Deterministic: a retry forwards the same parameters, so Stripe replays it.
std::string with_vault_tag(std::string_view body, std::string_view idempotency_key);

// Whether the stored `body` carries the vault's tag with the value `idempotency_key`, as Stripe reads the
// form (decoded; the last value wins): only then can a search on Stripe find the request's object. A tag
// spelled in another parameter's value, or another key's tag, does not count.
bool carries_vault_tag(std::string_view body, std::string_view idempotency_key);

// What an answer from upstream means for the reservation held by the request that made it (the owner).
enum class settlement {
    settle,     // 2xx: Stripe charged (or accepted) it
    release,    // a definitive 4xx: this request did not execute and nothing was saved under its key
    uncertain,  // 409 in use, 424, 5xx, timeout, disconnect after sending: it may happen or have happened
};
// `status` 0 = no answer. `request_sent` false = no byte left (nothing can have happened: release). A 4xx
// releases (validation, decline, 401/403, 429 run before anything executes; Stripe-Should-Retry: true on
// one means "not executed, try again", which a release allows) except 409 idempotency_key_in_use: another
// request with the same key is executing right now, and it may charge; the resolver replays later.
settlement owner_settlement(int status, bool request_sent);

// The resolver's replay of an uncertain or abandoned row, and what its answer means.
struct replay_answer {
    int status = 0;                    // 0: no answer
    bool replayed = false;             // Idempotent-Replayed: true (Stripe's saved answer)
    std::optional<bool> should_retry;  // Stripe-Should-Retry
    std::string error_type;            // error.type of a non-2xx body
};
enum class replay_action {
    settle,   // 2xx: the request executed (now or before) and charged
    release,  // a definitive 4xx: validation, decline, not found: nothing moved under this key
    defer,    // try again later (backoff); never release: the answer says nothing about an earlier request
    search,   // only a search on Stripe can tell: a saved failure, or the key used with other parameters
};
// 2xx settle; 429, 401, 403, 409 and any 4xx with Stripe-Should-Retry: true defer (they run before
// idempotency, or another request with the key is executing); 400 idempotency_error searches (the key was
// used with other parameters: that request may have executed); a replayed 424/5xx searches (replaying again
// returns the same saved failure); an unreplayed one, a 3xx or no answer defers; other 4xx (400 validation,
// 402, 404) release.
replay_action replay_settlement(const replay_answer& a);

// Whether a row first reserved `age_at_read` before the resolver read it, `since_read` ago (steady clock),
// may still be replayed under its Idempotency-Key: its age now must be under `window`. A resolver pass can
// take long (many rows, each with retries), so the age read with the row is not enough on its own.
bool replay_in_window(std::chrono::seconds age_at_read, std::chrono::steady_clock::duration since_read,
                      std::chrono::seconds window);

// The longest --same-key-window: Stripe may prune a key once it is 24 h old, and a retry or the resolver's
// replay must reach Stripe before that (an hour's margin for slow passes and clock skew).
inline constexpr std::chrono::hours max_same_key_window{23};
// Why `window` cannot be the same-key window (under 1 minute, or above max_same_key_window), or nullopt.
std::optional<std::string> same_key_window_problem(std::chrono::seconds window);

// {"error":{"type":…,"code":…,"message":…,"param":…}} as Stripe writes it.
std::string error_body(const refusal& r);
std::string json_escape(std::string_view s);

// The `id` of a JSON object body ("ch_…", "pi_…"), or nullopt.
std::optional<std::string> object_id(std::string_view json_body);

}  // namespace cg::vault
