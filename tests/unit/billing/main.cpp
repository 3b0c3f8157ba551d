#define BOOST_TEST_MODULE billing
#include <boost/test/unit_test.hpp>
