#include "billing/machine/decision.hpp"

#include <algorithm>

#include "core/enum_names.hpp"

namespace cg::billing {

namespace {

// The ledger's status column.
constexpr enum_names<record_status, 8> record_status_names({{
    {record_status::pending, "pending"},
    {record_status::charged, "charged"},
    {record_status::declined, "declined"},
    {record_status::failed, "failed"},
    {record_status::cap_blocked, "cap_blocked"},
    {record_status::conflict, "conflict"},
    {record_status::processing, "processing"},
    {record_status::failed_after_processing, "failed_after_processing"},
}});

}  // namespace

std::string_view to_string(record_status s) noexcept {
    return record_status_names.name(s);
}

std::optional<record_status> parse_record_status(std::string_view s) noexcept {
    return record_status_names.parse(s);
}

bool is_final(record_status s) noexcept {
    return s != record_status::pending;
}

std::string_view to_string(existing_action a) noexcept {
    switch (a) {
        case existing_action::duplicate_finish:
            return "duplicate_finish";
        case existing_action::payload_conflict:
            return "payload_conflict";
        case existing_action::lease_held_requeue:
            return "lease_held_requeue";
        case existing_action::recover_same_key:
            return "recover_same_key";
        case existing_action::recover_search:
            return "recover_search";
    }
    return "?";
}

existing_action decide_existing(const ledger_record& rec, const billing_event& ev, sys_time now,
                                std::chrono::seconds window) {
    // A different amount for the same customer and period is never charged on top: a human decides.
    if (rec.amount_cents != ev.amount_cents || rec.currency != ev.currency ||
        rec.stripe_customer_id != ev.stripe_customer_id || rec.stripe_account != ev.stripe_account)
        return existing_action::payload_conflict;
    if (is_final(rec.status)) return existing_action::duplicate_finish;
    // The database's own view of the lease when the row carries it; the local clock otherwise.
    bool held =
        rec.lease_remaining ? rec.lease_remaining->count() > 0 : rec.lease_until && *rec.lease_until > now;
    if (held) return existing_action::lease_held_requeue;
    return recovery_mode(rec, now, window);
}

existing_action recovery_mode(const ledger_record& rec, sys_time now, std::chrono::seconds window) {
    // Same key is safe only while Stripe still remembers it and no 5xx/timeout left the outcome open.
    bool within_window = !rec.first_stripe_attempt_at || now - *rec.first_stripe_attempt_at < window;
    if (!rec.indeterminate_since && within_window) return existing_action::recover_same_key;
    return existing_action::recover_search;
}

std::chrono::milliseconds lease_held_requeue_delay(std::optional<std::chrono::milliseconds> remaining,
                                                   std::chrono::milliseconds lease,
                                                   std::chrono::milliseconds floor,
                                                   std::chrono::milliseconds cap, double unit) noexcept {
    using std::chrono::milliseconds;
    unit = std::clamp(unit, 0.0, 1.0);
    // A lease the database says ends within the floor is not renewed by a live holder (it renews well before
    // the end), so its holder is gone: come back when it has ended, not a whole floor later.
    if (remaining && *remaining < floor) {
        auto margin = floor / 10;
        auto wait = std::max(*remaining, margin);
        auto jitter =
            milliseconds(static_cast<milliseconds::rep>(static_cast<double>(margin.count()) * unit));
        return std::min(wait + jitter, cap);
    }
    auto wait = std::max(remaining.value_or(lease), floor);
    auto spread = std::max(floor, wait / 10);
    auto jitter = milliseconds(static_cast<milliseconds::rep>(static_cast<double>(spread.count()) * unit));
    return std::min(wait + jitter, cap);
}

}  // namespace cg::billing
