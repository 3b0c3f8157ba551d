// consume's --connect-accounts and --connect-accounts-file: the connected accounts the backfill always
// searches.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>

#include "app/heal.hpp"

using namespace cg::app;

BOOST_AUTO_TEST_SUITE(connect_accounts_suite)

// The list (commas or blanks) then the file (one or more a line, '#' comments), in order, each once; an empty
// setting is no account.
BOOST_AUTO_TEST_CASE(list_and_file_in_order_each_once) {
    heal_flags f;
    BOOST_TEST(connect_accounts_of(f).empty());
    f.connect_accounts = "acct_1A, acct_1B acct_1A,";
    f.connect_accounts_file = "/tmp/cg-connect-accounts-" + std::to_string(::getpid());
    std::ofstream(f.connect_accounts_file)
        << "# shops\nacct_1C  # the big one\n\nacct_1B\r\nacct_1D acct_1E\n";
    auto got = connect_accounts_of(f);
    std::remove(f.connect_accounts_file.c_str());
    const std::vector<std::string> want{"acct_1A", "acct_1B", "acct_1C", "acct_1D", "acct_1E"};
    BOOST_TEST(got == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(refuses_what_is_not_an_account_and_an_unreadable_file) {
    heal_flags f;
    f.connect_accounts = "acct_1A,cus_1B";
    BOOST_CHECK_THROW(connect_accounts_of(f), CLI::ValidationError);
    f.connect_accounts = "acct_1A";
    f.connect_accounts_file = "/nonexistent/accounts";
    BOOST_CHECK_THROW(connect_accounts_of(f), CLI::ValidationError);
}

BOOST_AUTO_TEST_SUITE_END()
