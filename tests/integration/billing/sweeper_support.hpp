// Helpers for the sweeper tests: a sweeper configuration that takes up every expired row, expiring a
// row's lease, and one sweep run on the fixture's io_context.
#pragma once

#include <boost/test/unit_test.hpp>
#include <string>

#include "billing/heal/sweeper.hpp"
#include "fixture.hpp"

namespace cg::test::sweeper_support {

using namespace std::chrono_literals;
using fixture = test::billing_fixture;
using report = result<billing::sweep_report>;

inline billing::sweeper_config sweep_now() {
    billing::sweeper_config c;
    c.after = 0ms;  // any pending row whose lease has expired counts as abandoned
    c.interval = 1h;
    return c;
}

// The row's message is gone and its lease has run out (a failover lost the settle; the worker moved on).
inline void expire_lease(fixture& f, const std::string& key) {
    auto r = f.run(f.query("UPDATE billing_records SET lease_until = now() - interval '1 s' WHERE key = $1",
                           pg::params(key)));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
}

inline report sweep(fixture& f, billing::sweeper& s) {
    return f.run(s.sweep_once());
}

}  // namespace cg::test::sweeper_support
