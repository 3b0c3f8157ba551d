// The envelope of a Stripe webhook event (`{"id":"evt_…","object":"event","type":…,"created":…,
// "livemode":…,"data":{"object":{"id":…}}}`): what the receiver records about every event, whatever its
// type. Pure (simdjson); the body must already have passed the signature check.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.hpp"

namespace cg::stripe {

struct webhook_event {
    std::string id;           // evt_…: the deduplication key (Stripe delivers at least once)
    std::string type;         // payment_intent.succeeded, charge.refunded, …
    std::int64_t created;     // unix seconds, when Stripe created the event (not when it was delivered)
    bool livemode = false;    // false for test-mode events
    std::string object_id;    // data.object.id (pi_…, ch_…, dp_…); empty when the object has none
    std::string api_version;  // the API version the event's objects are rendered in; empty: none named
    // Why the event can never be stored as it is (empty: it can): a key twice in one object (PostgreSQL's
    // jsonb keeps the last, every reader here the first), a NUL character (\u0000, which jsonb and text
    // refuse), a `created` outside the years 1970 to 9999. Stripe redelivers such an event for days; the
    // receiver records the refusal once instead (app/webhook_receiver.hpp).
    std::string unstorable;
};

// The envelope, or errc::bad_response naming what is wrong: not JSON, not an object, `object` not
// "event", or `id` (non-empty, at most 255 bytes, no NUL), `type`, `created` or `data.object` missing or
// mistyped. An event that is one but can never be stored is returned with `unstorable` set.
result<webhook_event> parse_webhook_event(std::string_view body);

}  // namespace cg::stripe
