#define BOOST_TEST_MODULE pg
#include <boost/test/unit_test.hpp>
