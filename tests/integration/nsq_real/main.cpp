// The real-broker suite needs the NSQ 1.3.0 daemons; without them it says so and exits 77 (meson: skipped).
#define BOOST_TEST_MODULE nsq_real
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>

int main(int argc, char* argv[]) {
    if (!std::getenv("NSQD_BIN") || !std::getenv("NSQLOOKUPD_BIN")) {
        std::printf(
            "skipped: NSQD_BIN / NSQLOOKUPD_BIN not set (the real nsqd 1.3.0 binaries, see "
            "ci/lib.sh export_nsq_tools); the real-broker suite did not run\n");
        return 77;
    }
    return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
