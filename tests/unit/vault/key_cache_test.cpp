#include "vault/key_cache.hpp"

#include <boost/test/unit_test.hpp>
#include <chrono>

using namespace cg::vault;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(key_cache)

BOOST_AUTO_TEST_CASE(a_row_younger_than_the_ttl_is_used_by_reads_and_creates) {
    BOOST_TEST((use_cached_key(0ms, 1000ms, false) == cached_key_use::fresh));
    BOOST_TEST((use_cached_key(999ms, 1000ms, true) == cached_key_use::fresh));
}

BOOST_AUTO_TEST_CASE(an_older_row_serves_a_create_with_a_refresh_but_a_read_reads_again) {
    BOOST_TEST((use_cached_key(1000ms, 1000ms, true) == cached_key_use::stale_usable));
    BOOST_TEST((use_cached_key(std::chrono::hours(1), 1000ms, true) == cached_key_use::stale_usable));
    BOOST_TEST((use_cached_key(1000ms, 1000ms, false) == cached_key_use::read));
}

BOOST_AUTO_TEST_CASE(a_zero_ttl_turns_the_cache_off) {
    BOOST_TEST((use_cached_key(0ms, 0ms, true) == cached_key_use::read));
    BOOST_TEST((use_cached_key(0ms, 0ms, false) == cached_key_use::read));
}

BOOST_AUTO_TEST_SUITE_END()
