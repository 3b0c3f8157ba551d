// fake-stripe's webhook sender: delivers Stripe events to one configured endpoint the way Stripe does.
//
// Each delivery is an HTTP/1.1 POST of the event's pretty-printed JSON (the same bytes on every attempt)
// with Stripe's headers — `Content-Type: application/json; charset=utf-8`, `User-Agent: Stripe/1.0
// (+https://stripe.com/docs/webhooks)` — and `Stripe-Signature: t=<unix s>,v1=<hex>[,v1=<hex>…],v0=<hex>`:
// one `v1` (HMAC-SHA256 of "<t>.<body>") per configured secret, current first (Stripe signs with every
// active secret during a rotation), and the fake `v0` Stripe adds to test-mode events. Each attempt is
// signed afresh. A 2xx acknowledges the event; anything else (or no answer within the timeout) is retried
// with exponential backoff until max_attempts, then given up.
//
// Order: first attempts go out one at a time in the order events were made (so a test without faults sees
// them in order); retries run beside them. Faults: `delay_ms` (an event goes out no earlier than this after
// it was made), duplicates (the event delivered a second time, same id, after the first), reordering (the
// event held back until a later event about the same object has been delivered, or `reorder_hold_ms`
// passed), and `sign_skew_s` (signatures dated that far in the past: stale to a receiver).
//
// Everything runs on the executor given to the constructor; call the accessors there. Coroutines hold the
// sender's state, not the sender, so destroying it with deliveries under way is safe.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/log.hpp"

namespace cg::fake {

struct webhook_endpoint {
    std::string url;                          // http(s)://host:port/path; empty: nothing is delivered
    std::vector<std::string> secrets;         // whsec_…: one v1 each, current first
    std::vector<std::string> enabled_events;  // event types sent; empty or "*": all
    std::string ca_file;                      // CA bundle for an https url (empty: the system store)
    int retry_base_ms = 1000;                 // first retry after this, doubling per attempt…
    int retry_max_ms = 60000;                 // …up to this
    int max_attempts = 10;                    // then the event is given up
    int timeout_ms = 10000;                   // one attempt: connect, send, read the answer
    // The endpoint's API version: events are rendered in it (empty: the account's default version).
    std::string api_version;
};

struct webhook_faults {
    int delay_ms = 0;       // every event: first attempt no earlier than this after it was made
    int duplicate = 0;      // next N events delivered twice
    int reorder = 0;        // next N events held back behind a later event about the same object
    int duplicate_pct = 0;  // and each event with this probability (seeded)
    int reorder_pct = 0;    // likewise
    int reorder_hold_ms = 5000;
    int sign_skew_s = 0;  // signatures dated this many seconds in the past
};

// An event as the fake made it.
struct webhook_event_out {
    std::string id;     // evt_…
    std::string type;   // payment_intent.succeeded, …
    std::string group;  // the object it is about (the PaymentIntent, else the charge): reordering pairs
    std::string body;   // the exact bytes sent and signed
};

struct delivery_rec {
    std::string event_id, type;
    int attempt = 0;  // 1 for the first attempt of this copy
    int status = 0;   // HTTP status; 0: no answer (error says why)
    std::string error;
    bool duplicate = false;  // the second copy of a duplicated event
    bool reordered = false;  // it was held back behind a later event
    std::string signature;   // the Stripe-Signature header sent
    std::string body;        // the body sent
};

struct webhook_stats {
    std::uint64_t events = 0;  // events queued for delivery (enabled types, url set)
    std::uint64_t attempts = 0;
    std::uint64_t acked = 0;         // attempts answered 2xx (a duplicate's included)
    std::uint64_t acked_events = 0;  // distinct events answered 2xx at least once
    std::uint64_t failed = 0;        // attempts not answered 2xx
    std::uint64_t duplicates = 0;    // copies sent a second time
    std::uint64_t reordered = 0;
    std::uint64_t given_up = 0;     // copies that used up max_attempts
    std::uint64_t outstanding = 0;  // copies queued, held, being sent or waiting to be retried
};

class webhook_sender {
  public:
    // `unix_now` is the fake's clock (the signature's `t`).
    webhook_sender(asio::any_io_executor ex, logger log, std::function<std::int64_t()> unix_now,
                   std::uint64_t seed = 20240601);
    ~webhook_sender();
    webhook_sender(const webhook_sender&) = delete;
    webhook_sender& operator=(const webhook_sender&) = delete;

    void configure(webhook_endpoint e);
    const webhook_endpoint& endpoint() const noexcept;
    webhook_faults& faults() noexcept;
    bool enabled(const std::string& type) const;  // url set and the type enabled

    // Queues `ev` for delivery (no-op when !enabled(ev.type)).
    void send(webhook_event_out ev);

    const std::vector<delivery_rec>& deliveries() const noexcept;
    webhook_stats stats() const;
    bool idle() const;  // nothing outstanding

    // Completes when `pred()` holds (re-checked after every attempt and queueing) or after `timeout`;
    // returns pred().
    asio::awaitable<bool> wait(std::function<bool()> pred, std::chrono::milliseconds timeout);
    // Wakes the waiters to re-check their predicates (the fake calls it when its own state changes).
    void notify();

    // Drops everything queued and the records; attempts under way finish unrecorded.
    void reset();

    struct state;

  private:
    std::shared_ptr<state> st_;
};

// "t=<t>,v1=<hex>…,v0=<hex>" for `body` (what webhook_sender puts in Stripe-Signature).
std::string stripe_signature_header(const std::vector<std::string>& secrets, std::int64_t t,
                                    const std::string& body);
// Re-indents compact JSON the way Stripe prints events (two spaces, "key": value, empty {} and [] kept).
std::string pretty_json(const std::string& compact);

}  // namespace cg::fake
