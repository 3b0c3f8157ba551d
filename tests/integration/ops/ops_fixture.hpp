// The fixture of the ops_e2e executable (its test files include it, main.cpp holds main): `consume` and the
// one-shot subcommands as the built binary, against fake-nsqd (or the real nsqd when NSQD_BIN is set) and
// fake-stripe over TLS on the test's io_context, a scratch PostgreSQL database; and the parsers of the
// subcommands' output the tests share. Every wait polls a condition (fake-nsqd counters, fake-stripe state,
// the child's exit) with a deadline.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "billing/machine/key.hpp"
#include "http/client.hpp"
#include "nsq/http_get.hpp"
#include "support/chargeguard_e2e.hpp"
#include "support/run_async.hpp"
#include "tests/integration/nsq/helpers.hpp"

using namespace cg;
using namespace std::chrono;
using nsqtest::eventually;
using test::child_process;

namespace {

const std::string topic = "billing", channel = "chargeguard", key_namespace = "ops";
const std::string stripe_key = "sk_test_ops_never_logged";

inline std::string event_json(const std::string& customer, const std::string& period, std::int64_t amount,
                              const std::string& stripe_customer = "cus_ops") {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","description":"plan"})";
}

inline std::string key_of(const std::string& customer, const std::string& period) {
    return billing::base_key(key_namespace, customer, period);
}

// argv for a subcommand, built outside co_await expressions (g++ 12: no braced list inside co_await).
template <typename... A>
std::vector<std::string> argv(A&&... a) {
    return std::vector<std::string>{std::string(std::forward<A>(a))...};
}

inline unsigned short free_port() {
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t n = sizeof a;
    ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
    ::close(s);
    return ntohs(a.sin_port);
}

using child = child_process;

struct ops : test::chargeguard_e2e<> {
    std::vector<std::string> files;

    // The file's constants (the base class has members of the same names).
    ops() : chargeguard_e2e("ops", ::topic, ::channel, ::stripe_key) {}
    ~ops() {
        for (const auto& f : files) ::unlink(f.c_str());
    }

    std::string write_file(const std::string& name, const std::string& text) {
        auto path = tmp + "-" + name;
        std::ofstream(path) << text;
        files.push_back(path);
        return path;
    }

    std::string stripe_base() const { return "https://127.0.0.1:" + std::to_string(port); }
    std::vector<std::string> stripe_args() const {
        return {"--stripe-api-base",      stripe_base(), "--stripe-ca-file",   test::cert("ca.pem"),
                "--stripe-retry-initial", "0.05",        "--stripe-retry-max", "0.2"};
    }

    child& spawn(std::vector<std::string> args) { return children.spawn(std::move(args)); }

    // Runs a one-shot subcommand to completion: its exit code; its output stays in the child.
    net::awaitable<int> run_cmd(child*& c, std::vector<std::string> args, milliseconds limit = seconds(60)) {
        c = &spawn(std::move(args));
        co_return co_await wait_exit(*c, limit);
    }

    child& spawn_consume(const std::string& nsqd_address, const std::vector<std::string>& extra = {}) {
        std::vector<std::string> a = {
            "consume", "--topic", topic, "--channel", channel, "--nsqd-tcp-address", nsqd_address,
            "--heartbeat-interval", "1s", "--pg-dsn", dsn(), "--migrate", "--key-namespace", key_namespace,
            // A duplicate waits for its original's lease: keep the lease short.
            "--lease", "2s", "--lease-renew-interval", "500ms", "--lease-held-delay", "200ms",
            "--retry-same-key-delay", "200ms", "--indeterminate-delay", "300ms", "--new-key-quiet", "1s",
            "--health-listen", "127.0.0.1:0", "--shutdown-timeout", "10", "--max-loop-lag", "5",
            "--max-in-flight", "50"};
        auto s = stripe_args();
        a.insert(a.end(), s.begin(), s.end());
        a.insert(a.end(), extra.begin(), extra.end());
        // Discovery through nsqlookupd instead (the two exclude each other).
        if (std::find(extra.begin(), extra.end(), "--lookupd-http-address") != extra.end()) {
            auto at = std::find(a.begin(), a.end(), "--nsqd-tcp-address");
            a.erase(at, at + 2);
        }
        return spawn(a);
    }

    net::awaitable<void> stop_cleanly(child& c) {
        ::kill(c.pid, SIGTERM);
        int code = co_await wait_exit(c, seconds(20));
        BOOST_TEST(code == 0, c.err());
        BOOST_TEST(c.err().find(stripe_key) == std::string::npos);
    }

    net::awaitable<void> migrate() {
        child* c = nullptr;
        int rc = co_await run_cmd(c, argv("migrate", "--pg-dsn", dsn()));
        BOOST_TEST_REQUIRE(rc == 0, c->err());
    }

    net::awaitable<std::int64_t> add_letter(const std::string& body, const std::string& reason) {
        std::string b;
        for (char ch : body) b += ch == '\'' ? std::string("''") : std::string(1, ch);
        auto r = co_await query(
            "INSERT INTO dead_letters (topic, channel, nsq_message_id, attempts, raw_body, reason) "
            "VALUES ('" +
            topic + "', '" + channel + "', '0a1b2c3d4e5f6071', 1, convert_to('" + b + "', 'UTF8'), '" +
            reason + "') RETURNING id");
        co_return r.get<std::int64_t>(0, 0);
    }

    std::vector<std::string> reconcile_args(const std::string& expected, const std::string& period) {
        std::vector<std::string> a = {
            "reconcile",       "--expected",  expected, "--period",  period,          "--pg-dsn", dsn(),
            "--key-namespace", key_namespace, "--json", "--show-ok", "--stripe-rate", "50"};
        auto s = stripe_args();
        a.insert(a.end(), s.begin(), s.end());
        return a;
    }
};

// `reconcile --json` output, parsed.
struct recon_report {
    std::map<std::string, std::int64_t> classes;
    std::map<std::string, std::string> class_of;  // customer_id → class
    std::map<std::string, std::string> action_of;
    std::int64_t unexplained = -1, republished = -1, stripe_requests = -1;
};

inline recon_report parse_report(const std::string& out) {
    recon_report r;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    r.unexplained = doc["unexplained"].get_int64().value();
    r.republished = doc["republished"].get_int64().value();
    r.stripe_requests = doc["stripe_requests"].get_int64().value();
    simdjson::dom::object classes = doc["classes"].get_object().value();
    for (auto [k, v] : classes) r.classes[std::string(k)] = v.get_int64().value();
    simdjson::dom::array items = doc["items"].get_array().value();
    for (auto it : items) {
        std::string c(it["customer_id"].get_string().value());
        r.class_of[c] = std::string(it["class"].get_string().value());
        r.action_of[c] = std::string(it["action"].get_string().value());
    }
    return r;
}

// `reconcile --json`'s class of each entry, keyed "customer@account" ("customer@-" for the platform's).
inline std::map<std::string, std::string> classes_by_account(const std::string& out) {
    std::map<std::string, std::string> r;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    simdjson::dom::array items = doc["items"].get_array().value();
    for (auto it : items) {
        std::string_view account = "-";
        if (!it["stripe_account"].is_null()) account = it["stripe_account"].get_string().value();
        r[std::string(it["customer_id"].get_string().value()) + "@" + std::string(account)] =
            std::string(it["class"].get_string().value());
    }
    return r;
}

template <typename F>
void run(ops& f, F body, seconds limit = seconds(120)) {
    test::run_async(f.io, body, limit);
}

// A real nsqd 1.3.0 on loopback ports with a fresh data path; stopped by the destructor.
struct real_nsqd {
    pid_t pid = -1;
    unsigned short tcp = 0, http = 0;
    std::string dir;
    explicit real_nsqd(const std::string& bin) {
        char tmpl[] = "/tmp/cg-ops-nsqd.XXXXXX";
        dir = ::mkdtemp(tmpl);
        tcp = free_port();
        http = free_port();
        std::vector<std::string> args = {bin, "--tcp-address=127.0.0.1:" + std::to_string(tcp),
                                         "--http-address=127.0.0.1:" + std::to_string(http),
                                         "--data-path=" + dir, "--log-level=warn"};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        BOOST_TEST_REQUIRE(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    }
    ~real_nsqd() {
        if (pid > 0) {
            ::kill(pid, SIGTERM);
            ::waitpid(pid, nullptr, 0);
        }
        std::system(("rm -rf " + dir).c_str());
    }
    std::string tcp_address() const { return "127.0.0.1:" + std::to_string(tcp); }
};

// `explain --json` output, parsed: state, verdict, the ledger's charge id, and Stripe's charge id (--stripe).
struct explained {
    std::string state, verdict, ledger_charge, stripe_charge, ledger_status;
    std::size_t letters = 0;
    std::vector<std::string> spend_states;  // vault_spend rows' states
};

inline explained parse_explained(const std::string& out) {
    explained x;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    BOOST_TEST_REQUIRE(p.parse(out).get(doc) == simdjson::SUCCESS, out);
    x.state = std::string(doc["state"].get_string().value());
    x.verdict = std::string(doc["verdict"].get_string().value());
    x.letters = doc["dead_letters"].get_array().value().size();
    // A named array: the range-for would otherwise hold a reference into the simdjson_result temporary.
    simdjson::dom::array spend = doc["vault_spend"].get_array().value();
    for (auto s : spend) x.spend_states.push_back(std::string(s["state"].get_string().value()));
    auto ledger = doc["ledger"];
    if (!ledger.is_null()) {
        x.ledger_status = std::string(ledger["status"].get_string().value());
        if (!ledger["charge_id"].is_null())
            x.ledger_charge = std::string(ledger["charge_id"].get_string().value());
    }
    auto stripe = doc["stripe"];
    if (!stripe.is_null() && !stripe["charge_id"].is_null())
        x.stripe_charge = std::string(stripe["charge_id"].get_string().value());
    return x;
}

inline std::string squeeze(const std::string& text) {
    std::string out;
    for (char ch : text) {
        bool space = ch == ' ' || ch == '\n' || ch == '\t';
        if (space && (out.empty() || out.back() == ' ')) continue;
        out += space ? ' ' : ch;
    }
    return out;
}

// The runbook's "Incidents, walked" (docs/operating/runbook.md) shows each command with what it prints: the
// `#   ` lines under the `nth` occurrence of `command` in that section (… stands for anything; a line wrapped
// in the doc is matched piece by piece). Empty when `output` holds every one of them (whitespace runs read as
// one space), else what is missing: the doc's outputs are this test's, and cannot drift from the binary's.
inline std::string runbook_mismatch(const std::string& command, const std::string& output, int nth = 0) {
    const char* root = std::getenv("CG_SOURCE_ROOT");
    if (!root) return "CG_SOURCE_ROOT is not set (run through meson test)";
    std::ifstream in(std::string(root) + "/docs/operating/runbook.md");
    std::string line;
    bool in_section = false, collecting = false;
    int seen = 0;
    std::vector<std::string> want;
    while (std::getline(in, line)) {
        if (line.rfind("## ", 0) == 0) in_section = line == "## Incidents, walked";
        if (!in_section) continue;
        if (collecting) {
            if (line.rfind("#   ", 0) != 0) break;
            want.push_back(squeeze(line.substr(4)));
            continue;
        }
        if (line == command && seen++ == nth) collecting = true;
    }
    if (!collecting) return "the runbook does not show `" + command + "`";
    if (want.empty()) return "the runbook shows no output for `" + command + "`";
    const auto out = squeeze(output);
    for (const auto& w : want) {
        // The line as a regular expression: every character literal but "…", which stands for anything.
        std::string re;
        for (std::size_t k = 0; k < w.size(); ++k) {
            if (w.compare(k, std::string_view("…").size(), "…") == 0) {
                re += ".*?";
                k += std::string_view("…").size() - 1;
            } else if (std::string_view("\\^$.|?*+()[]{}").find(w[k]) != std::string_view::npos) {
                re += std::string("\\") + w[k];
            } else {
                re += w[k];
            }
        }
        if (!std::regex_search(out, std::regex(re)))
            return "the runbook shows `" + w + "` for `" + command + "`, the output is:\n" + output;
    }
    return "";
}

// The succeeded charges Stripe holds for a key (metadata[billing_key]), and every charge for it.
std::pair<std::vector<std::string>, std::size_t> charges_for(const fake::fake_stripe& s,
                                                             const std::string& key) {
    std::vector<std::string> ok;
    std::size_t all = 0;
    for (const auto& ch : s.charges())
        for (const auto& [k, v] : ch.metadata)
            if (k == "billing_key" && v == key) {
                ++all;
                if (ch.status == "succeeded") ok.push_back(ch.id);
            }
    return {ok, all};
}

std::string intent_event(const std::string& customer, const std::string& period, std::int64_t amount,
                         const std::string& stripe_customer) {
    return R"({"customer_id":")" + customer + R"(","billing_period":")" + period + R"(","amount_cents":)" +
           std::to_string(amount) + R"(,"currency":"usd","stripe_customer_id":")" + stripe_customer +
           R"(","payment_method":"pm_card_visa","off_session":false})";
}

// A gauge's value in Prometheus text ("name{labels} value" or "name value"); -1 when absent.
inline double scraped(const std::string& text, const std::string& series) {
    auto at = text.find("\n" + series + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
}

}  // namespace
