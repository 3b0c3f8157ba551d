#include "nsq/config.hpp"

#include <unistd.h>

#include "net/address.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"
#include "nsq/proto/identify.hpp"

namespace cg::nsq {
namespace {

error bad(std::string m) {
    return error(errc::bad_config, std::move(m));
}

std::string strip_scheme(const std::string& a) {
    if (a.rfind("http://", 0) == 0) return a.substr(7);
    return a;
}

}  // namespace

result<void> validate(const nsq_security& s) {
    if (s.snappy && s.deflate) return bad("choose at most one of snappy and deflate compression");
    if (s.deflate && (s.deflate_level < 1 || s.deflate_level > 9))
        return bad("deflate level " + std::to_string(s.deflate_level) + " is out of range 1 .. 9");
    if (s.tls_cert_file.empty() != s.tls_key_file.empty())
        return bad("a TLS client certificate needs both the certificate and the key file");
    if (!s.tls && (!s.tls_ca_file.empty() || !s.tls_cert_file.empty()))
        return bad("TLS files given but TLS is not enabled");
    return {};
}

result<void> validate(const consumer_config& c) {
    if (!proto::valid_topic_name(c.topic)) return bad("topic name '" + c.topic + "' is not valid");
    if (!proto::valid_channel_name(c.channel)) return bad("channel name '" + c.channel + "' is not valid");
    if (c.nsqd_tcp_addresses.empty() && c.lookupd_http_addresses.empty())
        return bad("give at least one nsqd TCP address or nsqlookupd HTTP address");
    for (const auto& a : c.nsqd_tcp_addresses)
        if (!net::parse_host_port(a)) return bad("nsqd TCP address '" + a + "' is not host:port");
    for (const auto& a : c.lookupd_http_addresses) {
        auto s = strip_scheme(a);
        if (s.find('/') != std::string::npos) s.resize(s.find('/'));
        if (!net::parse_host_port(s)) return bad("nsqlookupd HTTP address '" + a + "' is not host:port");
    }
    if (c.max_in_flight < 1) return bad("max_in_flight must be at least 1");
    auto mt = c.msg_timeout.count();
    if (!proto::check_msg_timeout(mt))
        return bad("msg_timeout " + std::to_string(mt) +
                   " ms is out of range: 0 (nsqd's default) or 1000 ms .. " +
                   std::to_string(proto::default_max_msg_timeout_ms) + " ms (nsqd's max-msg-timeout)");
    auto hb = c.heartbeat_interval.count();
    if (hb < proto::min_heartbeat_interval_ms || hb > proto::max_heartbeat_interval_ms)
        return bad("heartbeat_interval " + std::to_string(hb) + " ms is out of range: 1000 .. 60000 ms " +
                   "(heartbeats cannot be disabled: nsqd refuses SUB without them)");
    if (c.lookupd_poll_interval < milliseconds(10))
        return bad("lookupd_poll_interval must be at least 10 ms");
    if (c.lookupd_poll_jitter < 0 || c.lookupd_poll_jitter > 1)
        return bad("lookupd_poll_jitter must be in [0, 1]");
    if (c.reconnect_backoff_min <= milliseconds(0) || c.reconnect_backoff_max < c.reconnect_backoff_min)
        return bad("reconnect backoff: need 0 < min <= max");
    if (c.backoff_multiplier < milliseconds(0) || c.max_backoff_duration < milliseconds(0))
        return bad("backoff durations must not be negative");
    if (c.connect_timeout <= milliseconds(0)) return bad("connect_timeout must be positive");
    if (c.max_frame_size < 64) return bad("max_frame_size must be at least 64 bytes");
    return validate(c.security);
}

result<void> validate(const producer_config& c) {
    auto hb = c.heartbeat_interval.count();
    if (hb < proto::min_heartbeat_interval_ms || hb > proto::max_heartbeat_interval_ms)
        return bad("heartbeat_interval " + std::to_string(hb) + " ms is out of range: 1000 .. 60000 ms");
    if (c.connect_timeout <= milliseconds(0) || c.publish_timeout <= milliseconds(0))
        return bad("timeouts must be positive");
    if (c.reconnect_backoff_min <= milliseconds(0) || c.reconnect_backoff_max < c.reconnect_backoff_min)
        return bad("reconnect backoff: need 0 < min <= max");
    if (c.max_msg_size < 1 || c.max_body_size < 9 || c.max_req_timeout < milliseconds(0))
        return bad("publish limits: need max_msg_size >= 1, max_body_size >= 9, max_req_timeout >= 0");
    return validate(c.security);
}

std::string local_hostname() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
    return buf;
}

std::string short_hostname() {
    auto h = local_hostname();
    return h.substr(0, h.find('.'));
}

}  // namespace cg::nsq
