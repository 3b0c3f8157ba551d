// Whether a Stripe event says a customer's payment method changed, the way the API version the receiver
// reads (2024-06-20) renders the two events that say so:
//
//   payment_method.attached  data.object is the PaymentMethod (`"object": "payment_method"`) and its
//                            `customer` the customer it was attached to (an id, never expanded in events);
//   customer.updated         data.object is the Customer, and `data.previous_attributes` names
//                            `invoice_settings.default_payment_method`: the default changed, to the
//                            object's `invoice_settings.default_payment_method` (an id or null). Any other
//                            update (an email, metadata, a default removed) is no change of payment method.
//
// A Connect event names its account at the top (`"account": "acct_…"`); the platform's names none. Pure
// (simdjson); the body must already have passed the signature check and parse_webhook_event.
#pragma once

#include <string>
#include <string_view>

namespace cg::stripe {

struct payment_method_change {
    std::string customer;  // cus_…; empty: the event is no change of payment method (why_not says why)
    std::string account;   // acct_…, or empty: the platform's
    std::string payment_method;  // pm_…: the method attached, or the new default
    std::string why_not;
};

// payment_method.attached or customer.updated: the two event types read here.
bool names_payment_method_change(std::string_view type) noexcept;

payment_method_change read_payment_method_change(std::string_view body);

}  // namespace cg::stripe
