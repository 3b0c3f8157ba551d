#define BOOST_TEST_MODULE nsq_integration
#include <boost/test/unit_test.hpp>
