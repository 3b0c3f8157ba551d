#include "app/nsq_flags.hpp"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "nsq/proto/identify.hpp"

namespace cg::app {

using std::chrono::milliseconds;

void add_nsq_consumer_flags(CLI::App& cmd, nsq_consumer_flags& f, bool channel_required) {
    cmd.add_option("--topic", f.topic, "NSQ topic to consume")->required();
    auto* ch = cmd.add_option("--channel", f.channel, "NSQ channel");
    if (channel_required) ch->required();
    cmd.add_option("--nsqd-tcp-address", f.nsqd_tcp_addresses, "nsqd TCP address host:port (repeatable)")
        ->delimiter(',');
    cmd.add_option("--lookupd-http-address", f.lookupd_http_addresses,
                   "nsqlookupd HTTP address host:port (repeatable)")
        ->delimiter(',');
    cmd.add_option("--max-in-flight", f.max_in_flight, "messages handled at once (sum of RDY)")
        ->capture_default_str();
    cmd.add_option("--msg-timeout", f.msg_timeout,
                   "per-message timeout asked of nsqd (0 = nsqd's default; 1s..15m)")
        ->capture_default_str();
    cmd.add_option("--heartbeat-interval", f.heartbeat_interval, "nsqd heartbeat interval (1s..60s)")
        ->capture_default_str();
    cmd.add_option("--max-attempts", f.max_attempts,
                   "deliveries before giving up on a message (0 = unlimited)")
        ->capture_default_str();
    cmd.add_option("--lookupd-poll-interval", f.lookupd_poll_interval, "how often to query nsqlookupd")
        ->capture_default_str();
    add_nsq_security_flags(cmd, f.security);
}

void add_nsq_security_flags(CLI::App& cmd, nsq_security_flags& f) {
    cmd.add_flag("--nsq-tls", f.tls, "TLS to nsqd (tls_v1), verifying its certificate");
    cmd.add_option("--nsq-tls-ca-file", f.tls_ca_file,
                   "PEM CA bundle to verify nsqd with (default: system store)");
    cmd.add_option("--nsq-tls-cert", f.tls_cert_file,
                   "client certificate (PEM) for nsqd's --tls-client-auth-policy");
    cmd.add_option("--nsq-tls-key", f.tls_key_file, "private key (PEM) of --nsq-tls-cert");
    cmd.add_option("--nsq-tls-server-name", f.tls_server_name,
                   "name nsqd's certificate must carry (default: the host of the address)");
    cmd.add_flag("--nsq-snappy", f.snappy, "snappy stream compression with nsqd");
    cmd.add_flag("--nsq-deflate", f.deflate, "deflate stream compression with nsqd");
    cmd.add_option("--nsq-deflate-level", f.deflate_level, "deflate level 1..9 (nsqd caps it at its max)")
        ->capture_default_str();
    cmd.add_option("--nsq-auth-secret-file", f.auth_secret_file,
                   "file holding the secret for nsqd's AUTH (else CHARGEGUARD_NSQ_AUTH_SECRET)");
}

nsq::nsq_security to_nsq_security(const nsq_security_flags& f, const char* env_secret) {
    nsq::nsq_security s;
    s.tls = f.tls || !f.tls_ca_file.empty() || !f.tls_cert_file.empty();
    s.tls_ca_file = f.tls_ca_file;
    s.tls_cert_file = f.tls_cert_file;
    s.tls_key_file = f.tls_key_file;
    s.tls_server_name = f.tls_server_name;
    s.snappy = f.snappy;
    s.deflate = f.deflate;
    s.deflate_level = f.deflate_level;
    if (f.snappy && f.deflate)
        throw CLI::ValidationError("--nsq-snappy", "choose at most one of --nsq-snappy and --nsq-deflate");
    if (f.deflate_level < 1 || f.deflate_level > 9)
        throw CLI::ValidationError("--nsq-deflate-level",
                                   std::to_string(f.deflate_level) + " is out of range 1 .. 9");
    if (f.tls_cert_file.empty() != f.tls_key_file.empty())
        throw CLI::ValidationError("--nsq-tls-cert", "--nsq-tls-cert and --nsq-tls-key go together");
    if (!f.auth_secret_file.empty()) {
        std::ifstream in(f.auth_secret_file);
        if (!in)
            throw CLI::ValidationError("--nsq-auth-secret-file", "cannot read '" + f.auth_secret_file + "'");
        std::stringstream ss;
        ss << in.rdbuf();
        s.auth_secret = ss.str();
        while (!s.auth_secret.empty() && std::isspace(static_cast<unsigned char>(s.auth_secret.back())))
            s.auth_secret.pop_back();
        if (s.auth_secret.empty())
            throw CLI::ValidationError("--nsq-auth-secret-file", "'" + f.auth_secret_file + "' is empty");
    } else if (env_secret && *env_secret) {
        s.auth_secret = env_secret;
    }
    if (auto v = nsq::validate(s); !v) throw CLI::ValidationError("nsq", v.err().message);
    return s;
}

std::optional<milliseconds> parse_duration(std::string_view s) {
    if (s == "0") return milliseconds(0);
    if (s.empty()) return std::nullopt;
    double total_ms = 0;
    while (!s.empty()) {
        double v = 0;
        auto r = std::from_chars(s.data(), s.data() + s.size(), v);
        if (r.ec != std::errc{} || v < 0) return std::nullopt;
        s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
        std::size_t n = 0;
        while (n < s.size() && ((s[n] >= 'a' && s[n] <= 'z') || s[n] == 'u')) ++n;
        auto unit = s.substr(0, n);
        s.remove_prefix(n);
        double mult;
        if (unit == "ms")
            mult = 1;
        else if (unit == "s")
            mult = 1000;
        else if (unit == "m")
            mult = 60000;
        else if (unit == "h")
            mult = 3600000;
        else if (unit == "us")
            mult = 0.001;
        else
            return std::nullopt;
        total_ms += v * mult;
    }
    return milliseconds(static_cast<std::int64_t>(total_ms + 0.5));
}

milliseconds duration_flag(const std::string& flag, const std::string& v) {
    auto d = parse_duration(v);
    if (!d) throw CLI::ValidationError(flag, "'" + v + "' is not a duration (e.g. 1500ms, 60s, 2m)");
    return *d;
}

nsq::consumer_config to_consumer_config(const nsq_consumer_flags& f) {
    nsq::consumer_config c;
    c.topic = f.topic;
    c.channel = f.channel;
    c.nsqd_tcp_addresses = f.nsqd_tcp_addresses;
    c.lookupd_http_addresses = f.lookupd_http_addresses;
    c.max_in_flight = f.max_in_flight;
    c.max_attempts = f.max_attempts;
    c.msg_timeout = duration_flag("--msg-timeout", f.msg_timeout);
    if (!nsq::proto::check_msg_timeout(c.msg_timeout.count()))
        throw CLI::ValidationError(
            "--msg-timeout",
            f.msg_timeout +
                " is out of range: 0 (nsqd's default) or 1s .. 15m (nsqd's max-msg-timeout); "
                "nsqd would refuse IDENTIFY with E_BAD_BODY");
    c.heartbeat_interval = duration_flag("--heartbeat-interval", f.heartbeat_interval);
    if (c.heartbeat_interval < milliseconds(1000) || c.heartbeat_interval > milliseconds(60000))
        throw CLI::ValidationError(
            "--heartbeat-interval",
            f.heartbeat_interval + " is out of range: 1s .. 60s (heartbeats cannot be disabled)");
    c.lookupd_poll_interval = duration_flag("--lookupd-poll-interval", f.lookupd_poll_interval);
    c.security = to_nsq_security(f.security, std::getenv("CHARGEGUARD_NSQ_AUTH_SECRET"));
    if (c.nsqd_tcp_addresses.empty() && c.lookupd_http_addresses.empty())
        throw CLI::ValidationError("--nsqd-tcp-address", "give --nsqd-tcp-address or --lookupd-http-address");
    if (f.max_in_flight < 1) throw CLI::ValidationError("--max-in-flight", "must be at least 1");
    if (auto v = nsq::validate(c); !v) throw CLI::ValidationError("nsq", v.err().message);
    return c;
}

}  // namespace cg::app
