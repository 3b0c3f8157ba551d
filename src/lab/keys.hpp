// The idempotency keys the lab's unsafe consumers use — every one a mistake found in real consumers — and
// the content key the real pipeline uses (billing/machine/key.hpp). Pure: everything a key depends on is
// passed in, so the table below is what makes each key change (or not) across a redelivery.
//
//   policy          built from                                  changes when
//   content         namespace, customer, period                 never (the fix)
//   attempts        content + NSQ Attempts                      every redelivery
//   connection      content + a UUID drawn per consumer          a consumer restart / reconnect
//   nsqd_address    content + the nsqd the message came from     another nsqd, a broker on a new address
//   call_time       content + the time of the Stripe call        every call
//   message_id      the NSQ message id                           a producer re-publish (new id)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cg::lab {

enum class key_policy { content, attempts, connection, nsqd_address, call_time, message_id };

std::string_view to_string(key_policy p) noexcept;
std::optional<key_policy> parse_key_policy(std::string_view s) noexcept;

// What a consumer could know about one delivery when it builds a key.
struct key_inputs {
    std::string key_namespace;
    std::string customer_id;
    std::string billing_period;
    std::uint16_t attempts = 1;
    std::string connection_uuid;
    std::string nsqd_address;
    std::int64_t call_time_ns = 0;
    std::string message_id;
};

// The Idempotency-Key `p` sends to Stripe (≤ 255 characters).
std::string make_key(key_policy p, const key_inputs& in);

// A random RFC 4122 version 4 UUID (the "per-connection id" some consumers mint on connect).
std::string random_uuid();

}  // namespace cg::lab
