// What this sidecar's deliveries last wrote as final: a bounded in-memory ring of their settles (key, key
// generation, the lease epochs the delivery held, the final state and Stripe's ids), kept for `keep` and at
// most `capacity` entries.
//
// With asynchronous replication a PostgreSQL failover loses the last commits: a row whose lease write reached
// the standby but whose settle did not is back at `pending`, still leased to the delivery that charged it,
// its NSQ message already FINed. Only that delivery's sidecar knows what it wrote. After a failover
// (pg::pool::on_failover) the sweeper re-applies each remembered settle whose row the new primary shows
// pending under the same key generation and a lease epoch the delivery held (no one took the row since: every
// lease write moves the epoch) through the ledger's own settle statements (mark_charged, mark_declined), so
// Stripe is never called and nothing can be charged twice. Any other row (its lease taken by another worker,
// its generation moved, settled meanwhile) is left to the normal recovery. Main executor only.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "billing/machine/decision.hpp"
#include "billing/store/ledger.hpp"
#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"

namespace cg::billing {

struct journal_entry {
    std::string key;
    std::int32_t generation = 1;
    // The lease epochs the delivery held from taking its lease (pre-flight or take) to its settle (its
    // attempt and renewals move it by one each); the new primary may hold any of them, the later ones lost
    // with it.
    lease_token first_lease = 0, last_lease = 0;
    record_status status = record_status::charged;  // charged or declined
    std::optional<std::string> charge_id, payment_intent_id, last_error;
    std::chrono::steady_clock::time_point at{};
};

class settle_journal {
  public:
    using clock = std::chrono::steady_clock;
    explicit settle_journal(std::chrono::milliseconds keep = std::chrono::minutes(5),
                            std::size_t capacity = 20'000)
        : keep_(keep), capacity_(capacity) {}

    // A settle that committed (as far as this sidecar could tell).
    void note(journal_entry e);
    // The entries noted within `keep` of `now`, oldest first.
    std::vector<journal_entry> recent(clock::time_point now = clock::now()) const;
    std::size_t size() const noexcept { return ring_.size(); }

  private:
    // An entry as kept: its strings in one allocation (the ring holds up to `capacity` entries, 20 000 by
    // default, and a journal_entry's four strings and optionals are most of its size).
    struct packed {
        std::string text;                     // key, charge id, PaymentIntent id, last error
        std::array<std::uint32_t, 3> ends{};  // where the key, the charge id, the PaymentIntent id end
        std::uint8_t present = 0;             // which of the three optionals are set (bits 0..2)
        record_status status = record_status::charged;
        std::int32_t generation = 1;
        lease_token first_lease = 0, last_lease = 0;
        clock::time_point at{};
    };
    static packed pack(const journal_entry& e);
    static journal_entry unpack(const packed& p);
    void trim(clock::time_point now);
    std::chrono::milliseconds keep_;
    std::size_t capacity_;
    std::deque<packed> ring_;
};

// Whether the row as the new primary shows it is the one `e` settled, reverted by a failover: pending, the
// same key generation, a lease epoch the delivery held. Pure.
bool reverted_by_failover(const journal_entry& e, const ledger_record& row) noexcept;

struct reapply_report {
    std::size_t checked = 0, reapplied = 0, left = 0, errors = 0;
};

// Reads each recent entry's row and re-applies the settle to the rows reverted_by_failover() accepts.
net::awaitable<reapply_report> reapply_after_failover(ledger& l, const settle_journal& j, const logger& log);

}  // namespace cg::billing
