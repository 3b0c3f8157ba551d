// One row of the lab's table per (scenario, variant), and its two renderings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cg::lab {

struct row {
    std::string scenario;
    // "unsafe" | "safe"; through the vault proxy "unsafe+cap C/P" | "safe+cap C/P": C cents charged at
    // Stripe against the vault key's cap of P cents (so the JSON rows carry it without another field).
    std::string variant;
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
    // Not columns either (notes under the table): the vault proxy's side of a run through it.
    struct vault_figures {
        std::int64_t expected_cents = 0;  // the period's events, summed as `vault issue --expected-file` does
        std::int64_t cap_cents = 0;       // floor(expected × 1.10)
        std::int64_t charged_cents = 0;   // succeeded charges at Stripe
        std::uint64_t posts = 0;          // creating POSTs the proxy received (its audit rows)
        std::uint64_t refused = 0;        // of those, refused with spend_cap_exceeded
        std::uint64_t forwarded = 0;      // of those, sent on to Stripe
    };
    std::optional<vault_figures> vault;
};

// A fixed-width text table with a header line.
std::string render_table(const std::vector<row>& rows);
// A JSON array of objects with exactly the fields scenario, variant, deliveries, stripe_posts,
// charges_created, duplicate_charges, customers_uncharged, nsqd_timeouts, e_fin_failed.
std::string render_json(const std::vector<row>& rows);
// The variant column: "unsafe+cap 11055/11060" for a run through the vault proxy.
std::string variant_label(const std::string& base, const std::optional<row::vault_figures>& v);
// One line per run through the vault proxy: the cap, what was charged against it, what the proxy refused.
std::string render_vault_notes(const std::vector<row>& rows);

}  // namespace cg::lab
