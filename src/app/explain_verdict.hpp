// The one-line verdict of `chargeguard explain` and its state, from what app/explain_load.hpp found: the
// table docs/operating/cli.md prints. Pure: no I/O. Internal to explain.
#pragma once

#include "app/explain_render.hpp"

namespace cg::app::explain_impl {

// The verdict from what was found. Ledger first (it is the record of truth consume writes), then Stripe.
void decide(explanation& x);
// --stripe-customer: how many times the Stripe customer paid for the period.
void decide_stripe_customer(explanation& x);

}  // namespace cg::app::explain_impl
