// Response bodies → typed objects (simdjson). Pure.
#pragma once

#include <optional>
#include <string_view>

#include "core/result.hpp"
#include "stripe/types.hpp"

namespace cg::stripe {

result<charge> parse_charge(std::string_view body);
result<payment_intent> parse_payment_intent(std::string_view body);
result<charge_page> parse_charge_page(std::string_view body);
result<payment_intent_page> parse_payment_intent_page(std::string_view body);
result<refund> parse_refund(std::string_view body);
result<refund_page> parse_refund_page(std::string_view body);
// The `error` object of a body, or nullopt when the body has none (or is not JSON).
std::optional<api_error> parse_error(std::string_view body);

}  // namespace cg::stripe
