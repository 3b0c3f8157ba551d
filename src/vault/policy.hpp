// The proxy's pure decisions, table-tested: which operation a request is, what a create request asks for,
// what an upstream answer means for the reservation, and the Stripe-shaped error bodies. No I/O.
#pragma once

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

struct operation {
    std::string name;      // one of the op_* names; empty when the endpoint is not one the vault governs
    bool creates = false;  // a POST that moves money: needs Idempotency-Key, amount, currency; is capped
};

// The operation of `method path` (path without the query). POST /v1/charges and POST /v1/payment_intents
// create; GET of those collections, of one object (/v1/charges/ch_…), and /v1/charges/search read. Anything
// else under /v1 has an empty name (→ 403); the caller answers 404 outside /v1.
operation operation_for(std::string_view method, std::string_view path);

// "charges.create, charges.read" → the names, validated and deduplicated, in order. Empty input → error.
result<std::vector<std::string>> parse_allow_list(std::string_view csv);

// What a create request asks for, read from its form body.
struct create_params {
    std::int64_t amount = 0;  // minor units, > 0
    std::string currency;     // lower-cased
    std::string customer;     // may be empty
    int metadata_keys = 0;
};

// A request the proxy refuses before forwarding: HTTP status plus Stripe's error fields.
struct refusal {
    int status = 400;
    std::string type = "invalid_request_error";
    std::string code;
    std::string message;
    std::string param;
};

// Parses `amount` (a positive integer of at most 12 digits), `currency` (3 letters, must equal
// `key_currency`), `customer` and counts metadata keys. A body that is not form-encoded, a parameter given
// twice, a missing or bad amount or currency, or a currency other than the key's → refusal (400).
std::variant<create_params, refusal> parse_create(std::string_view body, std::string_view key_currency);

// The metadata key the proxy adds to every create so a reservation can be found on Stripe later.
inline constexpr std::string_view vault_tag_key = "cg_vault_idempotency_key";
// `body` plus metadata[cg_vault_idempotency_key]=<idempotency key>, unless the body already carries that key
// or has Stripe's maximum of 50 metadata keys (then the body is forwarded as it is, and only a same-key
// replay can resolve it). Deterministic: a retry forwards the same parameters, so Stripe replays it.
std::string with_vault_tag(std::string_view body, std::string_view idempotency_key, const create_params& p);

// What an answer from upstream means for the reservation the request holds.
enum class settlement {
    settle,     // 2xx: Stripe charged (or accepted) it
    release,    // a definitive 4xx: Stripe refused it, nothing moved
    uncertain,  // 5xx, timeout, disconnect after sending: it may have happened; keeps counting
};
// `status` 0 = no answer. `request_sent` false = no byte left (nothing can have happened: release).
settlement settlement_for(int status, bool request_sent);

// {"error":{"type":…,"code":…,"message":…,"param":…}} as Stripe writes it.
std::string error_body(const refusal& r);
std::string json_escape(std::string_view s);

// The `id` of a JSON object body ("ch_…", "pi_…"), or nullopt.
std::optional<std::string> object_id(std::string_view json_body);

}  // namespace cg::vault
