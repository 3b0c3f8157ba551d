// The sweeper's statements (sweeper.hpp): which pending rows and correction revisions it takes up, and how a
// failover sweep ends a lease nobody renewed since the failover. Parameters as each one's comment in
// sweep_sql.cpp says; the row statements read the ledger's stored columns, the remaining lease, the lease
// epoch and the event's other fields (description, payment_method, off_session), in that order.
#pragma once

#include <string>

namespace cg::billing::sweep_sql {

// Abandoned pending rows: no live lease, no activity for the sweep bound, or a deferred webhook fact.
const std::string& abandoned_rows();
// After a failover: pending rows last written before it, leased or not.
const std::string& failed_over_rows();
// After a failover's grace: ends a lease unwritten since the failover, under the epoch it was read with.
const std::string& end_stale_lease();
// Abandoned pending correction revisions: key, base key and raw body.
const std::string& abandoned_corrections();

}  // namespace cg::billing::sweep_sql
