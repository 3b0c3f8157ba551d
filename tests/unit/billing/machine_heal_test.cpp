// The decisions of the healers and the operator commands (billing/machine/machine.hpp, machine_heal.cpp):
// for every charge state what a replay, a retry-declined, the poller, the backfill and reconcile do, and each
// target state they write is a transition the table allows for their input.
#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

#include "billing/machine/machine.hpp"
#include "stripe/fact.hpp"

using namespace cg;
using namespace cg::billing;
using namespace cg::billing::machine;

namespace {

const std::vector<record_status> every_status{
    record_status::pending,     record_status::charged,
    record_status::declined,    record_status::failed,
    record_status::cap_blocked, record_status::conflict,
    record_status::processing,  record_status::failed_after_processing};

// The table has `from` → `to` on a charge by `by`.
bool table_has(std::string_view from, std::string_view to, input by) {
    for (const auto& t : transitions())
        if (t.on == table::charge && t.from == from && t.to == to && t.by == by) return true;
    return false;
}

stripe::fact fact_of(stripe::movement m, bool bank_debit) {
    stripe::fact f;
    f.moved = m;
    f.bank_debit = bank_debit;
    return f;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(machine_heal)

BOOST_AUTO_TEST_CASE(a_replay_reopens_exactly_the_states_the_table_lets_it_reopen) {
    for (auto s : every_status) {
        const auto c = on_replay(s);
        BOOST_TEST_CONTEXT(to_string(s) << ": " << to_string(c)) {
            BOOST_TEST((c == replay_command::reopen_then_publish) ==
                       table_has(to_string(s), "pending", input::replay));
        }
    }
    BOOST_TEST(to_string(on_replay(record_status::failed)) == "reopen_then_publish");
    BOOST_TEST(to_string(on_replay(record_status::cap_blocked)) == "reopen_then_publish");
    BOOST_TEST(to_string(on_replay(record_status::failed_after_processing)) == "reopen_then_publish");
    BOOST_TEST(to_string(on_replay(record_status::pending)) == "publish");
    BOOST_TEST(to_string(on_replay(record_status::charged)) == "refuse_superseded");
    BOOST_TEST(to_string(on_replay(record_status::processing)) == "refuse_superseded");
    BOOST_TEST(to_string(on_replay(record_status::declined)) == "refuse_declined");
    BOOST_TEST(to_string(on_replay(record_status::conflict)) == "refuse_conflict");
}

BOOST_AUTO_TEST_CASE(retry_declined_reopens_only_what_the_table_lets_it_reopen) {
    for (auto s : every_status) {
        const auto c = on_retry_declined(s);
        BOOST_TEST_CONTEXT(to_string(s) << ": " << to_string(c)) {
            BOOST_TEST((c == retry_command::reopen) ==
                       table_has(to_string(s), "pending", input::retry_declined));
        }
    }
    BOOST_TEST(to_string(on_retry_declined(record_status::declined)) == "reopen");
    BOOST_TEST(to_string(on_retry_declined(record_status::pending)) == "follow_pending");
    BOOST_TEST(to_string(on_retry_declined(record_status::charged)) == "already_charged");
    for (auto s : {record_status::failed, record_status::cap_blocked, record_status::conflict,
                   record_status::processing, record_status::failed_after_processing})
        BOOST_TEST(to_string(on_retry_declined(s)) == "not_declined");
}

// The state a payment fact ends is the one the table lets a webhook or the poll move to charged and to
// failed_after_processing; a state only an anomaly moves (declined, failed_after_processing) is not waiting.
BOOST_AUTO_TEST_CASE(only_processing_awaits_a_payment_fact) {
    for (auto s : every_status) {
        const bool both = table_has(to_string(s), "charged", input::payment_fact) &&
                          table_has(to_string(s), "failed_after_processing", input::payment_fact);
        BOOST_TEST_CONTEXT(to_string(s)) {
            BOOST_TEST(awaits_payment_fact(s) == both);
        }
    }
}

// A found successful payment is still the machine's to record while recovery (pending) or a fact
// (processing) may move the row to charged without an operator; anywhere else it is unaccounted money.
BOOST_AUTO_TEST_CASE(a_found_payment_is_recorded_from_pending_and_processing_only) {
    for (auto s : every_status) {
        const bool by_machine =
            table_has(to_string(s), "charged", input::search_found) ||
            (awaits_payment_fact(s) && table_has(to_string(s), "charged", input::payment_fact));
        BOOST_TEST_CONTEXT(to_string(s)) {
            BOOST_TEST(records_found_payment(s) == by_machine);
        }
    }
}

BOOST_AUTO_TEST_CASE(the_backfill_inserts_what_moved_and_the_bank_debits_in_flight_it_can_follow) {
    using stripe::movement;
    BOOST_TEST(to_string(on_backfill(fact_of(movement::charged, false), false)) == "insert_charged");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::charged, true), true)) == "insert_charged");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::in_flight, true), true)) == "insert_processing");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::failed, true), true)) ==
               "insert_processing_then_fail");
    // Not followed without a topic for the dead letter; a card's failure or a card in flight moved nothing.
    BOOST_TEST(to_string(on_backfill(fact_of(movement::in_flight, true), false)) == "none");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::failed, true), false)) == "none");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::failed, false), true)) == "none");
    BOOST_TEST(to_string(on_backfill(fact_of(movement::in_flight, false), true)) == "none");
    for (auto m : {movement::authorised, movement::needs_customer, movement::not_tried, movement::canceled,
                   movement::refunded, movement::disputed, movement::unknown})
        BOOST_TEST(to_string(on_backfill(fact_of(m, true), true)) == "none");
    // Each insert is a transition the table allows the backfill, and the failure after it one a fact makes.
    BOOST_TEST(table_has("", "charged", input::backfill));
    BOOST_TEST(table_has("", "processing", input::backfill));
    BOOST_TEST(table_has("processing", "failed_after_processing", input::payment_fact));
}

BOOST_AUTO_TEST_CASE(reconcile_records_a_final_find_and_leaves_a_moving_one_to_the_pipeline) {
    BOOST_TEST(to_string(on_reconcile_found(found_command::mark_charged)) == "mark_charged");
    BOOST_TEST(to_string(on_reconcile_found(found_command::mark_declined)) == "mark_declined");
    for (auto c : {found_command::mark_processing, found_command::still_open, found_command::none})
        BOOST_TEST(to_string(on_reconcile_found(c)) == "leave");
    BOOST_TEST(table_has("pending", "charged", input::search_found));
    BOOST_TEST(table_has("pending", "declined", input::search_found));
}

BOOST_AUTO_TEST_CASE(refund_facts_and_the_facts_that_state_a_payment_status) {
    BOOST_TEST(names_refund(fact_kind::refunded));
    BOOST_TEST(names_refund(fact_kind::refund_update));
    for (auto k : {fact_kind::processing, fact_kind::succeeded, fact_kind::failed, fact_kind::dispute_opened,
                   fact_kind::dispute_closed, fact_kind::no_news, fact_kind::unknown_type})
        BOOST_TEST(!names_refund(k), to_string(k));
    for (auto k : {fact_kind::processing, fact_kind::succeeded, fact_kind::failed, fact_kind::refunded,
                   fact_kind::no_news})
        BOOST_TEST(states_payment_status(k), to_string(k));
    for (auto k : {fact_kind::refund_update, fact_kind::dispute_opened, fact_kind::dispute_closed,
                   fact_kind::unknown_type})
        BOOST_TEST(!states_payment_status(k), to_string(k));
}

BOOST_AUTO_TEST_SUITE_END()
