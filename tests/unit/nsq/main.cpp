#define BOOST_TEST_MODULE nsq_unit
#include <boost/test/unit_test.hpp>
