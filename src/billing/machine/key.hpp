// The idempotency key: a content hash of stable business fields only. Never attempts, connection ids,
// nsqd addresses, timestamps or the NSQ message id — those change across redeliveries and restarts,
// and a key that changes is a second charge.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace cg::billing {

// hex(sha256(namespace ":" customer_id ":" billing_period))[:32] for the platform's own account, and
// hex(sha256(namespace ":" customer_id ":" billing_period ":" stripe_account))[:32] for an event charged on
// behalf of a connected account: the same customer id and period on two accounts are two charges, while a
// platform event keeps the key it always had (ledgers and Stripe's idempotency window depend on it). The
// inputs may not contain ':' (event validation and the --key-namespace check guarantee it), so the encoding
// is unambiguous, and an account's key never equals a platform key (one more field hashed).
std::string base_key(std::string_view key_namespace, std::string_view customer_id,
                     std::string_view billing_period, std::string_view stripe_account = {});

// The Idempotency-Key sent to Stripe: the base key for generation 1, base + "-g<N>" after. A new
// generation is only taken after listing the customer's charges shows none carrying the base key.
std::string stripe_idempotency_key(std::string_view base, std::int32_t generation);

// True when `ns` can be used as a key namespace: 1..64 characters of [A-Za-z0-9_.-].
bool valid_key_namespace(std::string_view ns);

}  // namespace cg::billing
