#define BOOST_TEST_MODULE health_server
#include <boost/test/unit_test.hpp>
