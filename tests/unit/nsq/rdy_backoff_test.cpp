// The consumer's RDY controller in backoff (rdy_sim.hpp): the timer re-armed when the trial connection
// drops, a pending handler awaited first, the levels handler results lead to, signals during a timeout
// ignored; stop, and a timer not armed.
#include <boost/test/unit_test.hpp>

#include "rdy_sim.hpp"

BOOST_AUTO_TEST_SUITE(rdy_controller_tests)

// The stall: the connection holding the trial RDY 1 drops while the consumer backs off, with no
// handler running. The controller must arm the backoff timer again and send a new trial elsewhere.
BOOST_AUTO_TEST_CASE(backoff_re_arms_when_the_trial_connection_drops) {
    sim s(10);
    s.add(key(0));
    s.add(key(1));
    s.advance(seconds(1));
    BOOST_TEST(s.total() == 10u);

    s.receive(key(0));
    s.finish(handler_signal::failure);
    BOOST_TEST(s.c.backing_off());
    BOOST_TEST(s.noted(note_kind::backoff_started));
    BOOST_TEST(s.total() == 0u);
    BOOST_TEST(s.armed(rdy_timer::backoff));

    s.advance(seconds(2));  // level 1: 2 s → trial RDY 1 on one connection
    BOOST_TEST(s.noted(note_kind::trial));
    BOOST_TEST(s.total() == 1u);
    std::string trial = s.rdy(key(0)) == 1 ? key(0) : key(1);
    std::string other = trial == key(0) ? key(1) : key(0);
    BOOST_TEST(!s.armed(rdy_timer::backoff));

    s.remove(trial);  // no message came, no handler pending
    BOOST_TEST(s.noted(note_kind::trial_lost));
    BOOST_TEST(s.armed(rdy_timer::backoff), "nothing re-armed the backoff: RDY 0 for ever");
    BOOST_TEST(s.total() == 0u);

    s.advance(seconds(2));
    BOOST_TEST(s.rdy(other) == 1u);  // a new trial on the connection left
    s.receive(other);
    s.finish(handler_signal::success);
    BOOST_TEST(!s.c.backing_off());
    BOOST_TEST(s.noted(note_kind::backoff_ended));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(other) == 10u);
    BOOST_TEST(s.budget_violations == 0u);
}

// The same drop with the trial's message still being handled: its result decides the next step, so no
// re-arm yet; a failure then backs off again with the timer armed.
BOOST_AUTO_TEST_CASE(backoff_waits_for_a_pending_handler_before_re_arming) {
    sim s(4);
    s.add(key(0));
    s.receive(key(0));
    s.finish(handler_signal::failure);
    s.advance(seconds(2));
    BOOST_TEST(s.rdy(key(0)) == 1u);
    s.receive(key(0));
    s.remove(key(0));
    BOOST_TEST(!s.armed(rdy_timer::backoff));
    BOOST_TEST(!s.noted(note_kind::trial_lost));
    s.finish(handler_signal::failure);
    BOOST_TEST(s.armed(rdy_timer::backoff));
    BOOST_TEST(s.c.backoff_level() == 2);
    // No connection at all when the timer fires: it keeps trying every second until one is back.
    s.advance(seconds(4));
    BOOST_TEST(s.armed(rdy_timer::backoff));
    s.add(key(1));
    s.advance(seconds(1));
    BOOST_TEST(s.rdy(key(1)) == 1u);
}

// A backoff signal table: the level after a sequence of handler results, and whether RDY is full again.
BOOST_AUTO_TEST_CASE(backoff_levels_follow_handler_results) {
    using hs = handler_signal;
    struct row {
        std::vector<hs> signals;  // each after the backoff timer fired and a trial message arrived
        int level;
    };
    const row rows[] = {
        {{hs::failure}, 1},
        {{hs::failure, hs::failure}, 2},
        {{hs::failure, hs::success}, 0},
        {{hs::failure, hs::failure, hs::success}, 1},
        {{hs::failure, hs::neutral}, 1},
        {{hs::neutral}, 0},
        {{hs::success}, 0},
    };
    for (const auto& r : rows) {
        sim s(8);
        s.add(key(0));
        s.add(key(1));
        for (auto sig : r.signals) {
            s.advance(minutes(5));  // any backoff timer fired: a trial (or full) RDY is out
            auto holder = s.rdy(key(0)) > 0 ? key(0) : key(1);
            s.receive(holder);
            s.finish(sig);
        }
        BOOST_TEST(s.c.backoff_level() == r.level);
        s.advance(milliseconds(500));
        BOOST_TEST(s.total() == (r.level == 0 ? 8u : 0u));
        BOOST_TEST(s.budget_violations == 0u);
    }
}

// Signals from messages already in flight during a backoff timeout do not move the level.
BOOST_AUTO_TEST_CASE(signals_during_a_backoff_timeout_are_ignored) {
    sim s(8);
    s.add(key(0));
    for (int i = 0; i < 5; ++i) s.receive(key(0));
    s.finish(handler_signal::failure);
    for (int i = 0; i < 4; ++i) s.finish(handler_signal::failure);
    BOOST_TEST(s.c.backoff_level() == 1);
    BOOST_TEST(s.total() == 0u);
}

BOOST_AUTO_TEST_CASE(stop_sends_rdy_0_everywhere_then_stays_quiet) {
    sim s(6);
    s.add(key(0));
    s.add(key(1));
    s.advance(seconds(1));
    s.receive(key(0));
    auto out = s.c.stop();
    BOOST_TEST(out.rdy.size() == 2u);
    s.take(out);
    BOOST_TEST(s.total() == 0u);
    s.finish(handler_signal::failure);
    BOOST_TEST(s.last_rdy.empty());
    BOOST_TEST(s.c.timer_fired(rdy_timer::redistribute, s.now).empty());
    BOOST_TEST(s.c.connection_added(key(2), 2500, s.now).empty());
    BOOST_TEST(s.c.read_batch_done(key(1)).empty());
    BOOST_TEST(s.c.pending() == 0u);
}

BOOST_AUTO_TEST_CASE(a_timer_not_armed_is_ignored) {
    rdy_controller c(settings(4));
    BOOST_TEST(c.timer_fired(rdy_timer::backoff, clock::now()).empty());
    BOOST_TEST(c.timer_fired(rdy_timer::settle, clock::now()).empty());
    BOOST_TEST(c.timer_fired(rdy_timer::redistribute, clock::now()).empty());
    auto out = c.start();
    BOOST_TEST(out.timers.size() == 1u);
    BOOST_TEST(!c.timer_fired(rdy_timer::redistribute, clock::now()).timers.empty());  // re-armed
}

BOOST_AUTO_TEST_SUITE_END()
