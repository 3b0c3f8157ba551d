#include "billing/heal/sweep_sql.hpp"

#include "billing/store/abandoned_sql.hpp"
#include "billing/store/ledger.hpp"

namespace cg::billing::sweep_sql {

namespace {

// The pending rows of one key namespace ($1) with no live lease that also meet `condition`, least recently
// active first, at most $3, as the ledger's whole-row statements read them (stored columns, remaining lease,
// lease epoch) plus the event's other fields. The partial index billing_records_pending_lease_idx holds the
// pending rows.
std::string unleased_pending_sql(const std::string& condition) {
    using namespace abandoned_sql;
    return "SELECT " + stored_record_columns() +
           ", greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint, lease_epoch, "
           "description, payment_method, off_session "
           "FROM billing_records WHERE status = 'pending' AND key_namespace = $1::text AND " +
           record_unleased + " AND (" + condition + ") ORDER BY " + record_active + " LIMIT $3::bigint";
}

}  // namespace

// Pending rows whose lease expired (or was released) and whose last activity — greatest(updated_at,
// lease_until) — is older than $2 ms, or for which a webhook already brought Stripe's word of a payment (a
// deferred event: see abandoned_sql::record_has_deferred_fact).
const std::string& abandoned_rows() {
    using namespace abandoned_sql;
    static const std::string sql = unleased_pending_sql(
        record_active + " < now() - $2::bigint * interval '1 millisecond' OR " + record_has_deferred_fact);
    return sql;
}

// After a failover: pending rows of one key namespace whose last write (updated_at, kept by a trigger on
// every update) is older than $2 ms — the moment the failover was seen — whatever their age, leased or not.
// A row a live delivery or an earlier sweep wrote since is left to them. Same columns as abandoned_rows().
const std::string& failed_over_rows() {
    using namespace abandoned_sql;
    static const std::string sql =
        "SELECT " + stored_record_columns() +
        ", greatest(0, ceil(extract(epoch FROM lease_until - now()) * 1000))::bigint, lease_epoch, "
        "description, payment_method, off_session "
        "FROM billing_records WHERE status = 'pending' AND key_namespace = $1::text AND "
        "updated_at < now() - $2::bigint * interval '1 millisecond' ORDER BY " +
        record_active + " LIMIT $3::bigint";
    return sql;
}

// After a failover's grace: ends a lease the new primary still shows on a pending row that nothing wrote
// since the failover ($3 ms ago) — under the epoch it was read with ($2), so a holder's renewal, attempt,
// settle or release since (each moves the epoch and updated_at) keeps it. Set just in the past and the epoch
// moved, as a release: the recovery's take-lease statement then takes it, and a late write of the old holder
// is fenced by the epoch. Returns the row as failed_over_rows() reads it, or nothing.
const std::string& end_stale_lease() {
    static const std::string sql =
        "WITH ended AS (UPDATE billing_records SET lease_until = now() - interval '1 millisecond', "
        "lease_epoch = lease_epoch + 1 WHERE key = $1 AND status = 'pending' AND lease_epoch = $2::bigint "
        "AND updated_at < now() - $3::bigint * interval '1 millisecond' RETURNING *) "
        "SELECT " +
        stored_record_columns() +
        ", 0::bigint, lease_epoch, description, payment_method, off_session FROM ended";
    return sql;
}

// Correction revisions (billing_corrections, migration 0018) left pending by the same kind of loss: their
// lease expired (or was released) and no sign of life — planned (started_at), leased or released
// (lease_until; a release sets it just in the past), a move's Stripe attempt or renewal
// (last_stripe_attempt_at) — for longer than $2 ms; of originals in this key namespace. The revision's raw
// body is its event.
const std::string& abandoned_corrections() {
    using namespace abandoned_sql;
    static const std::string sql =
        "SELECT c.key, c.base_key, c.raw_body FROM billing_corrections c "
        "JOIN billing_records r ON r.key = c.base_key " +
        revision_moves_join + " WHERE c.status = 'pending' AND r.key_namespace = $1::text AND " +
        revision_unleased + " AND " + revision_active +
        " < now() - $2::bigint * interval '1 millisecond' ORDER BY " + revision_active + " LIMIT $3::bigint";
    return sql;
}

}  // namespace cg::billing::sweep_sql
