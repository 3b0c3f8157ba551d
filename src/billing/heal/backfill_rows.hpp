// The backfill's reading of one listing of Stripe charges (backfill.cpp): which charges are this namespace's,
// the rows of the succeeded ones gathered for one insert, and per key the charge in flight that stands for
// its row. Pure: no I/O. Internal to billing/heal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "stripe/types.hpp"

namespace cg::billing::backfill_rows {

struct missing_rows {
    std::vector<std::string> keys, customers, periods, currencies, stripe_customers, charges, intents,
        descriptions;
    std::vector<std::int64_t> amounts, created;
    bool empty() const noexcept { return keys.empty(); }
};

// A charge of this namespace still in flight (a bank debit's `pending` charge) or failed after processing
// (a bank debit's `failed` one), kept until the window has been read: a key's succeeded charge anywhere in
// it wins, then its newest pending one, then its newest failed one.
struct in_flight_candidate {
    stripe::charge ch;
    std::string key, customer, period;
    bool failed = false;
    std::size_t order = 0;  // position in the listing, newest first
};

// The metadata of a charge this namespace made: its key is the one we would compute from its customer and
// period (the key hashes the namespace in).
struct charge_owner {
    std::string key, customer, period;
};
std::optional<charge_owner> owner_of(const stripe::charge& ch, const std::string& ns,
                                     const std::string& account);

// Adds a succeeded charge's row to one page's insert.
void add_charged(const stripe::charge& ch, const charge_owner& o, missing_rows& out);

// Keeps, per key, the in-flight candidate that stands for its row: the newest pending charge, else the
// newest failed one. The key generation of that charge is one more than the failed bank debits of the key
// listed before it in time (each failure after processing moved the key to its next generation).
std::vector<std::pair<in_flight_candidate, std::int64_t>> choose_in_flight(
    std::vector<in_flight_candidate> all, const std::set<std::string>& charged_keys);

}  // namespace cg::billing::backfill_rows
