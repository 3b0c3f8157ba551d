// The simulator's checks (docs/testing.md "The simulator"):
//   * with every safeguard in place, no invariant breaks over the budget of schedules;
//   * each safeguard removed, the simulator reports a violation within a small budget (its teeth);
//   * a seed replays bit for bit.
// Environment: CHARGEGUARD_SIM_SCHEDULES (the budget of schedules, set by meson per build tree),
// CHARGEGUARD_SIM_SEED (the first seed; with CHARGEGUARD_SIM_SCHEDULES=1 it replays one seed and prints its
// schedule), CHARGEGUARD_SIM_REMOVE (a safeguard to switch off, to replay a seed of the teeth table),
// CHARGEGUARD_SIM_KEEP_FAULTS (the faults a shrunk schedule kept, as a failure prints them),
// CHARGEGUARD_SIM_FAILOVERS=0 (no PostgreSQL failover), CHARGEGUARD_SIM_RESOLVER_LAG=1 (the vault resolver's
// search sees Stripe's list lag), CHARGEGUARD_SIM_RESOLVER_REPLAY_LATE=1 (it replays for 23 h, as it ships).
#define BOOST_TEST_MODULE chargeguard_sim
#include "sim.hpp"

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

using namespace cg::sim;

namespace {

std::uint64_t env_number(const char* name, std::uint64_t fallback) {
    const char* v = std::getenv(name);
    if (!v || !*v) return fallback;
    return std::strtoull(v, nullptr, 10);
}

// The safeguards CHARGEGUARD_SIM_REMOVE names (comma-separated).
std::vector<safeguard> removed_by_env() {
    std::vector<safeguard> out;
    const char* v = std::getenv("CHARGEGUARD_SIM_REMOVE");
    std::string names = v ? v : "";
    for (auto g : all_safeguards)
        if (names.find(std::string(to_string(g))) != std::string::npos) out.push_back(g);
    return out;
}

void print_failure(const run_result& r, const config& c) {
    std::string env;
    for (std::size_t i = 0; i < c.removed.size(); ++i)
        env += (i ? "," : " CHARGEGUARD_SIM_REMOVE=") + std::string(to_string(c.removed[i]));
    std::cout << "seed " << r.seed << " broke an invariant; replay: CHARGEGUARD_SIM_SEED=" << r.seed
              << " CHARGEGUARD_SIM_SCHEDULES=1" << env
              << " test_sim --run_test=every_safeguard_in_place_holds\n";
    for (const auto& v : r.violations) std::cout << "  " << v << "\n";
    config again = c;
    again.seed = r.seed;
    again.trace = true;
    auto t = run(again);
    std::size_t from = t.schedule.size() > 400 ? t.schedule.size() - 400 : 0;
    std::cout << "  schedule (last " << (t.schedule.size() - from) << " of " << t.schedule.size()
              << " steps):\n";
    for (std::size_t i = from; i < t.schedule.size(); ++i) std::cout << "    " << t.schedule[i] << "\n";
}

// The failing seed's faults shrunk to a short schedule that still fails, printed with how to replay it.
void print_shrunk(const config& failing) {
    auto sh = shrink(failing, run);
    std::cout << "  shrunk in " << sh.runs << " runs from " << sh.original << " faults to " << sh.kept.size()
              << " (CHARGEGUARD_SIM_KEEP_FAULTS=";
    for (std::size_t i = 0; i < sh.kept.size(); ++i) std::cout << (i ? "," : "") << sh.kept[i];
    std::cout << "), still failing: " << (sh.result.violations.empty() ? "no" : sh.result.violations.front())
              << "\n";
    for (const auto& line : sh.schedule) std::cout << "    " << line << "\n";
}

// CHARGEGUARD_SIM_KEEP_FAULTS: a shrunk schedule's faults (comma-separated numbers) to replay.
std::optional<std::vector<std::uint32_t>> kept_by_env() {
    const char* v = std::getenv("CHARGEGUARD_SIM_KEEP_FAULTS");
    if (!v) return std::nullopt;
    std::vector<std::uint32_t> out;
    for (const char* p = v; *p;) {
        char* end = nullptr;
        out.push_back(static_cast<std::uint32_t>(std::strtoul(p, &end, 10)));
        p = *end ? end + 1 : end;
    }
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_safeguard_in_place_holds) {
    const std::uint64_t schedules = env_number("CHARGEGUARD_SIM_SCHEDULES", 2000);
    const std::uint64_t first = env_number("CHARGEGUARD_SIM_SEED", 1);
    std::uint64_t deliveries = 0, steps = 0, creates = 0, broken = 0, lost = 0, swept = 0, ended = 0,
                  replays = 0, refused = 0, bugs = 0, blocked = 0;
    // A safety net for an overloaded machine, never reached on an idle one: past this many seconds the run
    // stops early and says so (0: no cap).
    const std::uint64_t cap = env_number("CHARGEGUARD_SIM_MAX_SECONDS", 0);
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    std::uint64_t ran = 0;
    for (std::uint64_t s = first; s < first + schedules; ++s, ++ran) {
        if (cap && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(cap)) {
            std::cout << "simulator: stopped at the " << cap << " s cap after " << ran << " of " << schedules
                      << " schedules\n";
            break;
        }
        config c;
        c.seed = s;
        c.trace = schedules == 1;
        c.removed = removed_by_env();
        c.keep_faults = kept_by_env();
        c.failovers = env_number("CHARGEGUARD_SIM_FAILOVERS", 1) != 0;
        c.resolver_list_lag = env_number("CHARGEGUARD_SIM_RESOLVER_LAG", 0) != 0;
        c.resolver_replay_late = env_number("CHARGEGUARD_SIM_RESOLVER_REPLAY_LATE", 0) != 0;
        auto r = run(c);
        deliveries += r.deliveries;
        steps += r.steps;
        creates += r.stripe_creates;
        lost += r.lost_commits;
        swept += r.swept;
        ended += r.leases_ended;
        replays += r.replays;
        refused += r.cap_refusals;
        bugs += r.upstream_bugs;
        blocked += r.valid_cap_blocked;
        if (schedules == 1)
            for (const auto& line : r.schedule) std::cout << line << "\n";
        if (!r.violations.empty()) {
            if (++broken <= 3) print_failure(r, c);
            if (broken == 1 && !c.keep_faults) print_shrunk(c);
        }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "simulator: " << ran << " schedules, " << deliveries << " deliveries, " << creates
              << " Stripe creates, " << steps << " steps in " << secs
              << " s: " << static_cast<double>(ran) / secs << " schedules/s, " << deliveries / secs
              << " deliveries/s (CPU " << static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC << " s); "
              << broken << " broken; " << lost << " commits lost to failovers, " << swept << " rows swept ("
              << ended << " after ending a lease nothing wrote since a failover), " << replays
              << " dead letters replayed; " << bugs << " events of the upstream bug, " << refused
              << " creates refused by the vault's cap, " << blocked << " valid events cap_blocked\n";
    BOOST_TEST(broken == 0u);
    BOOST_TEST(ran > 0u);
    // The failovers, the sweepers and the operator's replays did run (a budget of a few hundred suffices).
    if (ran >= 500 && env_number("CHARGEGUARD_SIM_FAILOVERS", 1) != 0) {
        BOOST_TEST(lost > 0u);
        BOOST_TEST(swept > 0u);
        BOOST_TEST(ended > 0u);
        BOOST_TEST(replays > 0u);
        BOOST_TEST(refused > 0u);
    }
}

// Each safeguard switched off alone: some seed within the budget must break an invariant.
BOOST_AUTO_TEST_CASE(each_removed_safeguard_is_caught) {
    const std::uint64_t budget = env_number("CHARGEGUARD_SIM_TEETH_BUDGET", 5000);
    for (auto g : all_safeguards) {
        std::uint64_t found = 0;
        std::string what;
        std::uint64_t tried = 0;
        for (std::uint64_t s = 1; s <= budget && !found; ++s) {
            config c;
            c.seed = s;
            c.removed = {g};
            auto r = run(c);
            ++tried;
            if (!r.violations.empty()) {
                found = s;
                what = r.violations.front();
            }
        }
        std::cout << "without " << to_string(g) << ": "
                  << (found ? "seed " + std::to_string(found) + " (" + std::to_string(tried) +
                                  " schedules): " + what
                            : "no violation in " + std::to_string(tried) + " schedules")
                  << "\n";
        BOOST_TEST(found != 0u, "removing " << to_string(g) << " went unnoticed");
    }
}

// A correction revision (a refund or an extra charge) run by the revision fsm that ships
// (billing::machine::revision_fsm): with every safeguard in place no invariant breaks (as many schedules as
// the charges'); without the search before a new key generation, or without the quiet period, a move is made
// twice within the budget.
BOOST_AUTO_TEST_CASE(corrections_hold_and_their_safeguards_are_caught) {
    const std::uint64_t schedules = env_number("CHARGEGUARD_SIM_SCHEDULES", 2000);
    const std::uint64_t first = env_number("CHARGEGUARD_SIM_SEED", 1);
    std::uint64_t deliveries = 0, creates = 0, broken = 0;
    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    for (std::uint64_t s = first; s < first + schedules; ++s) {
        config c;
        c.seed = s;
        c.trace = schedules == 1;
        c.removed = removed_by_env();
        auto r = run_corrections(c);
        deliveries += r.deliveries;
        creates += r.stripe_creates;
        if (schedules == 1)
            for (const auto& line : r.schedule) std::cout << line << "\n";
        if (!r.violations.empty() && ++broken <= 3) {
            std::cout << "corrections: seed " << s << " broke an invariant\n";
            for (const auto& v : r.violations) std::cout << "  " << v << "\n";
        }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "corrections simulator: " << schedules << " schedules, " << deliveries << " deliveries, "
              << creates << " Stripe creates in " << secs << " s: " << static_cast<double>(schedules) / secs
              << " schedules/s (CPU " << static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC << " s); "
              << broken << " broken\n";
    if (removed_by_env().empty()) BOOST_TEST(broken == 0u);
    const std::uint64_t budget = env_number("CHARGEGUARD_SIM_TEETH_BUDGET", 5000);
    for (auto g : {safeguard::search_before_new_key, safeguard::quiet_period}) {
        std::uint64_t found = 0;
        std::string what;
        for (std::uint64_t s = 1; s <= budget && !found; ++s) {
            config c;
            c.seed = s;
            c.removed = {g};
            auto r = run_corrections(c);
            if (!r.violations.empty()) {
                found = s;
                what = r.violations.front();
            }
        }
        std::cout << "corrections without " << to_string(g) << ": "
                  << (found ? "seed " + std::to_string(found) + ": " + what : std::string("no violation"))
                  << "\n";
        BOOST_TEST(found != 0u, "removing " << to_string(g) << " from the corrections went unnoticed");
    }
}

BOOST_AUTO_TEST_CASE(a_seed_replays_bit_for_bit) {
    config c;
    c.seed = 42;
    c.trace = true;
    auto a = run(c);
    auto b = run(c);
    BOOST_TEST(a.digest == b.digest);
    BOOST_TEST(a.schedule == b.schedule);
    BOOST_TEST(a.deliveries > 0u);
    c.seed = 43;
    auto other = run(c);
    BOOST_TEST(other.digest != a.digest);
    // The correction simulator's seeds replay too.
    c.seed = 42;
    auto ca = run_corrections(c);
    auto cb = run_corrections(c);
    BOOST_TEST(ca.digest == cb.digest);
    BOOST_TEST(ca.schedule == cb.schedule);
    BOOST_TEST(ca.deliveries > 0u);
    c.seed = 43;
    BOOST_TEST(run_corrections(c).digest != ca.digest);
}

// The shrinker, on a deliberately broken world (the sweeper switched off, so a failover that loses a
// settle leaves its row pending for good): it finds a failing seed, shrinks its faults to a shorter
// schedule that still fails, and that schedule replays bit for bit.
BOOST_AUTO_TEST_CASE(a_failing_schedule_shrinks_and_replays) {
    const std::uint64_t budget = env_number("CHARGEGUARD_SIM_TEETH_BUDGET", 5000);
    config c;
    c.removed = {safeguard::sweeper};
    std::uint64_t found = 0;
    for (std::uint64_t s = 1; s <= budget && !found; ++s) {
        c.seed = s;
        if (!run(c).violations.empty()) found = s;
    }
    BOOST_REQUIRE(found != 0u);
    c.seed = found;
    auto sh = shrink(c, run);
    std::cout << "shrinker: seed " << found << " (without the sweeper): " << sh.original << " faults -> "
              << sh.kept.size() << " in " << sh.runs << " runs\n";
    for (const auto& line : sh.schedule) std::cout << "    " << line << "\n";
    BOOST_TEST(sh.kept.size() < sh.original);
    BOOST_TEST(!sh.result.violations.empty());
    config again = c;
    again.keep_faults = sh.kept;
    again.trace = true;
    auto a = run(again);
    BOOST_TEST(!a.violations.empty());
    BOOST_TEST(a.digest == sh.result.digest);
    BOOST_TEST(a.schedule == sh.result.schedule);
    BOOST_TEST(a.faults <= sh.kept.size());
    // With every safeguard in place the same shrunk schedule holds: the sweeper heals what the failover lost.
    again.removed.clear();
    auto healed = run(again);
    BOOST_TEST(healed.violations.empty());
    BOOST_TEST(healed.lost_commits > 0u);
    BOOST_TEST(healed.swept > 0u);
}
