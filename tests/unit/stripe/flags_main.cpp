#define BOOST_TEST_MODULE stripe_flags
#include <boost/test/unit_test.hpp>
