// The built `chargeguard` executable, table-driven: argv + environment → exit code + a phrase on its output.
// Every bad input of the operator CLI: durations, exit codes, sanity limits, reconcile's checks, explain's
// arguments (cli_table.hpp). Where values and secrets come from is cli_table_environment_test.cpp. Every
// case fails before anything connects, so none needs a server.
#define BOOST_TEST_MODULE cli_table
#include "cli_table.hpp"

#include <boost/test/unit_test.hpp>
#include <string>
#include <vector>

BOOST_AUTO_TEST_CASE(durations_take_one_syntax_and_errors_say_where_the_value_came_from) {
    check({
        {"not a duration on the command line", consume({"--shutdown-timeout", "abc"}), stripe_key, 64,
         "--shutdown-timeout abc: not a duration", "--shutdown-timeout: --shutdown-timeout"},
        {"not a duration from the environment", consume({}),
         with(stripe_key, {{"CHARGEGUARD_SHUTDOWN_TIMEOUT", "abc"}}), 78,
         "CHARGEGUARD_SHUTDOWN_TIMEOUT=abc: not a duration", ""},
        {"an NSQ duration from the environment out of range", consume({}),
         with(stripe_key, {{"CHARGEGUARD_MSG_TIMEOUT", "500ms"}}), 78,
         "CHARGEGUARD_MSG_TIMEOUT=500ms: out of range", ""},
        {"an NSQ duration on the command line", consume({"--msg-timeout", "soon"}), stripe_key, 64,
         "--msg-timeout soon: not a duration", ""},
        // 0 would leave the timeout to nsqd while TOUCH and the sweeper assume one: refused, not documented.
        {"a zero message timeout on the command line", consume({"--msg-timeout", "0"}), stripe_key, 64,
         "--msg-timeout 0: 0 is not accepted", ""},
        {"a zero message timeout as a Go duration", consume({"--msg-timeout", "0s"}), stripe_key, 64,
         "--msg-timeout 0s: 0 is not accepted", ""},
        {"a zero message timeout from the environment", consume({}),
         with(stripe_key, {{"CHARGEGUARD_MSG_TIMEOUT", "0"}}), 78,
         "CHARGEGUARD_MSG_TIMEOUT=0: 0 is not accepted", ""},
        {"a message timeout above nsqd's maximum", consume({"--msg-timeout", "16m"}), stripe_key, 64,
         "--msg-timeout 16m: out of range: 1s .. 15m", ""},
        // Go durations for runtime/PostgreSQL/Stripe flags and bare seconds for NSQ ones are accepted: the
        // run gets as far as the bad --health-listen, checked last.
        {"both syntaxes accepted everywhere",
         consume({"--shutdown-timeout", "1m30s", "--msg-timeout", "60", "--pg-query-timeout", "250ms",
                  "--stripe-request-timeout", "30s", "--lease", "120", "--health-listen", "bogus"}),
         stripe_key, 64, "--health-listen bogus: bad address (expected host:port)", "chargeguard.net"},
        {"a duration out of range", consume({"--shutdown-timeout", "2h"}), stripe_key, 64,
         "--shutdown-timeout 2h: out of range 0s .. 1h", ""},
        {"the processing poll bound out of range", consume({"--processing-poll-after", "0s"}), stripe_key, 64,
         "--processing-poll-after 0s: must be between 1s and 168h", ""},
        {"probe takes a Go duration",
         {"probe", "--timeout", "2s", "http://" + nowhere + "/healthz"},
         {},
         1,
         "probe:",
         ""},
        {"migrate's lock timeout",
         {"migrate", "--lock-timeout", "forever"},
         {},
         64,
         "--lock-timeout forever: not a duration",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(exit_codes_are_the_table_and_cli11_codes_never_leak) {
    check({
        {"no subcommand", {}, {}, 64, "A subcommand is required", ""},
        {"an unknown flag", {"tail", "--topic", "t", "--bogus"}, {}, 64, "--bogus", ""},
        {"a missing required flag",
         {"publish", "--topic", "t", "f.jsonl"},
         {},
         64,
         "--nsqd-tcp-address is required",
         ""},
        {"a malformed number", {"tail", "--topic", "t", "--max-in-flight", "many"}, {}, 64, "many", ""},
        {"help is 0 and shows the exit-code table", {"--help"}, {}, 0, "78  configuration error", ""},
        {"--log-level after the subcommand", consume({"--log-level", "debug", "--shutdown-timeout", "x"}),
         stripe_key, 64, "--shutdown-timeout x: not a duration", ""},
        {"--log-level before the subcommand", {"--log-level", "loud", "tail"}, {}, 64, "loud", ""},
        {"a malformed DSN says so once", consume({"--pg-dsn", "nonsense"}), stripe_key, 64,
         "--pg-dsn: ", "--pg-dsn: --pg-dsn"},
        {"a bad nsqd address leaks no category",
         {"tail", "--topic", "t", "--nsqd-tcp-address", "nsqd-without-port"},
         {},
         64,
         "--nsqd-tcp-address nsqd-without-port: bad address",
         "chargeguard.net:"},
    });
}

BOOST_AUTO_TEST_CASE(sanity_limits) {
    auto dir = scratch() + "/secret-dir";
    ::mkdir(dir.c_str(), 0700);
    auto empty = write_file("empty-secret", "\n");
    auto two_lines = write_file("two-line-secret", "first\nsecond-secret-line\n");
    check({
        {"max-in-flight above nsqd's max-rdy-count",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--max-in-flight", "100000"},
         {},
         64,
         "--max-in-flight 100000: above 2500",
         ""},
        {"the acknowledgement is never taken from the environment",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--max-in-flight", "3000"},
         {{"CHARGEGUARD_MAX_IN_FLIGHT_ABOVE_NSQD_DEFAULT", "true"}},
         64,
         "above 2500",
         ""},
        {"nsqd and lookupd together",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--lookupd-http-address", nowhere},
         {},
         64,
         "exclude each other",
         ""},
        {"a Stripe pool above its cap", consume({"--stripe-max-connections", "5000"}), stripe_key, 64,
         "above --stripe-connection-cap", ""},
        {"an AUTH secret file that is a directory",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", dir},
         {},
         78,
         "is a directory",
         ""},
        {"an AUTH secret file that is missing",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", dir + "/none"},
         {},
         78,
         "no such file",
         ""},
        {"an AUTH secret file that is empty",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", empty},
         {},
         78,
         "is empty",
         ""},
        {"an AUTH secret file of two lines",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", two_lines},
         {},
         78,
         "more than one line",
         "second-secret"},
        {"an AUTH secret file from the environment names the variable",
         {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere},
         {{"CHARGEGUARD_NSQ_AUTH_SECRET_FILE", dir}},
         78,
         "CHARGEGUARD_NSQ_AUTH_SECRET_FILE=" + dir + ": is a directory",
         ""},
    });
    auto not_pem = write_file("not-pem.key", "just some text\n");
    auto cert = write_file("cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    check({
        {"a proxy TLS key that is a directory",
         {"proxy", "--tls-cert", cert, "--tls-key", dir},
         stripe_key,
         78,
         "--tls-key " + dir + ": is a directory",
         ""},
        {"a proxy TLS key that is not PEM",
         {"proxy", "--tls-cert", cert, "--tls-key", not_pem},
         stripe_key,
         78,
         "not a PEM private key",
         "just some text"},
        {"a proxy duration in Go syntax, then a bad one",
         {"proxy", "--upstream-timeout", "45s", "--read-timeout", "x"},
         stripe_key,
         64,
         "--read-timeout x: not a duration",
         ""},
        {"a proxy forwarding bound past its range",
         {"proxy", "--max-forwarding", "70000"},
         stripe_key,
         64,
         "--max-forwarding: Value 70000 not in range",
         ""},
        // CLI11's own range check, attributed to the variable the value came from (a configuration error).
        {"a proxy forwarding bound from the environment, past its range",
         {"proxy"},
         with(stripe_key, {{"CHARGEGUARD_MAX_FORWARDING", "-1"}}),
         78,
         "CHARGEGUARD_MAX_FORWARDING: Value -1 not in range",
         ""},
    });
    if (::geteuid() != 0) {
        auto locked = write_file("locked-secret", "s3cret\n");
        ::chmod(locked.c_str(), 0);
        check({{"an unreadable AUTH secret file",
                {"tail", "--topic", "t", "--nsqd-tcp-address", nowhere, "--nsq-auth-secret-file", locked},
                {},
                78,
                "permission denied",
                ""}});
    }
}

BOOST_AUTO_TEST_CASE(reconcile_refuses_a_check_that_checks_nothing) {
    auto events =
        write_file("recon.jsonl",
                   "{\"customer_id\":\"acme-42\",\"billing_period\":\"2026-11\",\"amount_cents\":1999,"
                   "\"currency\":\"usd\",\"stripe_customer_id\":\"cus_1\"}\n");
    auto none = write_file("recon-none.jsonl", "");
    check({
        {"an empty expected set",
         {"reconcile", "--expected", none, "--period", "2026-11"},
         stripe_key,
         2,
         "holds no events",
         ""},
        {"a period not of the events' form",
         {"reconcile", "--expected", events, "--period", "November"},
         stripe_key,
         2,
         "--period November does not have the form of the events' periods (2026-11)",
         ""},
        {"no event of the period",
         {"reconcile", "--expected", events, "--period", "2026-12"},
         stripe_key,
         2,
         "has no event of period 2026-12 (its periods: 2026-11)",
         ""},
        {"no event of the customer",
         {"reconcile", "--expected", events, "--period", "2026-11", "--customer", "nobody"},
         stripe_key,
         2,
         "no event of customer nobody in period 2026-11",
         ""},
        {"a period of impossible characters",
         {"reconcile", "--expected", events, "--period", "2026/11"},
         stripe_key,
         64,
         "--period 2026/11: not 1-64 characters",
         ""},
    });
}

BOOST_AUTO_TEST_CASE(explain_refuses_unclear_subjects) {
    check({
        {"nothing on stdin", {"explain"}, {}, 64, "stdin: not a billing event", ""},
        {"a key that is not one", {"explain", "--key", "xyz"}, {}, 64, "--key xyz: not a billing key", ""},
        {"a key and a customer",
         {"explain", "--key", "0123456789abcdef0123456789abcdef", "--customer", "c", "--period", "p"},
         {},
         64,
         "not both",
         ""},
        {"a customer without a period", {"explain", "--customer", "c"}, {}, 64, "go together", ""},
        {"a Stripe customer without a period",
         {"explain", "--stripe-customer", "cus_1"},
         {},
         64,
         "--stripe-customer needs --period",
         ""},
    });
}
