#include "billing/store/dead_letter_store.hpp"

#include "core/log.hpp"
#include "pg/rows.hpp"

namespace cg::billing {
namespace {

#define CG_LETTER_COLUMNS                                                                        \
    "id, received_at, topic, channel, nsq_message_id, attempts, raw_body, reason, billing_key, " \
    "replayed_at, "                                                                              \
    "replayed_by, replay_count, dismissed_at, dismissed_by, dismiss_reason, corrected_body"

const std::string list_sql =
    "SELECT " CG_LETTER_COLUMNS
    " FROM dead_letters WHERE id > $1::bigint AND ($2::text IS NULL OR starts_with(reason, $2::text)) "
    "AND ($3::bool OR (replayed_at IS NULL AND dismissed_at IS NULL)) ORDER BY id LIMIT $4::bigint";

const std::string find_letter_sql = "SELECT " CG_LETTER_COLUMNS " FROM dead_letters WHERE id = $1::bigint";

const std::string mark_sql =
    "UPDATE dead_letters SET replayed_at = now(), replayed_by = $2::text, replay_count = replay_count + 1, "
    "corrected_body = coalesce($4::bytea, corrected_body) "
    "WHERE id = $1::bigint AND ($3::bool OR replayed_at IS NULL)";

const std::string dismiss_sql =
    "UPDATE dead_letters SET dismissed_at = now(), dismissed_by = $2::text, dismiss_reason = $3::text "
    "WHERE id = $1::bigint AND replayed_at IS NULL AND dismissed_at IS NULL";

#undef CG_LETTER_COLUMNS

stored_letter decode(const pg::rows& r, std::size_t i) {
    stored_letter l;
    l.id = r.get<std::int64_t>(i, 0);
    l.received_at = r.get<pg::timestamp>(i, 1);
    l.topic = r.get<std::string>(i, 2);
    l.channel = r.get<std::string>(i, 3);
    l.nsq_message_id = r.get<std::string>(i, 4);
    l.attempts = r.get<std::int32_t>(i, 5);
    auto body = r.get<bytes>(i, 6);
    l.raw_body.assign(body.begin(), body.end());
    l.reason = r.get<std::string>(i, 7);
    l.billing_key = r.get<std::optional<std::string>>(i, 8);
    l.replayed_at = r.get<std::optional<pg::timestamp>>(i, 9);
    l.replayed_by = r.get<std::optional<std::string>>(i, 10);
    l.replay_count = r.get<std::int32_t>(i, 11);
    l.dismissed_at = r.get<std::optional<pg::timestamp>>(i, 12);
    l.dismissed_by = r.get<std::optional<std::string>>(i, 13);
    l.dismiss_reason = r.get<std::optional<std::string>>(i, 14);
    if (auto fixed = r.get<std::optional<bytes>>(i, 15))
        l.corrected_body.emplace(fixed->begin(), fixed->end());
    return l;
}

}  // namespace

net::awaitable<result<std::vector<stored_letter>>> dead_letter_store::list(letter_filter f) {
    auto r = co_await pg::exec_pooled(pool_, list_sql,
                                      pg::params(f.after_id, f.reason_prefix, f.include_replayed, f.limit));
    if (!r) co_return r.err();
    std::vector<stored_letter> out;
    out.reserve(r->size());
    for (std::size_t i = 0; i < r->size(); ++i) out.push_back(decode(*r, i));
    co_return out;
}

net::awaitable<result<std::optional<stored_letter>>> dead_letter_store::find(std::int64_t id) {
    auto r = co_await pg::exec_pooled(pool_, find_letter_sql, pg::params(id));
    if (!r) co_return r.err();
    if (r->empty()) co_return std::optional<stored_letter>();
    co_return std::optional<stored_letter>(decode(*r, 0));
}

net::awaitable<result<bool>> dead_letter_store::mark_replayed(std::int64_t id, std::string who, bool again,
                                                              std::optional<std::string> corrected) {
    std::optional<bytes> body;
    if (corrected) body.emplace(corrected->begin(), corrected->end());
    auto r =
        co_await pg::exec_pooled(pool_, mark_sql, pg::params(id, std::move(who), again, std::move(body)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

net::awaitable<result<bool>> dead_letter_store::dismiss(std::int64_t id, std::string who, std::string why) {
    auto r = co_await pg::exec_pooled(pool_, dismiss_sql, pg::params(id, std::move(who), std::move(why)));
    if (!r) co_return r.err();
    co_return r->affected() == 1;
}

// The pipeline's reasons (ledger.hpp's callers): fixed words, or the parser's message for an invalid event.
const char* const letter_reason_class_sql =
    "CASE WHEN reason = 'conflict' THEN 'conflict' "
    "WHEN starts_with(reason, 'stripe rejected') THEN 'stripe_rejected' "
    "WHEN starts_with(reason, 'stripe idempotency_error') THEN 'stripe_idempotency_error' "
    "WHEN starts_with(reason, 'spend cap exceeded') THEN 'spend_cap_exceeded' "
    "WHEN starts_with(reason, 'failed after processing') THEN 'failed_after_processing' "
    "ELSE 'invalid' END";

std::string to_json(const stored_letter& l, bool with_body) {
    std::string o = "{\"id\":" + std::to_string(l.id) + ",\"received_at\":";
    append_json_string(o, pg::format_timestamptz(l.received_at));
    o += ",\"topic\":";
    append_json_string(o, l.topic);
    o += ",\"channel\":";
    append_json_string(o, l.channel);
    o += ",\"nsq_message_id\":";
    append_json_string(o, l.nsq_message_id);
    o += ",\"attempts\":" + std::to_string(l.attempts) + ",\"reason\":";
    append_json_string(o, l.reason);
    o += ",\"billing_key\":";
    if (l.billing_key)
        append_json_string(o, *l.billing_key);
    else
        o += "null";
    o += ",\"replayed_at\":";
    if (l.replayed_at)
        append_json_string(o, pg::format_timestamptz(*l.replayed_at));
    else
        o += "null";
    o += ",\"replayed_by\":";
    if (l.replayed_by)
        append_json_string(o, *l.replayed_by);
    else
        o += "null";
    o += ",\"replay_count\":" + std::to_string(l.replay_count) +
         ",\"body_bytes\":" + std::to_string(l.raw_body.size()) +
         ",\"open\":" + (l.open() ? "true" : "false") + ",\"dismissed_at\":";
    if (l.dismissed_at)
        append_json_string(o, pg::format_timestamptz(*l.dismissed_at));
    else
        o += "null";
    o += ",\"dismissed_by\":";
    if (l.dismissed_by)
        append_json_string(o, *l.dismissed_by);
    else
        o += "null";
    o += ",\"dismiss_reason\":";
    if (l.dismiss_reason)
        append_json_string(o, *l.dismiss_reason);
    else
        o += "null";
    if (with_body) {
        o += ",\"body\":";
        append_json_string(o, l.raw_body);
        if (l.corrected_body) {
            o += ",\"corrected_body\":";
            append_json_string(o, *l.corrected_body);
        }
    }
    o += "}";
    return o;
}

}  // namespace cg::billing
