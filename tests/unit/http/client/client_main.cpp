#define BOOST_TEST_MODULE http_client
#include <boost/test/unit_test.hpp>
