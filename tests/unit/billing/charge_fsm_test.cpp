// The charge fsm alone (billing/machine/charge_fsm.hpp): input sequences in, command sequences out, no
// database, no Stripe, no clock. Each row of a table is one delivery's whole life: the inputs the driver
// feeds after each command, and the commands the fsm must give.
#include "billing/machine/charge_fsm.hpp"

#include <boost/test/unit_test.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "billing/machine/key.hpp"
#include "stripe/fact.hpp"

namespace charge_fsm_test {

using namespace cg;
using namespace cg::billing;
using namespace cg::billing::machine;
using namespace std::chrono_literals;

namespace {

const sys_time t0 = sys_time(std::chrono::seconds(1'800'000'000));
const std::string card_body =
    R"({"customer_id":"acme","billing_period":"2026-11","amount_cents":1999,"currency":"usd",)"
    R"("stripe_customer_id":"cus_1"})";
const std::string intent_body =
    R"({"customer_id":"acme","billing_period":"2026-11","amount_cents":1999,"currency":"usd",)"
    R"("stripe_customer_id":"cus_1","payment_method":"pm_card_visa"})";
const std::string correction_body =
    R"({"customer_id":"acme","billing_period":"2026-11","amount_cents":999,"currency":"usd",)"
    R"("stripe_customer_id":"cus_1","revision":1})";
const std::string bad_body = "{not json";
const std::string key = base_key("chargeguard", "acme", "2026-11", "");

// A command as one line: the op, the settle's step, or the verdict with its delay.
std::string line(const command& c) {
    if (c.what == op::settle) return "settle " + std::string(to_string(c.step));
    if (c.what != op::done) return std::string(to_string(c.what));
    std::string s = c.result.finished() ? "FIN " : "REQ ";
    s += to_string(c.result.reason);
    if (!c.result.finished()) s += " " + std::to_string(c.result.delay.count());
    return s;
}

// The row of this event as the ledger holds it.
ledger_record row(record_status s, std::optional<std::chrono::milliseconds> lease_remaining = 0ms,
                  bool indeterminate = false) {
    ledger_record r;
    r.key = key;
    r.customer_id = "acme";
    r.billing_period = "2026-11";
    r.amount_cents = 1999;
    r.currency = "usd";
    r.stripe_customer_id = "cus_1";
    r.status = s;
    r.lease_remaining = lease_remaining;
    r.first_stripe_attempt_at = t0 - 10min;
    r.stripe_attempts = 1;
    r.lease_epoch = 7;
    if (indeterminate) r.indeterminate_since = t0 - 5min;
    return r;
}

// The body must outlive the input (in::delivery holds a view of it).
fsm_input deliver(const std::string& body) {
    return in::delivery{body, "0a", 2, t0, 0.5};
}

stripe::charge_outcome answer(stripe::outcome_class cls, std::string charge_id = {},
                              std::string in_flight = {}) {
    stripe::charge_outcome o;
    o.cls = cls;
    o.charge_id = std::move(charge_id);
    o.in_flight_status = std::move(in_flight);
    o.message = "stripe said so";
    return o;
}

stripe::charge charge(std::string id, std::string status, std::string method = "card") {
    stripe::charge c;
    c.id = std::move(id);
    c.status = std::move(status);
    c.payment_method_type = std::move(method);
    c.created = 1'800'000'000 - 300;
    return c;
}

error pg_down() {
    return error{core_errc::io_error, "connection refused"};
}

struct step {
    fsm_input in;
    std::string expect;  // the command the fsm gives for `in`
};

struct scenario {
    std::string name;
    std::vector<step> steps;
    flow_config cfg{};
};

std::vector<std::string> run(const scenario& s, charge_fsm& f) {
    std::vector<std::string> got;
    for (const auto& st : s.steps) got.push_back(line(f.resume(st.in)));
    return got;
}

std::vector<std::string> expected(const scenario& s) {
    std::vector<std::string> out;
    for (const auto& st : s.steps) out.push_back(st.expect);
    return out;
}

in::preflighted inserted() {
    return {true, row(record_status::pending, 60'000ms), t0};
}

// A row a dead-letter replay (or retry-declined) reopened under key generation 2.
ledger_record reopened(std::chrono::milliseconds lease_remaining) {
    auto r = row(record_status::pending, lease_remaining);
    r.key_generation = 2;
    return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(charge_fsm_input_sequences_give_command_sequences) {
    flow_config paused;
    paused.step_pauses = true;
    const std::vector<scenario> table{
        {"a fresh charge: the row before the call, charged after",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "ch_1")}, "settle mark_charged"},
          {in::applied{true}, "FIN charged"}}},
        {"500 after the create: may have happened, searched later",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::outcome_class::indeterminate)}, "settle mark_indeterminate_requeue"},
          {in::applied{true}, "REQ requeued_indeterminate 30000"}}},
        {"a timeout after sending is the same open answer",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::classify_transport_failure(true))}, "settle mark_indeterminate_requeue"},
          {in::applied{false}, "REQ requeued_indeterminate 30000"}}},
        {"429 after the client's retries: nothing happened, the same key later",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::outcome_class::retry_same_key)}, "settle release_requeue"},
          {in::applied{true}, "REQ requeued_retry_same_key 5000"}}},
        {"a bank debit in flight: processing, the recorded events applied",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "py_1", "pending")}, "settle mark_processing"},
          {in::applied{true}, "apply_recorded"},
          {in::failed{pg_down()}, "FIN processing"}}},
        {"a crash after the call: the redelivery of an open answer searches and finds the charge",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::charge_found{charge("ch_1", "succeeded")}, "settle mark_charged"},
          {in::applied{true}, "FIN charged"}}},
        {"a crash before the answer inside the window: the same key again",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms), t0}, "record_attempt"},
          {in::attempted{1, 9}, "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "ch_1")}, "settle mark_charged"},
          {in::applied{false}, "FIN charged"}}},
        {"nothing carries the key: a new generation, then the call",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::charge_found{}, "bump_generation"},
          {in::bumped{2, 0ms}, "record_attempt"},
          {in::attempted{2, 10}, "create"}}},
        {"nothing carries the key yet, but a call showed life: wait out the quiet period",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::charge_found{}, "bump_generation"},
          {in::bumped{std::nullopt, 120'000ms}, "settle release_requeue"},
          {in::applied{true}, "REQ requeued_indeterminate 120100"}}},
        {"the search failed: nothing may be charged; the lease given back (its failure tolerated)",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::failed{error{core_errc::io_error, "list"}}, "settle release_requeue"},
          {in::failed{pg_down()}, "REQ requeued_stripe_unavailable 30000"}}},
        {"the lease lost before the call: no call",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms), t0}, "record_attempt"},
          {in::attempted{}, "REQ requeued_lease_lost 10000"}}},
        {"another worker took the lease first and settled the row",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms), t0}, "take_lease"},
          {in::row{std::nullopt, t0}, "find"},
          {in::row{row(record_status::charged, std::nullopt), t0}, "FIN duplicate_prevented"}}},
        {"a live lease elsewhere: requeued until it can have expired",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 40'000ms), t0},
           "REQ requeued_lease_held 45000"}}},
        {"a redelivery of a charged event",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::charged, std::nullopt), t0},
           "FIN duplicate_prevented"}}},
        {"PostgreSQL down at the pre-flight: REQ with the backoff, never a call",
         {{deliver(card_body), "preflight"}, {in::failed{pg_down()}, "REQ requeued_postgres 2000"}}},
        {"PostgreSQL down at the settle: REQ, the open row recovered later",
         {{deliver(card_body), "preflight"},
          {inserted(), "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "ch_1")}, "settle mark_charged"},
          {in::failed{pg_down()}, "REQ requeued_postgres 2000"}}},
        {"an invalid body: its dead letter, then FIN",
         {{deliver(bad_body), "dead_letter"}, {in::applied{true}, "FIN dead_lettered"}}},
        {"a PaymentIntent event whose intent was never confirmed: a new generation",
         {{deliver(intent_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::charge_found{}, "search_intents"},
          {in::intent_found{stripe::payment_intent{
               "pi_1", 1999, "usd", "cus_1", "requires_confirmation", "", 1'800'000'000, "", "", {}}},
           "bump_generation"}}},
        {"a bank debit found failed after the answer was lost: processing, not declined",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, row(record_status::pending, 0ms, true), t0}, "take_lease"},
          {in::row{row(record_status::pending, 60'000ms, true), t0}, "search_charges"},
          {in::charge_found{charge("py_1", "failed", "us_bank_account")}, "settle mark_processing"}}},
        {"a reopened row's new key answered with an earlier life's payment: the next generation at once",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, reopened(0ms), t0}, "take_lease"},
          {in::row{reopened(60'000ms), t0}, "record_attempt"},
          {in::attempted{2, 9}, "create"},
          {in::answer{answer(stripe::outcome_class::declined, "py_old")}, "superseded_payments"},
          {in::superseded{{"py_old"}}, "bump_generation"},
          {in::bumped{3, 0ms}, "record_attempt"},
          {in::attempted{3, 10}, "create"}}},
        {"a reopened row's own decline is settled",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, reopened(0ms), t0}, "take_lease"},
          {in::row{reopened(60'000ms), t0}, "record_attempt"},
          {in::attempted{2, 9}, "create"},
          {in::answer{answer(stripe::outcome_class::declined, "ch_new")}, "superseded_payments"},
          {in::superseded{{"py_old"}}, "settle mark_declined"},
          {in::applied{true}, "FIN declined"}}},
        {"a reopened row charged: no read of the earlier lives",
         {{deliver(card_body), "preflight"},
          {in::preflighted{false, reopened(0ms), t0}, "take_lease"},
          {in::row{reopened(60'000ms), t0}, "record_attempt"},
          {in::attempted{2, 9}, "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "ch_new")}, "settle mark_charged"}}},
        {"a correction goes to the corrections machine",
         {{deliver(correction_body), "correction"},
          {in::corrected{verdict::finish(verdict_reason::refunded, "re_1")}, "FIN refunded"}}},
        {"the chaos failpoint pauses after the row, after the answer and before FIN",
         {{deliver(card_body), "preflight"},
          {inserted(), "pause"},
          {in::resumed{}, "create"},
          {in::answer{answer(stripe::outcome_class::succeeded, "ch_1")}, "pause"},
          {in::resumed{}, "settle mark_charged"},
          {in::applied{true}, "pause"},
          {in::resumed{}, "FIN charged"}},
         paused},
    };
    for (const auto& s : table) {
        BOOST_TEST_CONTEXT(s.name) {
            charge_fsm f(s.cfg);
            auto got = run(s, f);
            auto want = expected(s);
            BOOST_TEST(got == want, boost::test_tools::per_element());
        }
    }
}

BOOST_AUTO_TEST_CASE(charge_fsm_names_the_call_and_the_settle) {
    flow_config cfg;
    charge_fsm f(cfg);
    f.resume(deliver(card_body));
    auto c = f.resume(inserted());
    BOOST_TEST(f.key() == key);
    const auto* req = std::get_if<stripe::charge_request>(&c.request);
    BOOST_TEST_REQUIRE(req != nullptr);
    BOOST_TEST(req->idempotency_key == stripe_idempotency_key(key, 1));
    BOOST_TEST(f.held_lease() == 7);
    // Renewals during the call: the lease held extended, until one finds it taken over; from then on only
    // the call under its generation is noted in flight.
    auto w = f.renewal();
    BOOST_TEST(!w.note_in_flight);
    BOOST_TEST(w.epoch == 7);
    BOOST_TEST(w.generation == 1);
    f.renewed(in::renewed{8});
    BOOST_TEST(f.renewal().epoch == 8);
    f.renewed(in::renewed{});
    BOOST_TEST(f.renewal().note_in_flight);
    BOOST_TEST(f.renewal().generation == 1);
    auto s = f.resume(in::answer{answer(stripe::outcome_class::indeterminate)});
    BOOST_CHECK_THROW(f.renewal(), std::logic_error);  // no call outstanding any more
    BOOST_TEST(s.text == "stripe said so");
    auto d = f.resume(in::applied{true});
    BOOST_TEST(f.held_lease() == 8);
    BOOST_TEST(!d.journal.has_value());

    charge_fsm g(cfg);
    g.resume(deliver(card_body));
    g.resume(in::preflighted{false, row(record_status::pending, 0ms, true), t0});
    g.resume(in::row{row(record_status::pending, 60'000ms, true), t0});
    g.resume(in::charge_found{});
    g.resume(in::bumped{3, 0ms});
    auto call = g.resume(in::attempted{3, 11});
    const auto* again = std::get_if<stripe::charge_request>(&call.request);
    BOOST_TEST_REQUIRE(again != nullptr);
    BOOST_TEST(again->idempotency_key == stripe_idempotency_key(key, 3));
    auto settle = g.resume(in::answer{answer(stripe::outcome_class::succeeded, "ch_9")});
    BOOST_TEST(settle.charge_id.value_or("") == "ch_9");
    auto done = g.resume(in::applied{true});
    BOOST_TEST_REQUIRE(done.journal.has_value());
    BOOST_TEST(done.journal->charge_id == "ch_9");
    BOOST_TEST(g.first_lease() == 7);
    BOOST_TEST(g.held_lease() == 11);
}

BOOST_AUTO_TEST_CASE(charge_fsm_takes_a_spent_keys_next_generation_without_the_quiet_period) {
    flow_config cfg;
    charge_fsm f(cfg);
    f.resume(deliver(card_body));
    f.resume(in::preflighted{false, reopened(0ms), t0});
    f.resume(in::row{reopened(60'000ms), t0});
    f.resume(in::attempted{2, 9});
    auto read = f.resume(in::answer{answer(stripe::outcome_class::succeeded, "py_old", "pending")});
    BOOST_TEST(line(read) == "superseded_payments");
    auto bump = f.resume(in::superseded{{"py_old"}});
    BOOST_TEST(line(bump) == "bump_generation");
    BOOST_TEST_REQUIRE(bump.quiet.has_value());
    BOOST_TEST(bump.quiet->count() == 0);
    BOOST_TEST(bump.note.find("py_old") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(charge_fsm_refuses_an_input_out_of_turn) {
    flow_config cfg;
    charge_fsm f(cfg);
    BOOST_CHECK_THROW(f.resume(in::applied{true}), std::logic_error);
    charge_fsm g(cfg);
    g.resume(deliver(card_body));
    g.resume(in::failed{pg_down()});
    BOOST_CHECK_THROW(g.resume(in::resumed{}), std::logic_error);
}

// The one filter of the recovery search (the charge fsm's and search_by_key's): a failure that an earlier
// attempt of a retried row made, or one from before the row's first attempt, is dropped; a success, or a
// payment still moving, never is.
BOOST_AUTO_TEST_CASE(superseded_failure_drops_only_an_earlier_failure) {
    const std::int64_t first =
        std::chrono::duration_cast<std::chrono::seconds>(t0.time_since_epoch()).count();
    const std::vector<std::string> earlier = {"ch_old", "pi_old"};
    auto charge = [](std::string id, std::string status) {
        stripe::charge c;
        c.id = std::move(id);
        c.status = std::move(status);
        return stripe::read(c);
    };
    auto intent = [](std::string id, std::string status) {
        stripe::payment_intent p;
        p.id = std::move(id);
        p.status = std::move(status);
        return stripe::read(p);
    };
    struct row {
        stripe::fact found;
        std::int64_t created;
        bool dropped;
    };
    const row rows[] = {
        {charge("ch_old", "failed"), first, true},                   // an earlier attempt's failure
        {charge("ch_old", "succeeded"), first, false},               // a success is always believed
        {charge("ch_old", "pending"), first, false},                 // still moving
        {charge("ch_new", "failed"), first - 301, true},             // from before the first attempt
        {charge("ch_new", "failed"), first - 299, false},            // within the clock skew allowed
        {charge("ch_new", "failed"), first + 10, false},             // this generation's answer
        {intent("pi_old", "requires_payment_method"), first, true},  // failed
        {intent("pi_old", "requires_action"), first, true},          // needs the customer
        {intent("pi_old", "canceled"), first, true},
        {intent("pi_old", "processing"), first, false},
        {intent("pi_new", "canceled"), first - 3600, true},
    };
    for (const auto& r : rows)
        BOOST_TEST_CONTEXT(r.found.id << " " << r.found.status << " created " << r.created - first) {
            BOOST_TEST(superseded_failure(r.found, r.created, earlier, t0) == r.dropped);
        }
    // Without a first attempt only the named payments are dropped.
    BOOST_TEST(!superseded_failure(charge("ch_new", "failed"), 0, earlier, std::nullopt));
    BOOST_TEST(superseded_failure(charge("ch_old", "failed"), 0, earlier, std::nullopt));
}

}  // namespace charge_fsm_test
