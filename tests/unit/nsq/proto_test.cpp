// nsq/proto on byte vectors: every command encoder against nsqd's golden bytes, every frame type,
// truncated and oversize frames, IDENTIFY JSON both ways, error classification, lookup replies.
#include <boost/test/unit_test.hpp>

#include "core/bytes.hpp"
#include "golden.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/proto/error_frame.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/proto/lookup.hpp"
#include "nsq/proto/message.hpp"
#include "nsq/proto/server_codec.hpp"
#include "nsq/proto/stats.hpp"

using namespace cg::nsq::proto;
namespace errc_ns = cg::nsq;

BOOST_AUTO_TEST_SUITE(commands)

BOOST_AUTO_TEST_CASE(encoders_match_nsqd_golden_bytes) {
    std::string out;
    append_magic(out);
    BOOST_TEST(out == golden::magic);
    out.clear();
    append_sub(out, "golden", "c");
    BOOST_TEST(out == golden::sub);
    out.clear();
    append_rdy(out, 1);
    BOOST_TEST(out == golden::rdy1);
    out.clear();
    append_rdy(out, 3000);
    BOOST_TEST(out == golden::rdy3000);
    out.clear();
    append_touch(out, "18ad397cbfa69000");
    BOOST_TEST(out == golden::touch);
    out.clear();
    append_fin(out, "18ad397cbfa69000");
    BOOST_TEST(out == golden::fin);
    out.clear();
    out = "NOP\n";  // FIN appends to what is already queued
    append_fin(out, "18ad397cbfa69000");
    BOOST_TEST(out == std::string("NOP\n").append(golden::fin));
    out.clear();
    append_req(out, "0000000000000000", 0);
    BOOST_TEST(out == golden::req_unknown);
    out.clear();
    append_nop(out);
    BOOST_TEST(out == golden::nop);
    out.clear();
    append_cls(out);
    BOOST_TEST(out == golden::cls);
    out.clear();
    std::string_view bodies[] = {"a", "bb"};
    append_mpub(out, "golden", std::span<const std::string_view>(bodies));
    BOOST_TEST(out == golden::mpub2);
    out.clear();
    append_pub(out, "bad!topic", "x");
    BOOST_TEST(out == golden::pub_bad_topic);
    out.clear();
    append_identify(out, R"({"feature_negotiation": true, "msg_timeout": 1000000})");
    BOOST_TEST(out == golden::identify_big_timeout);
}

BOOST_AUTO_TEST_CASE(dpub_and_auth_layout) {
    std::string out;
    append_dpub(out, "t", 1500, "hey");
    BOOST_TEST(out == std::string("DPUB t 1500\n\0\0\0\3hey", 19));
    out.clear();
    append_auth(out, "s3");
    BOOST_TEST(out == std::string("AUTH\n\0\0\0\2s3", 11));
    out.clear();
    append_req(out, "0123456789abcdef", 3600000);
    BOOST_TEST(out == "REQ 0123456789abcdef 3600000\n");
}

BOOST_AUTO_TEST_CASE(topic_and_channel_names) {
    BOOST_TEST(valid_topic_name("golden"));
    BOOST_TEST(valid_topic_name("a.b_c-D9"));
    BOOST_TEST(valid_topic_name("t#ephemeral"));
    BOOST_TEST(valid_channel_name(std::string(64, 'c')));
    BOOST_TEST(!valid_channel_name(std::string(65, 'c')));
    BOOST_TEST(!valid_topic_name(""));
    BOOST_TEST(!valid_topic_name("#ephemeral"));
    BOOST_TEST(!valid_topic_name("bad!topic"));
    BOOST_TEST(!valid_topic_name("a b"));
    BOOST_TEST(!valid_topic_name("a#ephemeralx"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(frames)

BOOST_AUTO_TEST_CASE(decodes_each_frame_type_from_golden_bytes) {
    frame_decoder d;
    d.feed(golden::ok_frame + golden::message_frame + golden::fin_failed + golden::heartbeat);
    frame f;
    BOOST_REQUIRE(d.next(f) == decode_status::frame);
    BOOST_TEST((f.type == frame_type::response));
    BOOST_TEST(f.data == "OK");
    BOOST_REQUIRE(d.next(f) == decode_status::frame);
    BOOST_TEST((f.type == frame_type::message));
    auto m = parse_message(f.data);
    BOOST_REQUIRE(m.has_value());
    BOOST_TEST(m->attempts == 1);
    BOOST_TEST(m->id.view() == "18ad397cbfa69000");
    BOOST_TEST(m->body == "hello golden");
    BOOST_TEST(m->timestamp == static_cast<std::int64_t>(0x18ec972f54ebd0e9ULL));
    BOOST_REQUIRE(d.next(f) == decode_status::frame);
    BOOST_TEST((f.type == frame_type::error));
    BOOST_TEST(f.data == "E_FIN_FAILED FIN 18ad397cbfa69000 failed ID not in flight");
    BOOST_REQUIRE(d.next(f) == decode_status::frame);
    BOOST_TEST(f.data == "_heartbeat_");
    BOOST_TEST((d.next(f) == decode_status::need_more));
    BOOST_TEST(d.buffered() == 0u);
}

BOOST_AUTO_TEST_CASE(byte_by_byte_feeding_yields_the_same_frames) {
    std::string all = golden::identify_response + golden::message_frame + golden::close_wait;
    frame_decoder d;
    std::vector<std::string> got;
    for (char c : all) {
        d.feed(std::string_view(&c, 1));
        frame f;
        while (d.next(f) == decode_status::frame) got.emplace_back(f.data);
    }
    BOOST_REQUIRE(got.size() == 3u);
    BOOST_TEST(got[2] == "CLOSE_WAIT");
    BOOST_TEST(got[0].substr(0, 17) == "{\"max_rdy_count\":");
}

BOOST_AUTO_TEST_CASE(truncated_frames_need_more) {
    for (std::size_t cut = 0; cut < golden::message_frame.size(); ++cut) {
        frame_decoder d;
        d.feed(std::string_view(golden::message_frame).substr(0, cut));
        frame f;
        BOOST_TEST((d.next(f) == decode_status::need_more));
    }
}

BOOST_AUTO_TEST_CASE(oversize_frame_rejected_before_allocation) {
    frame_decoder d(1024);
    std::string hdr;
    cg::append_be32(hdr, 0x7fffffff);
    d.feed(hdr);
    frame f;
    BOOST_TEST((d.next(f) == decode_status::error));
    BOOST_TEST((d.last_error().code == errc_ns::errc::frame_too_large));
    // The buffer never grew towards the announced 2 GiB.
    auto area = d.prepare(16);
    BOOST_TEST(area.size() < 1024u * 1024u);
    BOOST_TEST((d.next(f) == decode_status::error));  // sticky
}

BOOST_AUTO_TEST_CASE(frame_at_the_limit_is_accepted) {
    frame_decoder d(4 + 10);
    std::string fr;
    append_frame(fr, frame_type::response, std::string(10, 'x'));
    d.feed(fr);
    frame f;
    BOOST_TEST((d.next(f) == decode_status::frame));
    frame_decoder d2(4 + 9);
    d2.feed(fr);
    BOOST_TEST((d2.next(f) == decode_status::error));
}

BOOST_AUTO_TEST_CASE(size_below_four_and_unknown_type_are_errors) {
    frame_decoder d;
    d.feed(std::string("\0\0\0\3abc", 7));
    frame f;
    BOOST_TEST((d.next(f) == decode_status::error));
    BOOST_TEST((d.last_error().code == errc_ns::errc::bad_frame));
    frame_decoder d2;
    d2.feed(std::string("\0\0\0\4\0\0\0\3", 8));
    BOOST_TEST((d2.next(f) == decode_status::error));
}

BOOST_AUTO_TEST_CASE(short_message_and_bad_id_rejected) {
    BOOST_TEST(!parse_message(std::string(25, 'x')).has_value());
    std::string data(26, '\0');
    data.replace(10, 16, "0123456789abcdef");
    BOOST_TEST(parse_message(data).has_value());
    data[12] = '\n';  // would inject a command line into FIN
    auto r = parse_message(data);
    BOOST_TEST(!r.has_value());
    BOOST_TEST((r.code() == errc_ns::errc::bad_message));
}

// The id check reads 8 bytes at a time: every byte value at every id position against the plain rule
// (accepted exactly when it is '!'..'~'), with printable neighbours on both sides of the word boundary.
BOOST_AUTO_TEST_CASE(id_check_matches_the_bytewise_rule_for_every_byte_and_position) {
    std::string data(26 + 3, '\0');
    data.replace(10, 16, "0123456789abcdef");
    data.replace(26, 3, "xyz");
    int mismatches = 0;
    for (int pos = 10; pos < 26; ++pos) {
        for (int b = 0; b < 256; ++b) {
            auto d = data;
            d[static_cast<std::size_t>(pos)] = static_cast<char>(b);
            bool want = b >= 0x21 && b <= 0x7e;
            if (parse_message(d).has_value() != want) ++mismatches;
        }
    }
    BOOST_TEST(mismatches == 0);
    auto all = data;
    for (int pos = 10; pos < 26; ++pos) all[static_cast<std::size_t>(pos)] = pos % 2 ? '!' : '~';
    BOOST_TEST(parse_message(all).has_value());
}

BOOST_AUTO_TEST_CASE(message_frame_encoder_round_trips_golden) {
    std::string out;
    append_message_frame(out, static_cast<std::int64_t>(0x18ec972f54ebd0e9ULL), 1, "18ad397cbfa69000",
                         "hello golden");
    BOOST_TEST(out == golden::message_frame);
    out.clear();
    append_frame(out, frame_type::error, "E_INVALID RDY count 3000 out of range 0-2500");
    BOOST_TEST(out == golden::rdy_invalid);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(identify)

BOOST_AUTO_TEST_CASE(parses_golden_response) {
    auto body = golden::identify_response.substr(8);
    auto r = parse_identify_response(body);
    BOOST_REQUIRE(r.has_value());
    BOOST_TEST(r->max_rdy_count == 2500);
    BOOST_TEST(r->msg_timeout == 5000);
    BOOST_TEST(r->max_msg_timeout == 900000);
    BOOST_TEST(r->version == "1.3.0");
    BOOST_TEST(!r->auth_required);
    BOOST_TEST(r->output_buffer_timeout == 250);
}

BOOST_AUTO_TEST_CASE(response_serialiser_matches_golden_bytes) {
    identify_response r;
    r.version = "1.3.0";
    r.msg_timeout = 5000;
    std::string fr;
    append_frame(fr, frame_type::response, to_json(r));
    BOOST_TEST(fr == golden::identify_response);
    r.msg_timeout = 60000;
    fr.clear();
    append_frame(fr, frame_type::response, to_json(r));
    BOOST_TEST(fr == golden::identify_response_60000);
}

BOOST_AUTO_TEST_CASE(ok_or_garbage_is_bad_response) {
    BOOST_TEST((parse_identify_response("OK").code() == errc_ns::errc::bad_response));
    BOOST_TEST(!parse_identify_response("{\"max_rdy_count\":\"x\"}").has_value());
    BOOST_TEST(!parse_identify_response("{").has_value());
    BOOST_TEST(!parse_identify_response("[]").has_value());
}

BOOST_AUTO_TEST_CASE(request_json_round_trips) {
    identify_request q;
    q.client_id = "c\"1";
    q.hostname = "h";
    q.user_agent = "ua/1";
    q.heartbeat_interval_ms = 1000;
    q.msg_timeout_ms = 5000;
    auto back = parse_identify_request(to_json(q));
    BOOST_REQUIRE(back.has_value());
    BOOST_TEST(back->client_id == "c\"1");
    BOOST_TEST(back->feature_negotiation);
    BOOST_TEST(back->heartbeat_interval_ms == 1000);
    BOOST_TEST(back->msg_timeout_ms == 5000);
    auto golden_req = parse_identify_request(golden::identify_no_heartbeat.substr(13));
    BOOST_REQUIRE(golden_req.has_value());
    BOOST_TEST(golden_req->heartbeat_interval_ms == -1);
    BOOST_TEST(!parse_identify_request("{\"msg_timeout\":\"1\"}").has_value());
    BOOST_TEST(!parse_identify_request("{\"feature_negotiation\":1}").has_value());
}

BOOST_AUTO_TEST_CASE(bounds_use_nsqd_wording) {
    BOOST_TEST(check_msg_timeout(0).has_value());
    BOOST_TEST(check_msg_timeout(1000).has_value());
    BOOST_TEST(check_msg_timeout(900000).has_value());
    BOOST_TEST(!check_msg_timeout(999).has_value());
    auto r = check_msg_timeout(1000000);
    BOOST_REQUIRE(!r.has_value());
    BOOST_TEST(r.err().message == "msg timeout (1000000) is invalid");
    BOOST_TEST(check_heartbeat_interval(-1).has_value());
    BOOST_TEST(check_heartbeat_interval(0).has_value());
    BOOST_TEST(!check_heartbeat_interval(999).has_value());
    BOOST_TEST(!check_heartbeat_interval(60001).has_value());
    BOOST_TEST(!check_heartbeat_interval(-2).has_value());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors_and_lookup)

BOOST_AUTO_TEST_CASE(error_classification) {
    auto e = classify_error("E_FIN_FAILED FIN 18ad397cbfa69000 failed ID not in flight");
    BOOST_TEST(e.code == "E_FIN_FAILED");
    BOOST_TEST(!e.fatal);
    BOOST_TEST(!classify_error("E_REQ_FAILED x").fatal);
    BOOST_TEST(!classify_error("E_TOUCH_FAILED x").fatal);
    for (auto code : {"E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_BAD_MESSAGE",
                      "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED", "E_SUB_FAILED", "E_IDENTIFY_FAILED",
                      "E_AUTH_FAILED", "E_UNAUTHORIZED", "E_SOMETHING_NEW"})
        BOOST_TEST(classify_error(std::string(code) + " text").fatal, code);
    BOOST_TEST(classify_error("E_BAD_PROTOCOL").code == "E_BAD_PROTOCOL");
}

BOOST_AUTO_TEST_CASE(lookup_golden_reply) {
    auto r = parse_lookup_response(
        R"({"channels":[],"producers":[{"remote_address":"127.0.0.1:43936","hostname":"vm","broadcast_address":"127.0.0.1","tcp_port":34150,"http_port":34151,"version":"1.3.0"}]})");
    BOOST_REQUIRE(r.has_value());
    BOOST_REQUIRE(r->size() == 1u);
    BOOST_TEST((*r)[0].key() == "127.0.0.1:34150");
    BOOST_TEST((*r)[0].http_port == 34151);
    auto round = parse_lookup_response(to_lookup_json({}, *r));
    BOOST_REQUIRE(round.has_value());
    BOOST_TEST((*round)[0].hostname == "vm");
    auto old = parse_lookup_response(
        R"({"status_code":200,"status_txt":"OK","data":{"producers":[{"broadcast_address":"::1","tcp_port":4150}]}})");
    BOOST_REQUIRE(old.has_value());
    BOOST_TEST((*old)[0].key() == "[::1]:4150");
    BOOST_TEST(!parse_lookup_response(R"({"message":"TOPIC_NOT_FOUND"})").has_value());
    BOOST_TEST(
        !parse_lookup_response(R"({"producers":[{"broadcast_address":"h","tcp_port":0}]})").has_value());
}

// nsqd 1.3.0's /stats?format=json&topic=golden reply (docs: the golden transcript), trimmed as there.
BOOST_AUTO_TEST_CASE(channel_depth_from_the_golden_stats_reply) {
    const std::string golden =
        R"({"version":"1.3.0","health":"OK","start_time":1795976580,"topics":[{"topic_name":"golden",)"
        R"("channels":[{"channel_name":"c","depth":2,"backend_depth":0,"in_flight_count":0,)"
        R"("deferred_count":0,"message_count":3,"requeue_count":0,"timeout_count":0,"client_count":0,)"
        R"("clients":[],"paused":false,"e2e_processing_latency":{"count":0,"percentiles":null}}],)"
        R"("depth":0,"backend_depth":0,"message_count":3,"message_bytes":15,"paused":false,)"
        R"("e2e_processing_latency":{"count":0,"percentiles":null}}],"memory":{"heap_objects":2337},)"
        R"("producers":[]})";
    auto d = parse_channel_depth(golden, "golden", "c");
    BOOST_REQUIRE(d.has_value());
    BOOST_REQUIRE(d->has_value());
    BOOST_TEST(**d == 2);
    // Another channel or topic: not there (yet), not an error.
    auto other = parse_channel_depth(golden, "golden", "d");
    BOOST_REQUIRE(other.has_value());
    BOOST_TEST(!other->has_value());
    BOOST_TEST(!parse_channel_depth(golden, "other", "c")->has_value());
    // Pre-1.0 nsqd wrapped the same object in data.
    auto old =
        parse_channel_depth(R"({"status_code":200,"status_txt":"OK","data":{"topics":[{"topic_name":"t",)"
                            R"("channels":[{"channel_name":"c","depth":7}]}]}})",
                            "t", "c");
    BOOST_REQUIRE(old.has_value());
    BOOST_TEST(**old == 7);
    BOOST_TEST(!parse_channel_depth("not json", "t", "c").has_value());
    BOOST_TEST(!parse_channel_depth(R"({"health":"OK"})", "t", "c").has_value());
    BOOST_TEST(
        !parse_channel_depth(R"({"topics":[{"topic_name":"t","channels":[{"channel_name":"c"}]}]})", "t", "c")
             .has_value());
}

BOOST_AUTO_TEST_CASE(server_side_command_parsing) {
    auto p = split_command("REQ 0000000000000000 0\r\n");
    BOOST_REQUIRE(p.size() == 3u);
    BOOST_TEST(p[0] == "REQ");
    BOOST_TEST(p[2] == "0");
    BOOST_TEST(split_command("NOP\n").size() == 1u);
    BOOST_TEST(command_has_body("MPUB"));
    BOOST_TEST(!command_has_body("FIN"));
    BOOST_TEST(*parse_base10("3000") == 3000u);
    BOOST_TEST(*parse_base10("") == 0u);
    BOOST_TEST(!parse_base10("-1").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
