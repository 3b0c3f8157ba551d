#include "billing/store/ledger.hpp"

#include <algorithm>
#include <vector>

#include "billing/store/ledger_runners.hpp"
#include "billing/store/ledger_sql.hpp"
#include "pg/pipeline.hpp"
#include "pg/rows.hpp"

namespace cg::billing {
namespace {

using ms = std::chrono::milliseconds;

using namespace ledger_sql;
using namespace ledger_detail;

std::optional<sys_time> to_sys(std::optional<pg::timestamp> t) {
    if (!t) return std::nullopt;
    return sys_time(*t);
}

}  // namespace

const std::string& stored_record_columns() {
    static const std::string columns = ledger_sql::stored_columns;
    return columns;
}

ledger_record decode_stored_record_columns(const pg::rows& r, std::size_t i) {
    ledger_record rec;
    rec.key = r.get<std::string>(i, record_col::key);
    rec.customer_id = r.get<std::string>(i, record_col::customer_id);
    rec.billing_period = r.get<std::string>(i, record_col::billing_period);
    rec.amount_cents = r.get<std::int64_t>(i, record_col::amount_cents);
    rec.currency = r.get<std::string>(i, record_col::currency);
    rec.stripe_customer_id = r.get<std::string>(i, record_col::stripe_customer_id);
    auto status = parse_record_status(r.get<std::string_view>(i, record_col::status));
    // The CHECK constraint lists the same states: anything else means schema and code disagree.
    if (!status)
        throw pg::column_error("billing_records.status: unknown value " +
                               r.get<std::string>(i, record_col::status));
    rec.status = *status;
    rec.charge_id = r.get<std::optional<std::string>>(i, record_col::charge_id);
    rec.key_generation = r.get<std::int32_t>(i, record_col::key_generation);
    rec.indeterminate_since = to_sys(r.get<std::optional<pg::timestamp>>(i, record_col::indeterminate_since));
    rec.lease_until = to_sys(r.get<std::optional<pg::timestamp>>(i, record_col::lease_until));
    rec.first_stripe_attempt_at =
        to_sys(r.get<std::optional<pg::timestamp>>(i, record_col::first_stripe_attempt_at));
    rec.stripe_attempts = r.get<std::int32_t>(i, record_col::stripe_attempts);
    rec.stripe_account = r.get<std::optional<std::string>>(i, record_col::stripe_account).value_or("");
    return rec;
}

namespace {

std::int64_t millis(ms d) {
    return static_cast<std::int64_t>(d.count());
}

}  // namespace

namespace ledger_detail {

// One lease-extending statement: as exec(), with the statement's deadline appended as the last parameter
// (see take_sql). The deadline is taken after the connection is acquired, right before sending, from the
// same timeout the connection enforces. Returns the single row the statement always produces, or
// errc::timeout when the database saw the statement only after its deadline and it changed nothing
// (`changed` says whether the row carries the statement's effect; `late_col` is the late flag's column).
net::awaitable<result<pg::rows>> exec_with_deadline(std::shared_ptr<pg::pool> pool, const std::string& sql,
                                                    pg::params p, int late_col) {
    auto c = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!c) co_return c.err();
    auto& conn = **c;
    auto timeout = conn.options().query_timeout;
    // No client timeout (zero) means the client never abandons the statement for time: no deadline worth
    // checking, but the parameter stays, so a far one.
    auto window = timeout > ms::zero() ? timeout : std::chrono::duration_cast<ms>(std::chrono::hours(1));
    auto deadline =
        std::chrono::time_point_cast<std::chrono::microseconds>(std::chrono::system_clock::now() + window);
    p.add(pg::timestamp(deadline));
    auto r = co_await conn.query_with(sql, std::move(p), timeout);
    if (!r) co_return r.err();
    if (r->size() != 1) co_return error(pg::errc::protocol_error, "lease statement: expected one row");
    if (r->is_null(0, 0) && (*r)[0].get<bool>(late_col))
        co_return error(pg::errc::timeout,
                        "the database received the lease statement after its deadline and ignored it "
                        "(a stalled connection, or the database clock ahead of ours)");
    co_return r;
}

}  // namespace ledger_detail

namespace {

// One atomic batch (pipeline mode, one sync): the first failing statement's error, or every result.
net::awaitable<result<std::vector<pg::rows>>> exec_batch(std::shared_ptr<pg::pool> pool, pg::pipeline batch) {
    auto c = co_await pool->acquire(pg::acquire_mode::wait_for_server);
    if (!c) co_return c.err();
    auto r = co_await (*c)->run(batch);
    if (!r) co_return r.err();
    std::vector<pg::rows> out;
    out.reserve(r->size());
    // The failing statement reports its own error; the others pipeline_aborted / rolled_back: report the
    // cause.
    for (auto& one : *r)
        if (!one && one.code() != pg::errc::pipeline_aborted && one.code() != pg::errc::rolled_back)
            co_return one.err();
    for (auto& one : *r) {
        if (!one) co_return one.err();
        out.push_back(std::move(*one));
    }
    co_return out;
}

void add_letter(pg::pipeline& batch, dead_letter l) {
    batch.add(letter_lock_sql, l.nsq_message_id);
    pg::params p;
    p.add(std::move(l.topic)).add(std::move(l.channel)).add(std::move(l.nsq_message_id)).add(l.attempts);
    p.add(std::span(reinterpret_cast<const std::uint8_t*>(l.raw_body.data()), l.raw_body.size()));
    p.add(std::move(l.reason)).add(l.billing_key);
    batch.add_params(letter_insert_sql, std::move(p));
}
}  // namespace

struct ledger::batchers {
    std::shared_ptr<group_commit<preflight_req, preflight_out, preflight_runner>> preflight;
    std::shared_ptr<group_commit<settle_req, bool, settle_runner>> settle;
};

ledger::ledger(std::shared_ptr<pg::pool> pool, ledger_options opts) : pool_(std::move(pool)), opts_(opts) {
    if (!opts_.batch.enabled) return;
    auto options_for = [this](std::string_view statement) {
        auto o = opts_.batch;
        if (!o.linger) o.linger = [linger = linger_] { return *linger; };
        if (opts_.on_batch)
            o.on_statement = [f = opts_.on_batch, statement](std::size_t rows) { f(statement, rows); };
        return o;
    };
    batch_ = std::make_shared<batchers>();
    batch_->preflight = std::make_shared<group_commit<preflight_req, preflight_out, preflight_runner>>(
        pool_, options_for("preflight"));
    batch_->settle =
        std::make_shared<group_commit<settle_req, bool, settle_runner>>(pool_, options_for("settle"));
}

ledger::~ledger() = default;

ledger_batch_counters ledger::batch_counters() const {
    if (!batch_) return {};
    return {batch_->preflight->counters(), batch_->settle->counters()};
}

net::awaitable<result<preflight_result>> ledger::preflight(new_record rec, std::chrono::milliseconds lease) {
    preflight_req q{std::move(rec), millis(lease)};
    // (No co_await inside a conditional expression: g++ 12 miscompiles it.)
    result<preflight_out> ins = error(pg::errc::protocol_error, "not run");
    if (batch_)
        ins = co_await batch_->preflight->submit(std::move(q));  // a conflict left unread gives q back
    else
        ins = co_await preflight_insert_one(pool_, q);
    if (!ins) co_return ins.err();
    if (ins->inserted) co_return preflight_result{true, std::move(*ins->row)};
    if (ins->row) co_return preflight_result{false, std::move(*ins->row)};
    if (ins->unread) q.rec = std::move(*ins->unread);
    auto& r = q.rec;
    auto existing =
        co_await exec(pool_, preflight_existing_sql,
                      pg::params(r.key, r.event.customer_id, r.event.billing_period, r.event.stripe_account));
    if (!existing) co_return existing.err();
    // Rows are never deleted, so the conflicting row is there; if not, something outside the design did it.
    if (existing->empty())
        co_return error(pg::errc::protocol_error, "pre-flight conflicted but no row matches key " + r.key);
    co_return preflight_result{false, decode_record(*existing, 0)};
}

net::awaitable<result<std::optional<ledger_record>>> ledger::find(std::string key) {
    auto r = co_await exec(pool_, find_sql, pg::params(std::move(key)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<ledger_record>();
    co_return std::optional<ledger_record>(decode_record(*r, 0));
}

net::awaitable<result<std::optional<ledger_record>>> ledger::take_expired_lease(
    std::string key, std::chrono::milliseconds lease, std::string nsq_message_id, std::int32_t nsq_attempts) {
    auto r = co_await exec_with_deadline(
        pool_, take_sql, pg::params(std::move(key), millis(lease), std::move(nsq_message_id), nsq_attempts),
        take_late_column);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<ledger_record>();
    co_return std::optional<ledger_record>(decode_record(*r, 0));
}

net::awaitable<result<std::optional<lease_token>>> ledger::renew_lease(std::string key, lease_token held,
                                                                       std::chrono::milliseconds lease) {
    auto r =
        co_await exec_with_deadline(pool_, renew_sql, pg::params(std::move(key), held, millis(lease)), 1);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<lease_token>();
    co_return std::optional<lease_token>((*r)[0].get<std::int64_t>(0));
}

net::awaitable<result<std::optional<attempt_record>>> ledger::record_attempt(
    std::string key, lease_token held, std::chrono::milliseconds lease) {
    auto r =
        co_await exec_with_deadline(pool_, attempt_sql, pg::params(std::move(key), held, millis(lease)), 3);
    if (!r) co_return r.err();
    if (r->is_null(0, 0)) co_return std::optional<attempt_record>();
    auto [gen, attempts, epoch] = (*r)[0].as<std::int32_t, std::int32_t, std::int64_t>();
    co_return std::optional<attempt_record>(attempt_record{gen, attempts, epoch});
}

net::awaitable<result<bool>> ledger::settle(std::string key, record_status status,
                                            std::optional<std::string> charge_id,
                                            std::optional<std::string> last_error,
                                            std::optional<dead_letter> letter,
                                            std::optional<std::string> payment_intent_id) {
    if (!letter) {
        settle_req q{std::move(key), status, std::move(charge_id), std::move(last_error),
                     std::move(payment_intent_id)};
        if (batch_) co_return co_await batch_->settle->submit(std::move(q));
        co_return co_await settle_one(pool_, q);
    }
    pg::pipeline batch;
    batch.add(settle_sql, std::move(key), std::string(to_string(status)), std::move(charge_id),
              std::move(last_error), std::move(payment_intent_id));
    add_letter(batch, std::move(*letter));
    auto r = co_await exec_batch(pool_, std::move(batch));
    if (!r) co_return r.err();
    co_return (*r)[0].affected() == 1;
}

net::awaitable<result<bool>> ledger::mark_charged(std::string key, std::string charge_id,
                                                  std::optional<std::string> payment_intent_id) {
    co_return co_await settle(std::move(key), record_status::charged, std::move(charge_id), std::nullopt,
                              std::nullopt, std::move(payment_intent_id));
}

net::awaitable<result<bool>> ledger::mark_declined(std::string key, std::optional<std::string> charge_id,
                                                   std::string last_error,
                                                   std::optional<std::string> payment_intent_id) {
    co_return co_await settle(std::move(key), record_status::declined, std::move(charge_id),
                              std::move(last_error), std::nullopt, std::move(payment_intent_id));
}

net::awaitable<result<bool>> ledger::mark_processing(std::string key, std::optional<std::string> charge_id,
                                                     std::optional<std::string> payment_intent_id,
                                                     std::string stripe_status, dead_letter delivery) {
    pg::params p;
    p.add(std::move(key))
        .add(std::move(charge_id))
        .add(std::move(payment_intent_id))
        .add(std::move(stripe_status));
    p.add(std::move(delivery.topic)).add(std::move(delivery.channel)).add(std::move(delivery.nsq_message_id));
    p.add(delivery.attempts);
    p.add(
        std::span(reinterpret_cast<const std::uint8_t*>(delivery.raw_body.data()), delivery.raw_body.size()));
    auto r = co_await exec(pool_, processing_sql, std::move(p));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bool>> ledger::mark_cap_blocked(std::string key, std::string last_error,
                                                      dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::cap_blocked, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_conflict(std::string key, std::string last_error,
                                                   dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::conflict, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_failed(std::string key, std::string last_error,
                                                 dead_letter letter) {
    co_return co_await settle(std::move(key), record_status::failed, std::nullopt, std::move(last_error),
                              std::move(letter));
}

net::awaitable<result<bool>> ledger::mark_indeterminate(std::string key, lease_token held,
                                                        std::string last_error) {
    auto r = co_await exec(pool_, indeterminate_sql, pg::params(std::move(key), held, std::move(last_error)));
    if (!r) co_return r.err();
    co_return !r->empty() && (*r)[0].get<bool>(0);
}

net::awaitable<result<bool>> ledger::release_lease(std::string key, lease_token held,
                                                   std::string last_error) {
    auto r = co_await exec(pool_, release_sql, pg::params(std::move(key), held, std::move(last_error)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bump_result>> ledger::bump_generation(std::string key, lease_token held,
                                                            std::int32_t from_generation,
                                                            std::chrono::milliseconds quiet) {
    auto r = co_await exec(pool_, bump_sql, pg::params(std::move(key), held, from_generation, millis(quiet)));
    if (!r) co_return r.err();
    bump_result out;
    if (!r->empty()) {
        out.generation = (*r)[0].get<std::optional<std::int32_t>>(0);
        if (auto w = (*r)[0].get<std::optional<std::int64_t>>(1)) out.wait = ms(*w);
    }
    co_return out;
}

net::awaitable<result<bool>> ledger::note_in_flight(std::string key, std::int32_t generation) {
    auto r = co_await exec(pool_, in_flight_sql, pg::params(std::move(key), generation));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<std::optional<record_status>>> ledger::reopen_for_replay(std::string key,
                                                                               std::string why) {
    auto r = co_await exec(pool_, reopen_sql, pg::params(std::move(key), std::move(why)));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<record_status>();
    co_return parse_record_status(r->get<std::string_view>(0, 0));
}

net::awaitable<result<bool>> ledger::add_dead_letter(dead_letter letter) {
    pg::pipeline batch;
    add_letter(batch, std::move(letter));
    auto r = co_await exec_batch(pool_, std::move(batch));
    if (!r) co_return r.err();
    co_return (*r)[1].affected() == 1;
}

}  // namespace cg::billing
