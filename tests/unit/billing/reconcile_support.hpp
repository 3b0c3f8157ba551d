// Helpers for the reconcile tests: an event of the expected run.
#pragma once

#include <cstdint>

#include "billing/machine/event.hpp"

namespace cg::test::reconcile_support {

// acme's 2026-11 event for Stripe customer cus_1.
inline billing::billing_event event(std::int64_t amount = 1999) {
    billing::billing_event e;
    e.customer_id = "acme";
    e.billing_period = "2026-11";
    e.amount_cents = amount;
    e.currency = "usd";
    e.stripe_customer_id = "cus_1";
    return e;
}

}  // namespace cg::test::reconcile_support
