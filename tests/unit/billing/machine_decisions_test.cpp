// The money machine's decisions (billing/machine/machine.hpp) against its table: every answer the Stripe
// client can give, a refund's answer, a found payment, a failed statement.
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <string>
#include <system_error>

#include "billing/machine/machine.hpp"
#include "stripe/fact.hpp"

using namespace cg;
using namespace cg::billing;

BOOST_AUTO_TEST_SUITE(machine_decisions)

// Every answer the client can give, read by the machine: a pending row moves only along the table, a
// requeue keeps it pending, FIN goes with a final state.
BOOST_AUTO_TEST_CASE(every_answer_moves_along_the_table) {
    using oc = stripe::outcome_class;
    const oc classes[] = {oc::succeeded,      oc::declined,      oc::cap_exceeded, oc::idempotency_conflict,
                          oc::retry_same_key, oc::indeterminate, oc::rejected,     oc::setup_error};
    for (auto cls : classes)
        for (std::string in_flight : {"", "processing", "requires_capture"})
            for (bool charge_id : {true, false})
                for (bool intent_id : {true, false}) {
                    stripe::charge_outcome out;
                    out.cls = cls;
                    out.in_flight_status = in_flight;
                    if (charge_id) out.charge_id = "ch_1";
                    if (intent_id) out.payment_intent_id = "pi_1";
                    auto o = machine::on_answer(out);
                    BOOST_TEST_CONTEXT(stripe::to_string(cls)
                                       << " " << in_flight << " " << charge_id << intent_id) {
                        if (o.to == record_status::pending) {
                            BOOST_TEST((o.nsq == verdict::action::requeue));
                        } else {
                            BOOST_TEST((o.nsq == verdict::action::finish));
                            BOOST_TEST(machine::allowed(record_status::pending, o.to));
                        }
                        // Charged only with a charge id; processing only with an id to follow.
                        if (o.to == record_status::charged) BOOST_TEST(charge_id);
                        if (o.to == record_status::processing) BOOST_TEST((charge_id || intent_id));
                        // The same answer for a correction's move: a move's state is in its table too.
                        auto m = machine::on_move_answer(out);
                        if (m.to != "pending")
                            BOOST_TEST(machine::allowed(machine::table::move, "pending", m.to));
                        if (m.revision_to != "pending")
                            BOOST_TEST(machine::allowed(machine::table::revision, "pending", m.revision_to));
                        BOOST_TEST(m.letter == o.letter);
                    }
                }
}

BOOST_AUTO_TEST_CASE(a_refund_is_never_declined_and_one_undone_is_open) {
    using oc = stripe::outcome_class;
    BOOST_TEST(
        (machine::on_refund_answer(oc::succeeded, "succeeded").command == machine::move_command::done));
    BOOST_TEST((machine::on_refund_answer(oc::succeeded, "pending").command == machine::move_command::done));
    BOOST_TEST(
        (machine::on_refund_answer(oc::succeeded, "failed").command == machine::move_command::indeterminate));
    BOOST_TEST((machine::on_refund_answer(oc::succeeded, "canceled").command ==
                machine::move_command::indeterminate));
    BOOST_TEST((machine::on_refund_answer(oc::declined, "").command == machine::move_command::indeterminate));
    BOOST_TEST((machine::on_refund_answer(oc::rejected, "").letter == "stripe rejected"));
}

// A found payment: the same fact means the same to a charge and a move, except that a move has no
// processing state.
BOOST_AUTO_TEST_CASE(a_found_fact_means_the_same_to_a_charge_and_a_move) {
    using fc = machine::found_command;
    for (std::string status : {"succeeded", "pending", "failed", "someday"}) {
        for (std::string method : {"card", "us_bank_account"}) {
            stripe::charge ch;
            ch.id = "ch_1";
            ch.status = status;
            ch.payment_method_type = method;
            auto f = stripe::read(ch);
            auto as_charge = machine::on_found(machine::table::charge, f);
            auto as_move = machine::on_found(machine::table::move, f);
            BOOST_TEST_CONTEXT(status << " " << method) {
                if (as_charge == fc::mark_processing)
                    BOOST_TEST((as_move == fc::still_open || as_move == fc::mark_declined));
                else
                    BOOST_TEST((as_move == as_charge));
            }
        }
    }
    stripe::charge failed_debit;
    failed_debit.id = "ch_2";
    failed_debit.status = "failed";
    failed_debit.payment_method_type = "sepa_debit";
    BOOST_TEST(
        (machine::on_found(machine::table::charge, stripe::read(failed_debit)) == fc::mark_processing));
    BOOST_TEST((machine::on_found(machine::table::move, stripe::read(failed_debit)) == fc::mark_declined));
    stripe::payment_intent pi;
    pi.id = "pi_1";
    pi.status = "succeeded";
    BOOST_TEST((machine::on_found(machine::table::charge, stripe::read(pi)) == fc::still_open));
    pi.latest_charge = "ch_1";
    BOOST_TEST((machine::on_found(machine::table::charge, stripe::read(pi)) == fc::mark_charged));
    pi.status = "requires_confirmation";
    BOOST_TEST((machine::on_found(machine::table::charge, stripe::read(pi)) == fc::none));
    stripe::refund re;
    re.id = "re_1";
    re.status = "canceled";
    BOOST_TEST((machine::on_found(machine::table::move, stripe::read(re)) == fc::none));
    re.status = "pending";
    BOOST_TEST((machine::on_found(machine::table::move, stripe::read(re)) == fc::mark_charged));
}

BOOST_AUTO_TEST_CASE(a_failed_statement_requeues_with_the_postgres_backoff) {
    backoff b{std::chrono::milliseconds(100), std::chrono::milliseconds(1000)};
    error e{std::make_error_code(std::errc::timed_out), "statement"};
    auto v = machine::on_postgres_error(b, 3, e, "mark charged");
    BOOST_TEST((v.act == verdict::action::requeue));
    BOOST_TEST((v.reason == verdict_reason::requeued_postgres));
    BOOST_TEST(v.delay.count() == 400);
    BOOST_TEST(v.detail.starts_with("mark charged: "));
}

BOOST_AUTO_TEST_SUITE_END()
