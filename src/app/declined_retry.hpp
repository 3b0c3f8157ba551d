// One retry of a declined ledger row, as `chargeguard retry-declined` and the webhook receiver's automatic
// retry (`webhooks --retry-declined-on-payment-method-change`) both run it: one code path, so the same
// rules hold whoever asks (billing/store/retry_store.hpp has why a retry is at most one success).
//
// For a declined row: a PaymentIntent the decline left open (requires_action, requires_payment_method,
// requires_confirmation) is cancelled at Stripe first, so it can never succeed beside the retry — and one
// that succeeded meanwhile (the customer authenticated it) makes the row charged instead, with nothing
// retried. Then the row is reopened under a new key generation with the retry recorded, and the event,
// rebuilt from the row, is published to the topic: `consume` charges it once under the new key. Reopen
// first, publish second: a crash in between leaves a pending row the sweeper charges (or the next run
// publishes, see below); the other order would publish an event that meets the declined row and is finished
// as a duplicate. A row already reopened by a retry and still pending is published again (harmless: the
// ledger's lease decides who charges); any other state is reported and left alone.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "billing/store/retry_store.hpp"
#include "net/tokens.hpp"

namespace cg::nsq {
class producer;
}
namespace cg::stripe {
class client;
}

namespace cg::app {

struct declined_retry_counts {
    int retried = 0, charged = 0, not_declined = 0, failed = 0;
};

struct declined_retry {
    billing::retry_store& store;
    nsq::producer& producer;
    std::string topic;
    stripe::client* stripe;       // null when Stripe is not reachable from here
    std::string stripe_unusable;  // why, then
    std::string by, reason;       // recorded with each retry
    // A row `by` retried before is not reopened by it again (a webhook event's redeliveries).
    bool once_per_requester = false;
    // One line per row: what was done, or why not. `problem`: a failure or a row left alone.
    std::function<void(std::string_view line, bool problem)> say;
    declined_retry_counts n;
};

// "key K (customer C, period P[, account A])".
std::string describe_row(const billing::retry_candidate& c);

// One row. False: nsqd refused a publish (the caller stops; the row is pending and counted failed).
net::awaitable<bool> retry_declined_row(declined_retry& x, const billing::retry_candidate& c);

}  // namespace cg::app
