// One row of the lab's table per (scenario, variant), and its two renderings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cg::lab {

struct row {
    std::string scenario;
    std::string variant;                    // "unsafe" | "safe"
    std::uint64_t deliveries = 0;           // messages nsqd delivered to the lab's consumers
    std::uint64_t stripe_posts = 0;         // POSTs fake-stripe received
    std::uint64_t charges_created = 0;      // succeeded charges at fake-stripe
    std::uint64_t duplicate_charges = 0;    // charges beyond the first per customer
    std::uint64_t customers_uncharged = 0;  // published customers with no charge
    std::uint64_t nsqd_timeouts = 0;        // the channel's timeout_count at nsqd
    std::uint64_t fin_failed = 0;           // E_FIN_FAILED frames the consumers received
    // Not a column: connections nsqd closed while a consumer ran (heartbeats unanswered for two intervals),
    // as opposed to the lab's own crashes and graceful stops. Printed in the notes under the table.
    std::uint64_t disconnects = 0;
};

// A fixed-width text table with a header line.
std::string render_table(const std::vector<row>& rows);
// A JSON array of objects with exactly the fields scenario, variant, deliveries, stripe_posts,
// charges_created, duplicate_charges, customers_uncharged, nsqd_timeouts, e_fin_failed.
std::string render_json(const std::vector<row>& rows);

}  // namespace cg::lab
