// Helpers for the settlement step's tests: a row and the facts a payment can produce, folded in order, and
// the printing of the step's enums in a failed check.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "billing/machine/settlement.hpp"

namespace cg::billing {
inline std::ostream& operator<<(std::ostream& o, record_status s) {
    return o << to_string(s);
}
inline std::ostream& operator<<(std::ostream& o, fact_kind k) {
    return o << to_string(k);
}
inline std::ostream& operator<<(std::ostream& o, settle_result r) {
    return o << to_string(r);
}
inline std::ostream& operator<<(std::ostream& o, payment_link l) {
    return o << to_string(l);
}
}  // namespace cg::billing

namespace cg::test::settlement_support {

using namespace cg::billing;

inline constexpr std::int64_t amount = 1999;

inline settlement_row row(record_status s) {
    settlement_row r;
    r.status = s;
    r.amount_cents = amount;
    r.payment_intent_id = "pi_1";
    if (s == record_status::charged) r.charge_id = "ch_1";
    return r;
}

inline payment_fact fact(fact_kind k, std::string status = {}) {
    payment_fact f;
    f.kind = k;
    f.source = std::string(to_string(k));
    f.payment_intent_id = "pi_1";
    f.charge_id = "ch_1";
    f.status = std::move(status);
    return f;
}

inline payment_fact refund(std::int64_t cumulative) {
    auto f = fact(fact_kind::refunded, "succeeded");
    f.amount_refunded = cumulative;
    return f;
}

inline payment_fact dispute(fact_kind k, std::string status, std::int64_t amt = amount) {
    auto f = fact(k, std::move(status));
    f.dispute_amount = amt;
    return f;
}

inline settlement_row fold(settlement_row r, const std::vector<payment_fact>& fs) {
    for (const auto& f : fs) r = apply_fact(r, f).row;
    return r;
}

}  // namespace cg::test::settlement_support
