#include "app/health_auth.hpp"

#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

using namespace cg::app;

namespace {

std::string users_file(const std::string& content) {
    static int n = 0;
    std::string path = "/tmp/cg-health-auth-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    std::ofstream(path) << content;
    return path;
}

// "Basic " + base64("prometheus:secret-pw") and variants, written out.
const std::string right = "Basic cHJvbWV0aGV1czpzZWNyZXQtcHc=";     // prometheus:secret-pw
const std::string wrong = "Basic cHJvbWV0aGV1czpvdGhlcg==";         // prometheus:other
const std::string unknown_user = "Basic c29tZW9uZTpzZWNyZXQtcHc=";  // someone:secret-pw
const std::string no_colon = "Basic cHJvbWV0aGV1cw==";              // prometheus

std::shared_ptr<health_auth> load_one() {
    auto hash = crypt_password("secret-pw", bcrypt_setting_for_tests());
    BOOST_TEST_REQUIRE(hash.rfind("$2b$", 0) == 0);
    auto path = users_file("# the scrapers\n\nprometheus:" + hash + "\n");
    auto a = health_auth::load(path);
    std::remove(path.c_str());
    if (!a) BOOST_FAIL(a.err().describe());
    return *a;
}

// Runs check() on `loop`, the crypts on `pool`; returns the verdict once both ran dry.
health_auth::verdict checked(health_auth& a, const std::string& header) {
    asio::io_context loop, pool;
    std::optional<health_auth::verdict> v;
    asio::co_spawn(loop, a.check(header, pool.get_executor()),
                   [&v](std::exception_ptr e, health_auth::verdict r) {
                       BOOST_TEST(!e);
                       v = r;
                   });
    while (!v && (loop.poll() + pool.poll()) > 0) {
        loop.restart();
        pool.restart();
    }
    BOOST_TEST_REQUIRE(v.has_value());
    return *v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(health_auth_suite)

BOOST_AUTO_TEST_CASE(only_the_right_credentials_pass) {
    auto a = load_one();
    BOOST_TEST(a->users() == 1u);
    using v = health_auth::verdict;
    BOOST_TEST((checked(*a, right) == v::allowed));
    BOOST_TEST((checked(*a, right) == v::allowed));  // remembered
    BOOST_TEST(
        (checked(*a, "basic cHJvbWV0aGV1czpzZWNyZXQtcHc=") == v::allowed));  // the scheme is case-blind
    BOOST_TEST((checked(*a, wrong) == v::denied));
    BOOST_TEST((checked(*a, unknown_user) == v::denied));
    BOOST_TEST((checked(*a, no_colon) == v::denied));
    BOOST_TEST((checked(*a, "") == v::denied));
    BOOST_TEST((checked(*a, "Bearer cHJvbWV0aGV1czpzZWNyZXQtcHc=") == v::denied));
    BOOST_TEST((checked(*a, "Basic !!!!") == v::denied));
    BOOST_TEST((checked(*a, "Basic cHJvbWV0aGV1czpzZWNyZXQtcH") == v::denied));  // not a multiple of 4
}

// At most two crypts at once: with two waiting for the (not running) pool, a third credential not yet
// remembered is answered busy at once, while a remembered one still passes without a crypt.
BOOST_AUTO_TEST_CASE(a_third_crypt_at_once_is_busy) {
    auto a = load_one();
    using v = health_auth::verdict;
    BOOST_TEST((checked(*a, right) == v::allowed));
    asio::io_context loop, pool;
    std::vector<std::optional<v>> got(4);
    const std::string headers[] = {wrong, unknown_user, "Basic cHJvbWV0aGV1czp0aGlyZA==", right};
    for (std::size_t i = 0; i < 4; ++i)
        asio::co_spawn(loop, a->check(headers[i], pool.get_executor()), [&got, i](std::exception_ptr e, v r) {
            BOOST_TEST(!e);
            got[i] = r;
        });
    loop.poll();
    BOOST_TEST(!got[0].has_value());
    BOOST_TEST(!got[1].has_value());
    BOOST_TEST_REQUIRE(got[2].has_value());
    BOOST_TEST((*got[2] == v::busy));
    BOOST_TEST_REQUIRE(got[3].has_value());
    BOOST_TEST((*got[3] == v::allowed));
    while (!(got[0] && got[1]) && (loop.poll() + pool.poll()) > 0) {
        loop.restart();
        pool.restart();
    }
    BOOST_TEST((got[0] == v::denied));
    BOOST_TEST((got[1] == v::denied));
}

BOOST_AUTO_TEST_CASE(files_without_a_password_hash_are_refused_without_echo) {
    auto check = [](const std::string& content, const std::string& phrase) {
        auto path = users_file(content);
        auto a = health_auth::load(path);
        std::remove(path.c_str());
        BOOST_TEST_REQUIRE(!a.has_value());
        BOOST_TEST(a.err().message.find(phrase) != std::string::npos, a.err().message);
        BOOST_TEST(a.err().message.find("plain-secret") == std::string::npos, a.err().message);
    };
    check("prometheus:plain-secret\n", "line 1: not a bcrypt, yescrypt or SHA-crypt hash");
    check("# only a comment\n\n", "no user:hash line");
    check("plain-secret\n", "line 1: not user:hash");
    check(":$2b$05$abcdefghijklmnopqrstuu\n", "line 1: not user:hash");
    // MD5 crypt is fast to brute-force once the file leaks: refused like a plain password.
    check("prometheus:$1$plain-secret$abc\n", "line 1: not a bcrypt");
    BOOST_TEST(!health_auth::load("/nonexistent/users").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
