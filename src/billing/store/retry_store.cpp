#include "billing/store/retry_store.hpp"

#include <string_view>

#include "billing/store/ledger_sql.hpp"
#include "pg/rows.hpp"

namespace cg::billing {
namespace {

// The candidate's columns; the event's optional fields as the sweeper reads them (migration 0011).
#define CG_RETRY_COLUMNS                                                                               \
    "key, customer_id, billing_period, amount_cents, currency, stripe_customer_id, "                   \
    "coalesce(stripe_account, ''), status, key_generation, charge_id, payment_intent_id, last_error, " \
    "coalesce(description, ''), coalesce(payment_method, ''), coalesce(off_session, true) "

const std::string retry_by_key_sql = "SELECT " CG_RETRY_COLUMNS "FROM billing_records WHERE key = $1::text";
const std::string retry_by_customer_sql =
    "SELECT " CG_RETRY_COLUMNS
    "FROM billing_records WHERE customer_id = $1::text AND billing_period = $2::text "
    "AND stripe_account IS NOT DISTINCT FROM nullif($3::text, '')";
const std::string retry_declined_in_period_sql =
    "SELECT " CG_RETRY_COLUMNS
    "FROM billing_records WHERE billing_period = $1::text AND status = 'declined' "
    "ORDER BY key";
// Declined rows by Stripe customer: billing_records_declined_stripe_customer_idx (migration 0023).
const std::string retry_declined_of_stripe_customer_sql =
    "SELECT " CG_RETRY_COLUMNS
    "FROM billing_records b WHERE stripe_customer_id = $1::text "
    "AND stripe_account IS NOT DISTINCT FROM nullif($2::text, '') AND status IN ('declined', 'pending') "
    "AND (status = 'declined' OR "
    "(status = 'pending' AND EXISTS (SELECT 1 FROM billing_retries r WHERE r.key = b.key "
    "AND r.generation = b.key_generation AND r.requested_by = $3::text))) ORDER BY key";

#undef CG_RETRY_COLUMNS

// One statement: the row lock taken by `prev` makes a concurrent retry wait, then find the row pending and
// reopen nothing. $5 (once per requester): a row `by` ever retried is not reopened by it again. The attempt
// window restarts (first_stripe_attempt_at) and no answer is open, so the redelivery charges under the new
// key at once rather than searching.
const std::string reopen_declined_sql =
    "WITH prev AS (SELECT key, status, key_generation, charge_id, payment_intent_id, last_error "
    "FROM billing_records WHERE key = $1::text AND status = 'declined' AND NOT ($5::bool AND EXISTS "
    "(SELECT 1 FROM billing_retries r WHERE r.key = $1::text AND r.requested_by = $2::text)) FOR UPDATE), "
    "reopened AS (UPDATE billing_records b SET status = 'pending', key_generation = b.key_generation + 1, "
    "indeterminate_since = NULL, charge_id = NULL, payment_intent_id = NULL, stripe_status = NULL, "
    "stripe_status_at = NULL, first_stripe_attempt_at = now(), lease_until = NULL, "
    "lease_epoch = b.lease_epoch + 1, last_error = $4::text "
    "FROM prev WHERE b.key = prev.key RETURNING b.key_generation), "
    "logged AS (" +
    std::string(ledger_sql::retry_log_insert) +
    "$2::text, $3::text FROM prev, reopened "
    "RETURNING id, key, generation, requested_at::text, requested_by, reason, previous_status, "
    "previous_charge_id, previous_payment_intent_id, previous_error) "
    "SELECT * FROM logged";

const std::string charged_by_intent_sql =
    "UPDATE billing_records SET status = 'charged', charge_id = $3::text, "
    "last_error = 'the declined payment intent succeeded after all (found by retry-declined)' "
    "WHERE key = $1::text AND status = 'declined' AND payment_intent_id = $2::text";

const std::string retries_of_sql =
    "SELECT id, key, generation, requested_at::text, requested_by, reason, previous_status, "
    "previous_charge_id, previous_payment_intent_id, previous_error FROM billing_retries "
    "WHERE key = $1::text ORDER BY generation";

const std::string superseded_sql =
    "SELECT p FROM billing_retries, unnest(ARRAY[previous_charge_id, previous_payment_intent_id]) AS p "
    "WHERE key = $1::text AND p IS NOT NULL";

retry_candidate decode_candidate(const pg::rows& r, std::size_t i) {
    retry_candidate c;
    c.key = r.get<std::string>(i, 0);
    c.event.customer_id = r.get<std::string>(i, 1);
    c.event.billing_period = r.get<std::string>(i, 2);
    c.event.amount_cents = r.get<std::int64_t>(i, 3);
    c.event.currency = r.get<std::string>(i, 4);
    c.event.stripe_customer_id = r.get<std::string>(i, 5);
    c.event.stripe_account = r.get<std::string>(i, 6);
    c.status = parse_record_status(r.text(i, 7)).value_or(record_status::pending);
    c.key_generation = r.get<std::int32_t>(i, 8);
    c.charge_id = r.get<std::optional<std::string>>(i, 9);
    c.payment_intent_id = r.get<std::optional<std::string>>(i, 10);
    c.last_error = r.get<std::optional<std::string>>(i, 11);
    c.event.description = r.get<std::string>(i, 12);
    c.event.payment_method = r.get<std::string>(i, 13);
    c.event.off_session = r.get<bool>(i, 14);
    return c;
}

retry_record decode_retry(const pg::rows& r, std::size_t i) {
    retry_record x;
    x.id = r.get<std::int64_t>(i, 0);
    x.key = r.get<std::string>(i, 1);
    x.generation = r.get<std::int32_t>(i, 2);
    x.requested_at = r.get<std::string>(i, 3);
    x.requested_by = r.get<std::string>(i, 4);
    x.reason = r.get<std::string>(i, 5);
    x.previous_status = r.get<std::string>(i, 6);
    x.previous_charge_id = r.get<std::optional<std::string>>(i, 7);
    x.previous_payment_intent_id = r.get<std::optional<std::string>>(i, 8);
    x.previous_error = r.get<std::optional<std::string>>(i, 9);
    return x;
}

}  // namespace

net::awaitable<result<std::optional<retry_candidate>>> retry_store::by_key(std::string key) {
    auto r = co_await pg::exec_pooled(pool_, retry_by_key_sql, pg::params(std::move(key)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<retry_candidate>();
    co_return std::optional<retry_candidate>(decode_candidate(*r, 0));
}

net::awaitable<result<std::optional<retry_candidate>>> retry_store::by_customer(std::string customer,
                                                                                std::string period,
                                                                                std::string stripe_account) {
    auto r = co_await pg::exec_pooled(
        pool_, retry_by_customer_sql,
        pg::params(std::move(customer), std::move(period), std::move(stripe_account)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<retry_candidate>();
    co_return std::optional<retry_candidate>(decode_candidate(*r, 0));
}

net::awaitable<result<std::vector<retry_candidate>>> retry_store::declined_in_period(std::string period) {
    auto r = co_await pg::exec_pooled(pool_, retry_declined_in_period_sql, pg::params(std::move(period)));
    if (!r) co_return r.err();
    std::vector<retry_candidate> out;
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(decode_candidate(*r, i));
    co_return out;
}

net::awaitable<result<std::vector<retry_candidate>>> retry_store::declined_of_stripe_customer(
    std::string stripe_customer, std::string stripe_account, std::string by) {
    auto r = co_await pg::exec_pooled(
        pool_, retry_declined_of_stripe_customer_sql,
        pg::params(std::move(stripe_customer), std::move(stripe_account), std::move(by)));
    if (!r) co_return r.err();
    std::vector<retry_candidate> out;
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(decode_candidate(*r, i));
    co_return out;
}

net::awaitable<result<std::optional<retry_record>>> retry_store::reopen_declined(std::string key,
                                                                                 std::string by,
                                                                                 std::string reason,
                                                                                 bool once_per_requester) {
    std::string why = "retry by " + by + ": " + reason;
    auto r = co_await pg::exec_pooled(
        pool_, reopen_declined_sql,
        pg::params(std::move(key), std::move(by), std::move(reason), why, once_per_requester));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<retry_record>();
    co_return std::optional<retry_record>(decode_retry(*r, 0));
}

net::awaitable<result<bool>> retry_store::charged_by_its_intent(std::string key,
                                                                std::string payment_intent_id,
                                                                std::string charge_id) {
    auto r = co_await pg::exec_pooled(
        pool_, charged_by_intent_sql,
        pg::params(std::move(key), std::move(payment_intent_id), std::move(charge_id)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<std::vector<retry_record>>> retry_store::retries_of(std::string key) {
    auto r = co_await pg::exec_pooled(pool_, retries_of_sql, pg::params(std::move(key)));
    if (!r) co_return r.err();
    std::vector<retry_record> out;
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(decode_retry(*r, i));
    co_return out;
}

net::awaitable<result<std::vector<std::string>>> retry_store::superseded_payments(std::string key) {
    auto r = co_await pg::exec_pooled(pool_, superseded_sql, pg::params(std::move(key)));
    if (!r) co_return r.err();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(r->get<std::string>(i, 0));
    co_return out;
}

}  // namespace cg::billing
