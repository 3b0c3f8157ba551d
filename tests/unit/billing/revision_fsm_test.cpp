// The revision fsm alone (billing/machine/revision_fsm.hpp): a correction revision's input sequences in,
// command sequences out, no database, no Stripe, no clock.
#include "billing/machine/revision_fsm.hpp"

#include <boost/test/unit_test.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "billing/machine/key.hpp"

namespace revision_fsm_test {

using namespace cg;
using namespace cg::billing;
using namespace cg::billing::machine;
using namespace std::chrono_literals;

namespace {

const sys_time t0 = sys_time(std::chrono::seconds(1'800'000'000));

std::string line(const revision_command& c) {
    if (c.what != rop::done) {
        std::string s(to_string(c.what));
        if (!c.status.empty()) s += " " + c.status;
        return s;
    }
    std::string s = c.result.finished() ? "FIN " : "REQ ";
    s += to_string(c.result.reason);
    if (!c.result.finished()) s += " " + std::to_string(c.result.delay.count());
    return s;
}

revision_input start() {
    billing_event ev;
    ev.customer_id = "acme";
    ev.billing_period = "2026-11";
    ev.amount_cents = 1500;
    ev.currency = "usd";
    ev.stripe_customer_id = "cus_1";
    ev.revision = 1;
    return in::revision{ev, "base", "base-r1", 1, 0.5};
}

move_view refund_move(std::string status = "pending", bool open = false) {
    move_view m;
    m.part = 1;
    m.refund = true;
    m.amount_cents = 500;
    m.refund_of = "ch_1";
    m.status = std::move(status);
    m.key = "base-r1-p1";
    if (open) {
        m.first_stripe_attempt_at = t0 - 10min;
        m.indeterminate_since = t0 - 5min;
    }
    return m;
}

move_view charge_move(bool open = false) {
    move_view m;
    m.part = 1;
    m.amount_cents = 500;
    m.status = "pending";
    m.key = "base-r1-p1";
    if (open) m.indeterminate_since = t0 - 5min;
    return m;
}

in::admitted run() {
    return {"run", "started", 4, 0ms, -500};
}

stripe::refund refund(std::string status) {
    stripe::refund r;
    r.id = "re_1";
    r.status = std::move(status);
    r.charge = "ch_1";
    return r;
}

revision_input answered(stripe::outcome_class cls) {
    stripe::charge_outcome o;
    o.cls = cls;
    return in::answer{o};
}

error pg_down() {
    return error{core_errc::io_error, "connection refused"};
}

struct step {
    revision_input in;
    std::string expect;
};

}  // namespace

BOOST_AUTO_TEST_CASE(revision_fsm_input_sequences_give_command_sequences) {
    const std::vector<std::pair<std::string, std::vector<step>>> table{
        {"a refund made at once: the move done, the revision applied",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{refund_move()}, t0}, "record_attempt"},
          {in::leased{5}, "create_refund"},
          {in::refund_answer{stripe::outcome_class::succeeded, "", refund("succeeded")}, "move_done"},
          {in::applied{}, "moves"},
          {in::moves{{refund_move("done")}, t0}, "finish applied"},
          {in::applied{}, "FIN refunded"}}},
        {"500 after the refund's create: the move left open, REQ",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{refund_move()}, t0}, "record_attempt"},
          {in::leased{5}, "create_refund"},
          {in::refund_answer{stripe::outcome_class::indeterminate, "500", std::nullopt},
           "move_indeterminate"},
          {in::applied{}, "REQ requeued_indeterminate 30000"}}},
        {"the redelivery of an open refund searches and finds it made",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{refund_move("pending", true)}, t0}, "search_refund"},
          {in::refund_found{refund("succeeded")}, "move_done"},
          {in::applied{}, "moves"},
          {in::moves{{refund_move("done")}, t0}, "moves"},
          {in::moves{{refund_move("done")}, t0}, "finish applied"},
          {in::applied{}, "FIN refunded"}}},
        {"nothing carries the move's key: a new generation once quiet, then the call",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{charge_move(true)}, t0}, "search_charge"},
          {in::charge_found{}, "bump_generation"},
          {in::bumped{2, 0ms}, "record_attempt"},
          {in::leased{6}, "create_charge"}}},
        {"a call under the key showed life lately: wait out the quiet period",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{charge_move(true)}, t0}, "search_charge"},
          {in::charge_found{}, "bump_generation"},
          {in::bumped{}, "release"},
          {in::applied{}, "REQ requeued_indeterminate 30000"}}},
        {"the extra charge declined: the move and the revision declined",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{charge_move()}, t0}, "record_attempt"},
          {in::leased{5}, "create_charge"},
          {answered(stripe::outcome_class::declined), "move_ended declined"},
          {in::applied{}, "finish declined"},
          {in::applied{}, "FIN declined"}}},
        {"the cap refuses the extra charge: the dead letter first, then the move and the revision failed",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{charge_move()}, t0}, "record_attempt"},
          {in::leased{5}, "create_charge"},
          {answered(stripe::outcome_class::cap_exceeded), "dead_letter"},
          {in::applied{}, "move_ended failed"},
          {in::applied{}, "finish failed"},
          {in::applied{}, "FIN cap_blocked"}}},
        {"the lease lost before the call: no call",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{charge_move()}, t0}, "record_attempt"},
          {in::leased{}, "REQ requeued_lease_lost 10000"}}},
        {"the search failed: the lease given back, REQ",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{refund_move("pending", true)}, t0}, "search_refund"},
          {in::failed{error{core_errc::io_error, "list"}}, "release"},
          {in::applied{}, "REQ requeued_stripe_unavailable 30000"}}},
        {"waiting for the predecessor",
         {{start(), "admit"},
          {in::admitted{"wait_predecessor", "0", 0, 0ms, 0}, "REQ requeued_waiting 31500"}}},
        {"a move ended before a crash: the revision ends with it",
         {{start(), "admit"},
          {run(), "moves"},
          {in::moves{{refund_move("failed")}, t0}, "finish failed"},
          {in::applied{}, "FIN duplicate_prevented"}}},
        {"PostgreSQL down at the admit",
         {{start(), "admit"}, {in::failed{pg_down()}, "REQ requeued_postgres 1000"}}},
    };
    flow_config cfg;
    for (const auto& [name, steps] : table) {
        BOOST_TEST_CHECKPOINT(name);
        BOOST_TEST_CONTEXT(name) {
            revision_fsm f(cfg);
            std::vector<std::string> got, want;
            for (const auto& s : steps) {
                got.push_back(line(f.resume(s.in)));
                want.push_back(s.expect);
            }
            BOOST_TEST(got == want, boost::test_tools::per_element());
        }
    }
}

BOOST_AUTO_TEST_CASE(revision_fsm_names_the_move_key_and_its_generation) {
    flow_config cfg;
    revision_fsm f(cfg);
    f.resume(start());
    f.resume(run());
    f.resume(in::moves{{charge_move(true)}, t0});
    f.resume(in::charge_found{});
    f.resume(in::bumped{2, 0ms});
    auto call = f.resume(in::leased{6});
    const auto* req = std::get_if<stripe::charge_request>(&call.request);
    BOOST_TEST_REQUIRE(req != nullptr);
    BOOST_TEST(req->idempotency_key == stripe_idempotency_key("base-r1-p1", 2));
    BOOST_TEST(req->amount == 500);
    BOOST_TEST(f.held_lease() == 6);
    // Renewals during the move's call: the revision's lease extended, until one finds it taken over; then
    // only the call under the move's generation is noted in flight.
    BOOST_TEST(!f.renewal().note_in_flight);
    BOOST_TEST(f.renewal().epoch == 6);
    BOOST_TEST(f.renewal().generation == 2);
    f.renewed(in::renewed{7});
    BOOST_TEST(f.held_lease() == 7);
    f.renewed(in::renewed{});
    BOOST_TEST(f.renewal().note_in_flight);
    BOOST_TEST(f.renewal().generation == 2);
    BOOST_TEST(f.held_lease() == 7);
    BOOST_CHECK_THROW(f.resume(in::applied{}), std::logic_error);
    revision_fsm g(cfg);
    BOOST_CHECK_THROW(g.renewal(), std::logic_error);  // no call outstanding
    BOOST_CHECK_THROW(g.renewed(in::renewed{1}), std::logic_error);
}

}  // namespace revision_fsm_test
