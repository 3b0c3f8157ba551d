// The proxy's own answers, Stripe-shaped (type, code, message, param), for every request it does not
// forward or whose forwarding failed. Pure: the request path (proxy.cpp) turns one into a response with a
// Request-Id and, where it matters, Stripe-Should-Retry.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "vault/policy.hpp"

namespace cg::vault::refusals {

// Not under /v1/ (Stripe's wording for an unknown URL).
refusal not_found(std::string_view method, std::string_view path);
// No vault key, an unknown one, or a wrong secret; only a redacted form of `presented` is echoed.
refusal unauthenticated(std::string_view presented);
// A revoked or expired key: refused when its row is read and again when the reservation step finds it so.
refusal key_unusable();
// The key's allow list does not name `what` (an operation, or "METHOD path" when none matches).
refusal forbidden(std::string_view what);
// A Stripe-Account the key may not act in: `presented` (empty: none sent) against the key's own account
// (empty: the platform's). 403 invalid_request_error / account_invalid, Stripe's code for a Stripe-Account
// the request may not name.
refusal account_forbidden(std::string_view presented, std::string_view scoped_to);
refusal too_large(std::size_t max_body_bytes);
refusal idempotency_key_required();
// 402 with type invalid_request_error and code spend_cap_exceeded. stripe-node picks the error class from
// the status alone (402 → StripeCardError), so `type` only decides what callers branching on err.rawType
// see: card_error would tell them "the customer's card failed" and start dunning (ask the customer for a
// new card) for what is our own budget; invalid_request_error says "this request cannot succeed as sent",
// and err.code === 'spend_cap_exceeded' names why. chargeguard's own client maps 402 + spend_cap_exceeded
// to cap_blocked whatever the type.
refusal cap_exceeded(std::int64_t cap_cents, std::int64_t committed_cents, std::string_view currency);
// The Idempotency-Key was first used with another amount.
refusal amount_mismatch();
// The Idempotency-Key was first used longer ago than `window` (Stripe may have pruned it).
refusal key_expired(std::chrono::seconds window);
// PostgreSQL unreachable: nothing was forwarded.
refusal vault_unavailable();
// A transport failure: 502 when nothing reached Stripe (safe to retry), 504 when the request went out and
// no answer came (retry with the same Idempotency-Key: Stripe replays or executes once).
refusal upstream_failure(bool request_sent);

}  // namespace cg::vault::refusals
