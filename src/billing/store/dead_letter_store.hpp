// Dead letters as operators see them (`chargeguard dead-letters`): list, show, and the bookkeeping of a
// replay. The pipeline writes letters (ledger.hpp); this file only reads them and records replays.
//
// Replay order (the command's job, documented here because the SQL is shaped by it): publish the stored raw
// body first, then mark_replayed(). A crash between the two leaves the letter unmarked, so the next replay
// publishes it again — harmless, since a billing event's charge is keyed on its content. Marking first would
// lose the event when the publish then fails.
//
// Every coroutine acquires a connection from the pool, runs one statement and gives it back; errors are pg
// errors passed through. Completes on the pool's executor; the pool must outlive every call.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "pg/types.hpp"

namespace cg::billing {

struct stored_letter {
    std::int64_t id = 0;
    pg::timestamp received_at{};
    std::string topic;
    std::string channel;
    std::string nsq_message_id;
    std::int32_t attempts = 0;
    std::string raw_body;
    std::string reason;
    std::optional<std::string> billing_key;
    std::optional<pg::timestamp> replayed_at;
    std::optional<std::string> replayed_by;
    std::int32_t replay_count = 0;
    // Closed without a replay (`dead-letters dismiss`): who, why, when (migration 0022).
    std::optional<pg::timestamp> dismissed_at;
    std::optional<std::string> dismissed_by;
    std::optional<std::string> dismiss_reason;
    // The operator's corrected event the last replay published instead of raw_body (`replay --event`).
    std::optional<std::string> corrected_body;

    // Open: neither replayed nor dismissed (what the open-letters gauge counts and its alert fires on).
    bool open() const noexcept { return !replayed_at && !dismissed_at; }
};

struct letter_filter {
    std::optional<std::string> reason_prefix;  // reason starts with this
    bool include_replayed = false;             // also the closed letters (replayed or dismissed)
    std::int64_t after_id = 0;                 // keyset pagination: id > after_id
    std::int64_t limit = 100;
};

class dead_letter_store {
  public:
    explicit dead_letter_store(std::shared_ptr<pg::pool> pool) : pool_(std::move(pool)) {}

    // Letters matching `f`, oldest first (by id).
    net::awaitable<result<std::vector<stored_letter>>> list(letter_filter f);
    // One letter, or nullopt.
    net::awaitable<result<std::optional<stored_letter>>> find(std::int64_t id);
    // Records a replay by `who`: replayed_at = now(), replay_count + 1. Without `again`, only a letter not
    // replayed yet is marked (false: someone marked it first). Returns whether the row was updated.
    // `corrected`: the operator's corrected event that was published instead of the stored body (kept beside
    // it).
    net::awaitable<result<bool>> mark_replayed(std::int64_t id, std::string who, bool again,
                                               std::optional<std::string> corrected = std::nullopt);
    // Closes an open letter without a replay: dismissed_at = now(), who and why. False: the letter is not
    // open (replayed or dismissed already, or absent).
    net::awaitable<result<bool>> dismiss(std::int64_t id, std::string who, std::string why);

  private:
    std::shared_ptr<pg::pool> pool_;
};

// The gauge's class of a letter's reason: a bounded label for the free-text reasons (an invalid event's
// reason is the parser's message). One of: conflict, stripe_rejected, stripe_idempotency_error,
// spend_cap_exceeded, failed_after_processing, invalid. As SQL over the column `reason`, for the gauge.
extern const char* const letter_reason_class_sql;

// A one-line JSON object for `list --json` / `show --json` (raw_body as a string when it is valid UTF-8
// text, which append_json_string escapes; `body_bytes` always gives the length).
std::string to_json(const stored_letter& l, bool with_body);

}  // namespace cg::billing
