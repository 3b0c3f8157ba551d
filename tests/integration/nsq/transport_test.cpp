// The compressed transport against a scripted peer (fake-nsqd has no compression): a deflate stream whose
// frames expand far beyond one read arrives whole, through the decoder's bounded output.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <boost/test/unit_test.hpp>

#include "nsq/proto/compression.hpp"
#include "scripted_peer.hpp"
#include "tests/support/run_async.hpp"

using namespace nsqtest;
namespace proto = cg::nsq::proto;

// Eight frames of 1 MiB of zeros are a few KiB of DEFLATE: the transport hands them out as the decoder's
// bounded output allows, over many reads, all of them intact.
BOOST_AUTO_TEST_CASE(a_deflate_stream_expanding_far_beyond_one_read_arrives_whole) {
    cg::test::run_async([]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        scripted_peer peer(ex);
        proto::identify_response r;
        r.version = "1.3.0";
        r.deflate = true;
        std::string plain = frame(proto::frame_type::response, "OK");
        const std::string body(1024 * 1024 - 64, '\0');
        for (int i = 0; i < 8; ++i) plain += frame(proto::frame_type::response, body);
        plain += frame(proto::frame_type::response, "end");
        std::string after;
        proto::deflate_encoder enc(9);
        enc.encode(plain, after);
        BOOST_TEST(after.size() < 64u * 1024);
        asio::co_spawn(ex, scripted_peer::serve(&peer, proto::to_json(r), after), asio::detached);
        cg::nsq::nsq_security sec;
        sec.deflate = true;
        cg::nsq::transport t(ex);
        proto::frame_decoder d;
        auto neg = co_await run_handshake(t, d, sec, peer.port());
        BOOST_REQUIRE_MESSAGE(neg.has_value(), (neg ? "" : neg.err().describe()));
        int big = 0;
        for (;;) {
            auto f = co_await cg::nsq::read_frame(t, d, steady_clock::now() + seconds(5), "peer");
            BOOST_REQUIRE_MESSAGE(f.has_value(), (f ? "" : f.err().describe()));
            if (f->data == "end") break;
            BOOST_REQUIRE(f->data.size() == body.size());
            BOOST_REQUIRE(f->data.find_first_not_of('\0') == std::string_view::npos);
            ++big;
        }
        BOOST_TEST(big == 8);
        t.close();
    });
}
