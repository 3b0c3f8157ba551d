// The handshake against a scripted peer (fake-nsqd has no compression): a heartbeat between a
// compression switch and its OK. (AUTH behind a heartbeat runs against fake-nsqd and nsqd in
// failure_paths_test.cpp.)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "helpers.hpp"
#include "nsq/proto/compression.hpp"
#include "scripted_peer.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
namespace proto = cg::nsq::proto;

// nsqd's heartbeat ticker writes from its own goroutine, serialised with IDENTIFY's upgrades only by the
// client's write lock (protocol_v2.go, client_v2.go): once an upgrade has switched the stream, a
// `_heartbeat_` may come before the upgrade's OK, in the new framing. The handshake skips it.
BOOST_AUTO_TEST_CASE(a_heartbeat_before_the_compression_ok_is_skipped) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        for (bool snappy : {true, false}) {
            BOOST_TEST_CONTEXT((snappy ? "snappy" : "deflate")) {
                scripted_peer peer(ex);
                proto::identify_response r;
                r.version = "1.3.0";
                r.msg_timeout = 60000;
                r.snappy = snappy;
                r.deflate = !snappy;
                std::string after;
                auto plain = frame(proto::frame_type::response, "_heartbeat_") +
                             frame(proto::frame_type::response, "OK");
                if (snappy) {
                    proto::snappy_encoder enc;
                    enc.encode(plain, after);
                } else {
                    proto::deflate_encoder enc(6);
                    enc.encode(plain, after);
                }
                asio::co_spawn(ex, scripted_peer::serve(&peer, proto::to_json(r), after), asio::detached);
                cg::nsq::nsq_security sec;
                sec.snappy = snappy;
                sec.deflate = !snappy;
                cg::nsq::transport t(ex);
                proto::frame_decoder d;
                auto neg = co_await run_handshake(t, d, sec, peer.port());
                BOOST_TEST(neg.has_value(), (neg ? "" : neg.err().describe()));
                BOOST_TEST(t.compression() == std::string(snappy ? "snappy" : "deflate"));
                t.close();
                BOOST_TEST(co_await eventually([&] { return peer.done; }, seconds(2)));
            }
        }
    });
}
