#include "vault/refusals.hpp"

#include <cstdio>
#include <string>

#include "vault/proxy_state.hpp"
#include "vault/secret.hpp"

namespace cg::vault::refusals {

refusal not_found(std::string_view method, std::string_view path) {
    return {404,
            "invalid_request_error",
            "",
            "Unrecognized request URL (" + std::string(method) + ": " + std::string(path) + ").",
            {}};
}

// Stripe's error object has four types (api_error, card_error, idempotency_error, invalid_request_error):
// a key Stripe does not accept, or one outside its grant, is 401 / 403 invalid_request_error, and the SDKs
// pick StripeAuthenticationError / StripePermissionError from the status.
refusal unauthenticated(std::string_view presented) {
    return {401, "invalid_request_error", "", "Invalid vault key provided: " + redact_secret(presented), {}};
}

refusal key_unusable() {
    return {401,
            "invalid_request_error",
            "api_key_expired",
            "This vault key has been revoked or has expired.",
            {}};
}

refusal forbidden(std::string_view what) {
    return {403, "invalid_request_error", "", "This vault key does not allow " + std::string(what) + ".", {}};
}

refusal account_forbidden(std::string_view presented, std::string_view scoped_to) {
    std::string msg = scoped_to.empty()
                          ? "This vault key acts in the platform's own account only: it does not allow the "
                            "Stripe-Account " +
                                std::string(presented) + "."
                      : presented.empty() ? "This vault key acts in " + std::string(scoped_to) +
                                                " only: send Stripe-Account: " + std::string(scoped_to) + "."
                                          : "This vault key acts in " + std::string(scoped_to) +
                                                " only, not in " + std::string(presented) + ".";
    return {403, "invalid_request_error", "account_invalid", std::move(msg), {}};
}

refusal too_large(std::size_t max_body_bytes) {
    return {413,
            "invalid_request_error",
            "request_too_large",
            "The request body exceeds " + std::to_string(max_body_bytes) + " bytes.",
            {}};
}

refusal idempotency_key_required() {
    return {400, "invalid_request_error", "idempotency_key_required",
            "The vault requires an Idempotency-Key header (1 to 255 characters) on every "
            "POST, so a retry can never charge or count twice.",
            "Idempotency-Key"};
}

refusal cap_exceeded(std::int64_t cap_cents, std::int64_t committed_cents, std::string_view currency) {
    std::string msg = "This request would take the vault key's spend past its cap of " +
                      std::to_string(cap_cents) + " " + std::string(currency) + " (" +
                      std::to_string(committed_cents) + " already committed); Stripe was not contacted.";
    return {402, "invalid_request_error", "spend_cap_exceeded", msg, "amount"};
}

refusal amount_mismatch() {
    return {400,
            "idempotency_error",
            "",
            "Keys for idempotent requests can only be used with the same parameters they "
            "were first used with (the vault recorded another amount for this key).",
            {}};
}

refusal key_expired(std::chrono::seconds window) {
    return {400,
            "idempotency_error",
            "idempotency_key_expired",
            "This Idempotency-Key was first used more than " + std::to_string(window.count() / 3600) +
                " hours ago; Stripe may have forgotten it. Use a new key.",
            {}};
}

refusal vault_unavailable() {
    return {503,
            "api_error",
            "vault_unavailable",
            "The spend-cap vault cannot reach its database; nothing was sent to Stripe. Retry later.",
            {}};
}

refusal upstream_failure(bool request_sent) {
    refusal e;
    e.type = "api_error";
    if (request_sent) {
        e.status = 504;
        e.code = "upstream_timeout";
        e.message =
            "Stripe did not answer in time; the request may have been executed. Retry with the same "
            "Idempotency-Key.";
    } else {
        e.status = 502;
        e.code = "upstream_unreachable";
        e.message = "Stripe could not be reached; nothing was sent.";
    }
    return e;
}

}  // namespace cg::vault::refusals

namespace cg::vault {
namespace {

std::string next_request_id(proxy::state& st) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "req_vault_%08llx", static_cast<unsigned long long>(++st.next_request_id));
    return buf;
}

}  // namespace

http::response refuse(proxy::state& st, const refusal& r, std::optional<bool> retry) {
    auto resp = http::make_response(r.status, error_body(r), "application/json");
    resp.headers.add("Request-Id", next_request_id(st));
    if (retry) resp.headers.add("Stripe-Should-Retry", *retry ? "true" : "false");
    return resp;
}

http::response transport_failure(proxy::state& st, const http::client_result& r) {
    return refuse(st, refusals::upstream_failure(r.request_sent), true);
}

}  // namespace cg::vault
