#define BOOST_TEST_MODULE stripe_integration
#include <boost/test/unit_test.hpp>
