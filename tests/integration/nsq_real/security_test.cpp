// TLS (tls_v1), snappy / deflate stream compression and AUTH against real nsqd 1.3.0, for the consumer,
// the producer and the `publish` / `tail` commands. nsqd's auth server is tests/doubles/nsq_auth.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <set>

#include "harness.hpp"
#include "metrics/registry.hpp"
#include "nsq/consumer.hpp"
#include "nsq/producer.hpp"
#include "nsq_auth.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;
using cg::nsq::consumer;
using cg::nsq::consumer_config;
using cg::nsq::disposition;
using cg::nsq::message;
using cg::nsq::nsq_security;
using cg::test::nsq::auth_identity;
using cg::test::nsq::fake_nsq_auth;

namespace {

std::string cert(const char* name) {
    auto dir = env_or_empty("CG_NSQ_TEST_CERTS");
    BOOST_TEST_REQUIRE(!dir.empty(), "CG_NSQ_TEST_CERTS must point at the generated PKI (meson sets it)");
    return dir + "/" + name;
}

std::vector<std::string> tls_flags(bool required = true) {
    // HTTPS on a free loopback port (nsqd's default is [::]:4152); "tcp-https": TCP must use TLS, and the
    // plain HTTP API the tests read /stats from stays open.
    std::vector<std::string> f = {"--tls-cert=" + cert("server.pem"), "--tls-key=" + cert("server.key"),
                                  "--https-address=127.0.0.1:" + std::to_string(free_port())};
    if (required) f.push_back("--tls-required=tcp-https");
    return f;
}

consumer_config base(const std::string& address, const std::string& topic, const std::string& channel = "c") {
    consumer_config c;
    c.topic = topic;
    c.channel = channel;
    c.nsqd_tcp_addresses = {address};
    c.heartbeat_interval = milliseconds(1000);
    c.max_in_flight = 20;
    c.reconnect_backoff_min = milliseconds(100);
    c.reconnect_backoff_max = milliseconds(400);
    return c;
}

// Publishes `bodies` with a producer using `sec`, then consumes them with a consumer using `sec`; returns
// what nsqd's /stats said about the consumer's connection while it was subscribed.
asio::awaitable<client_stats> round_trip(real_nsqd& nsqd, const std::string& address, std::string topic,
                                         nsq_security sec, std::vector<std::string> bodies) {
    auto ex = co_await asio::this_coro::executor;
    cg::nsq::producer_config pc;
    pc.security = sec;
    cg::nsq::producer prod(ex, address, pc, {});
    auto r = co_await prod.multi_publish(topic, bodies);
    BOOST_REQUIRE_MESSAGE(r.has_value(), "publish: " << (r ? "" : r.err().describe()));
    co_await prod.close();
    auto cfg = base(address, topic);
    cfg.security = sec;
    std::multiset<std::string> got;
    cg::metrics::registry reg;
    consumer c(
        ex, cfg,
        [&](message& m) -> asio::awaitable<disposition> {
            got.insert(m.body());
            co_return disposition::finish();
        },
        {}, reg);
    BOOST_REQUIRE(c.start().has_value());
    BOOST_REQUIRE(co_await eventually([&] { return got.size() == bodies.size(); }, seconds(10)));
    auto ch = co_await nsqd.http().stats(topic, "c");
    BOOST_REQUIRE_EQUAL(ch.clients.size(), 1u);
    BOOST_TEST((got == std::multiset<std::string>(bodies.begin(), bodies.end())));
    co_await c.stop();
    co_return ch.clients.front();
}

// A consumer that must not get in: returns the log once `needle` shows up (or after 5 s).
asio::awaitable<std::string> refused(const consumer_config& cfg, std::string needle) {
    auto ex = co_await asio::this_coro::executor;
    auto sink = std::make_shared<cg::memory_sink>();
    cg::metrics::registry reg;
    consumer c(
        ex, cfg, [](message&) -> asio::awaitable<disposition> { co_return disposition::finish(); },
        cg::logger(sink, cg::log_level::info), reg);
    BOOST_REQUIRE(c.start().has_value());
    bool seen = co_await eventually([&] { return sink->contains(needle); }, seconds(5));
    BOOST_TEST(c.stats().connects == 0u);
    co_await c.stop();
    std::string all;
    for (const auto& l : sink->lines()) all += l;
    BOOST_TEST(seen, "expected '" << needle << "' in:\n" << all);
    co_return all;
}

std::vector<std::string> sample_bodies(int n, std::size_t big = 0) {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i)
        out.push_back("body-" + std::to_string(i) + std::string(i == 0 ? big : 0, 'x'));
    return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tls_to_an_nsqd_that_requires_it_verifies_chain_and_host_name) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            nsqd_options o;
            o.extra = tls_flags();
            real_nsqd nsqd(o);
            co_await nsqd.start();
            nsq_security sec;
            sec.tls = true;
            sec.tls_ca_file = cert("ca.pem");
            auto cl = co_await round_trip(nsqd, nsqd.tcp_address(), "tls", sec, sample_bodies(20));
            BOOST_TEST(cl.tls);
            // By name: the certificate carries localhost.
            cl = co_await round_trip(nsqd, "localhost:" + std::to_string(nsqd.tcp_port()), "tlsname", sec,
                                     sample_bodies(3));
            BOOST_TEST(cl.tls);

            // Without TLS, nsqd (--tls-required) refuses SUB.
            auto cfg = base(nsqd.tcp_address(), "tls");
            co_await refused(cfg, "E_INVALID");
            // A certificate from a CA we do not trust.
            cfg.security = sec;
            cfg.security.tls_ca_file = cert("other-ca.pem");
            co_await refused(cfg, "certificate verify failed");
            // The right CA but a name the certificate does not carry.
            cfg.security = sec;
            cfg.security.tls_server_name = "nsqd.example";
            co_await refused(cfg, "certificate verify failed");
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(tls_client_certificate_for_require_verify) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            nsqd_options o;
            o.extra = tls_flags();
            o.extra.push_back("--tls-client-auth-policy=require-verify");
            o.extra.push_back("--tls-root-ca-file=" + cert("ca.pem"));
            real_nsqd nsqd(o);
            co_await nsqd.start();
            nsq_security sec;
            sec.tls = true;
            sec.tls_ca_file = cert("ca.pem");
            auto cfg = base(nsqd.tcp_address(), "mtls");
            cfg.security = sec;
            co_await refused(cfg, "bad certificate");  // no client certificate: nsqd's alert
            sec.tls_cert_file = cert("client.pem");
            sec.tls_key_file = cert("client.key");
            auto cl = co_await round_trip(nsqd, nsqd.tcp_address(), "mtls", sec, sample_bodies(5));
            BOOST_TEST(cl.tls);
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(snappy_and_deflate_streams_with_and_without_tls) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            nsqd_options o;
            o.extra = tls_flags(false);
            real_nsqd nsqd(o);
            co_await nsqd.start();
            // A body over 64 KiB spans several snappy chunks; a compressible one exercises real compression.
            auto bodies = sample_bodies(50, 200 * 1024);
            for (bool tls : {false, true}) {
                nsq_security sec;
                sec.tls = tls;
                if (tls) sec.tls_ca_file = cert("ca.pem");
                sec.snappy = true;
                auto cl =
                    co_await round_trip(nsqd, nsqd.tcp_address(), tls ? "snappytls" : "snappy", sec, bodies);
                BOOST_TEST(cl.snappy);
                BOOST_TEST(!cl.deflate);
                BOOST_TEST(cl.tls == tls);
                sec.snappy = false;
                sec.deflate = true;
                sec.deflate_level = 3;
                cl = co_await round_trip(nsqd, nsqd.tcp_address(), tls ? "deflatetls" : "deflate", sec,
                                         bodies);
                BOOST_TEST(cl.deflate);
                BOOST_TEST(!cl.snappy);
                BOOST_TEST(cl.tls == tls);
            }
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(auth_identity_logged_never_the_secret_and_a_denied_channel_is_a_clear_error) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            fake_nsq_auth auth(ex);
            auth_identity id;
            id.identity = "billing-consumer";
            id.identity_url = "https://auth.example/billing-consumer";
            id.ttl = 60;
            // nsqd checks a publish against channel "" (so a publish grant needs a channel pattern matching
            // it).
            id.authorizations = {{"^paid$", {"^c$"}, {"subscribe"}}, {"^paid$", {".*"}, {"publish"}}};
            const std::string secret = "s3cr3t-token-value";
            auth.add_secret(secret, id);
            BOOST_REQUIRE(auth.start().has_value());
            nsqd_options o;
            o.extra = {"--auth-http-address=" + auth.address()};
            real_nsqd nsqd(o);
            co_await nsqd.start();

            nsq_security sec;
            sec.auth_secret = secret;
            auto sink = std::make_shared<cg::memory_sink>();
            cg::nsq::producer_config pc;
            pc.security = sec;
            {
                cg::nsq::producer prod(ex, nsqd.tcp_address(), pc, cg::logger(sink, cg::log_level::info));
                std::vector<std::string> bodies = {"a", "b", "c"};
                auto r = co_await prod.multi_publish("paid", bodies);
                BOOST_TEST(r.has_value(), (r ? "" : r.err().describe()));
                // Publishing to a topic the identity may not publish to: nsqd's own refusal comes back.
                auto denied = co_await prod.publish("refunds", "x");
                BOOST_REQUIRE(!denied.has_value());
                BOOST_TEST(denied.err().message.find("E_UNAUTHORIZED") != std::string::npos,
                           denied.err().message);
                co_await prod.close();
            }
            auto cfg = base(nsqd.tcp_address(), "paid");
            cfg.security = sec;
            std::set<std::string> got;
            cg::metrics::registry reg;
            {
                consumer c(
                    ex, cfg,
                    [&](message& m) -> asio::awaitable<disposition> {
                        got.insert(m.body());
                        co_return disposition::finish();
                    },
                    cg::logger(sink, cg::log_level::info), reg);
                BOOST_REQUIRE(c.start().has_value());
                BOOST_REQUIRE(co_await eventually([&] { return got.size() == 3; }, seconds(10)));
                auto ch = co_await nsqd.http().stats("paid", "c");
                BOOST_REQUIRE_EQUAL(ch.clients.size(), 1u);
                BOOST_TEST(ch.clients.front().authed);
                BOOST_TEST(ch.clients.front().auth_identity == "billing-consumer");
                co_await c.stop();
            }
            BOOST_TEST(sink->contains("\"identity\":\"billing-consumer\""));
            BOOST_TEST(sink->contains("\"permission_count\":2"));
            for (const auto& l : sink->lines()) BOOST_TEST(l.find(secret) == std::string::npos, l);
            BOOST_TEST(!auth.queries().empty());
            BOOST_TEST(auth.queries().front().tls == "false");

            // A channel the identity may not read: nsqd's refusal, naming topic and channel.
            auto other = base(nsqd.tcp_address(), "paid", "other");
            other.security = sec;
            co_await refused(other, "E_UNAUTHORIZED AUTH failed for SUB on \\\"paid\\\" \\\"other\\\"");
            // A wrong secret, and none at all.
            other = base(nsqd.tcp_address(), "paid");
            other.security.auth_secret = "wrong";
            co_await refused(other, "E_AUTH_FAILED");
            other.security.auth_secret.clear();
            co_await refused(other, "requires AUTH");
            auth.stop();
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(publish_and_tail_commands_over_tls_deflate_and_auth) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            fake_nsq_auth auth(ex);
            auth_identity id;
            id.identity = "ops";
            id.authorizations = {{".*", {".*"}, {"subscribe", "publish"}}};
            auth.add_secret("ops-secret", id);
            BOOST_REQUIRE(auth.start().has_value());
            nsqd_options o;
            o.extra = tls_flags();
            o.extra.push_back("--auth-http-address=" + auth.address());
            real_nsqd nsqd(o);
            co_await nsqd.start();
            auto exe = env_or_empty("CHARGEGUARD_EXE");
            BOOST_REQUIRE(!exe.empty());
            auto dir = make_temp_dir("sec");
            {
                std::ofstream f(dir + "/events.jsonl");
                for (int i = 0; i < 12; ++i)
                    f << "{\"customer_id\":\"c" << i
                      << "\",\"billing_period\":\"2026-11\",\"amount_cents\":100,"
                      << "\"currency\":\"usd\",\"stripe_customer_id\":\"cus_" << i << "\"}\n";
            }
            std::vector<std::string> env = {"CHARGEGUARD_NSQ_AUTH_SECRET=ops-secret"};
            auto pid = spawn(
                {exe, "publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "ops", "--nsq-tls",
                 "--nsq-tls-ca-file", cert("ca.pem"), "--nsq-deflate", dir + "/events.jsonl"},
                dir + "/pub.out", dir + "/pub.err", {}, env);
            BOOST_TEST(co_await wait_exit(pid, seconds(15)) == 0, slurp(dir + "/pub.err"));
            std::ofstream(dir + "/secret") << "ops-secret\n";
            pid = spawn({exe, "tail", "--topic", "ops", "--nsqd-tcp-address", nsqd.tcp_address(),
                         "--max-messages", "12", "--nsq-tls-ca-file", cert("ca.pem"), "--nsq-snappy",
                         "--nsq-auth-secret-file", dir + "/secret", "--health-listen", "127.0.0.1:0"},
                        dir + "/tail.out", dir + "/tail.err");
            BOOST_TEST(co_await wait_exit(pid, seconds(20)) == 0, slurp(dir + "/tail.err"));
            std::size_t lines = 0;
            for (char ch : slurp(dir + "/tail.out")) lines += ch == '\n';
            BOOST_TEST(lines == 12u, slurp(dir + "/tail.out"));
            BOOST_TEST(slurp(dir + "/tail.err").find("ops-secret") == std::string::npos);
            BOOST_TEST(slurp(dir + "/pub.err").find("ops-secret") == std::string::npos);
            // Both flags at once are refused before connecting.
            pid = spawn({exe, "publish", "--nsqd-tcp-address", nsqd.tcp_address(), "--topic", "ops",
                         "--nsq-snappy", "--nsq-deflate", dir + "/events.jsonl"},
                        dir + "/pub.out", dir + "/pub.err");
            BOOST_TEST(co_await wait_exit(pid, seconds(15)) != 0);
            BOOST_TEST(slurp(dir + "/pub.err").find("at most one") != std::string::npos,
                       slurp(dir + "/pub.err"));
            auth.stop();
            std::error_code ec;
            fs::remove_all(dir, ec);
        },
        seconds(60));
}
