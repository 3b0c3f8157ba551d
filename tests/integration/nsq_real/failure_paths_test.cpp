// The failure-path scenarios of tests/integration/nsq/scenarios.hpp against nsqd 1.3.0 (the nsq suite runs
// them against fake-nsqd): FIN/REQ/TOUCH refused once a connection is ending, RDY within max_in_flight
// counting the deliveries still in hand, publishes nsqd would refuse fatally failing alone, and AUTH
// behind an auth server slower than the heartbeat interval.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/read_until.hpp>
#include <asio/write.hpp>
#include <boost/test/unit_test.hpp>

#include "core/bytes.hpp"
#include "fake_nsqd.hpp"
#include "harness.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq_auth.hpp"
#include "tests/integration/nsq/scenarios.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqreal;

namespace {

// (conformance_test.cpp has a `broker` of its own in this unity target.)
nsqscenario::broker real_broker(real_nsqd& n, std::string name) {
    nsqscenario::broker b;
    b.name = std::move(name);
    b.tcp_address = n.tcp_address();
    b.publish = [&n](std::string topic, std::vector<std::string> bodies) -> asio::awaitable<void> {
        co_await n.http().mpub(std::move(topic), std::move(bodies));
    };
    b.channel = [&n](std::string topic, std::string channel) -> asio::awaitable<nsqscenario::channel_view> {
        auto s = co_await n.http().stats(topic, channel);
        co_return nsqscenario::channel_view{s.depth, s.in_flight_count, s.deferred_count, s.timeout_count};
    };
    b.create_channel = [&n](std::string topic, std::string channel) -> asio::awaitable<void> {
        co_await n.http().create_channel(std::move(topic), std::move(channel));
    };
    b.start = [&n]() -> asio::awaitable<void> { co_await n.start(); };
    b.drop = [&n]() -> asio::awaitable<void> { co_await n.stop(); };  // nsqd closes its clients on exit
    return b;
}

// nsqd's auth server, slow: every GET /auth is answered with `json` after `delay`.
class slow_auth_server {
  public:
    slow_auth_server(asio::any_io_executor ex, std::string json, milliseconds delay)
        : st_(std::make_shared<state>(ex, std::move(json), delay)) {
        asio::co_spawn(ex, serve(st_), asio::detached);
    }
    ~slow_auth_server() {
        std::error_code ignored;
        st_->acceptor.close(ignored);
    }
    std::string address() const {
        return "127.0.0.1:" + std::to_string(st_->acceptor.local_endpoint().port());
    }
    int queries() const { return st_->queries; }

  private:
    struct state {
        state(asio::any_io_executor ex, std::string j, milliseconds d)
            : acceptor(ex, {asio::ip::make_address("127.0.0.1"), 0}), json(std::move(j)), delay(d) {}
        cg::net::tcp_acceptor acceptor;
        std::string json;
        milliseconds delay;
        int queries = 0;
    };
    static asio::awaitable<void> serve(std::shared_ptr<state> st) {
        for (;;) {
            auto [ec, sock] = co_await st->acceptor.async_accept();
            if (ec) co_return;
            asio::co_spawn(st->acceptor.get_executor(), answer(st, std::move(sock)), asio::detached);
        }
    }
    static asio::awaitable<void> answer(std::shared_ptr<state> st, cg::net::tcp_socket sock) {
        std::string req;
        auto [ec, n] =
            co_await asio::async_read_until(sock, asio::dynamic_buffer(req), "\r\n\r\n", cg::net::nothrow);
        if (ec) co_return;
        ++st->queries;
        co_await cg::net::sleep_for(st->delay);
        std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(st->json.size()) + "\r\nConnection: close\r\n\r\n" + st->json;
        co_await asio::async_write(sock, asio::buffer(out), cg::net::nothrow);
    }
    std::shared_ptr<state> st_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(real_nsqd_fin_req_and_touch_are_refused_once_the_connection_is_ending) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd nsqd;
            co_await nsqd.start();
            co_await nsqscenario::answers_are_refused_once_the_connection_is_ending(real_broker(nsqd, "nsqd"),
                                                                                    "ending");
        },
        seconds(30));
}

BOOST_AUTO_TEST_CASE(real_nsqd_joining_gets_rdy_only_as_the_deliveries_in_hand_elsewhere_finish) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd a;
            co_await a.start();
            nsqd_options bo;
            bo.tcp_port = free_port();
            bo.http_port = free_port();
            real_nsqd b(bo);  // started by the scenario
            co_await nsqscenario::a_joining_nsqd_waits_for_deliveries_in_hand(
                real_broker(a, "nsqd A"), real_broker(b, "nsqd B"), "join");
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(real_nsqd_dropped_running_deliveries_keep_their_budget_until_their_handlers_finish) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd a, b;
            co_await a.start();
            co_await b.start();
            co_await nsqscenario::a_dropped_nsqds_running_deliveries_keep_their_budget(
                real_broker(a, "nsqd A"), real_broker(b, "nsqd B"), "orphan");
        },
        seconds(60));
}

BOOST_AUTO_TEST_CASE(real_nsqd_a_publish_it_would_refuse_fatally_fails_alone) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            real_nsqd nsqd;
            co_await nsqd.start();
            co_await nsqscenario::a_bad_publish_fails_alone(real_broker(nsqd, "nsqd"), "badpub");
        },
        seconds(30));
}

BOOST_AUTO_TEST_CASE(real_nsqd_auth_answered_after_a_heartbeat_authenticates) {
    cg::test::run_async(
        []() -> asio::awaitable<void> {
            auto ex = co_await asio::this_coro::executor;
            cg::test::nsq::auth_identity id;
            id.identity = "billing";
            id.authorizations = {{".*", {".*"}, {"subscribe", "publish"}}};
            slow_auth_server auth(ex, cg::test::nsq::to_json(id), milliseconds(1500));  // > heartbeat 1 s
            nsqd_options o;
            o.extra = {"--auth-http-address=" + auth.address()};
            real_nsqd nsqd(o);
            co_await nsqd.start();
            co_await nsqd.http().create_channel("authed", "c");
            co_await nsqscenario::auth_outlasting_a_heartbeat_succeeds(real_broker(nsqd, "nsqd"), "authed",
                                                                       "t0ken");
            BOOST_TEST(auth.queries() >= 2);
        },
        seconds(60));
}

// What the producer now refuses itself is what nsqd refuses fatally; fake-nsqd answers those publishes
// with nsqd's own bytes (the double's MPUB texts had drifted from nsqd's).
BOOST_AUTO_TEST_CASE(fake_nsqd_refuses_bad_publishes_with_nsqds_own_bytes) {
    auto exchange = [](std::uint16_t port, std::string command) -> asio::awaitable<std::string> {
        cg::net::tcp_socket s(co_await asio::this_coro::executor);
        auto [cec] = co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port});
        if (cec) throw std::runtime_error("connect");
        std::string out;
        cg::nsq::proto::append_magic(out);
        out += command;
        co_await asio::async_write(s, asio::buffer(out), cg::net::nothrow);
        co_return co_await nsqreal::read_until_close(s);  // every case here is fatal
    };
    std::vector<std::string> cases;
    {
        std::string c;
        cg::nsq::proto::append_pub(c, "badpub", "");
        cases.push_back(c);
    }
    {
        std::string c;
        std::vector<std::string> b = {"a", "", "c"};
        cg::nsq::proto::append_mpub(c, "badpub", std::span<const std::string>(b));
        cases.push_back(c);
    }
    {
        std::string c;
        cg::nsq::proto::append_dpub(c, "badpub", 3600001, "x");
        cases.push_back(c);
    }
    {
        std::string c = "PUB badpub\n";  // the size alone: nsqd answers before reading a body
        cg::append_be32(c, 1024 * 1024 + 1);
        cases.push_back(c);
    }
    cg::test::run_async([&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        real_nsqd nsqd;
        co_await nsqd.start();
        cg::test::nsq::fake_nsqd fake(ex);
        BOOST_REQUIRE(fake.start().has_value());
        for (const auto& c : cases) {
            auto real_bytes = co_await exchange(nsqd.tcp_port(), c);
            auto fake_bytes = co_await exchange(fake.tcp_port(), c);
            BOOST_TEST(real_bytes.find("E_") != std::string::npos, real_bytes);
            BOOST_TEST(real_bytes == fake_bytes,
                       "\n  nsqd:      " << real_bytes << "\n  fake-nsqd: " << fake_bytes);
        }
        fake.stop();
    });
}
