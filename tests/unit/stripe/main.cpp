#define BOOST_TEST_MODULE stripe
#include <boost/test/unit_test.hpp>
