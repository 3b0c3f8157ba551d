#include "app/nsq_flags.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "net/address.hpp"
#include "nsq/proto/identify.hpp"

namespace cg::app {

using std::chrono::milliseconds;

void add_nsq_consumer_flags(CLI::App& cmd, nsq_consumer_flags& f, bool channel_required) {
    // --topic and --channel select what is consumed: from the environment only in `consume` (service scope).
    cmd.add_option("--topic", f.topic, "NSQ topic to consume")->required()->group(group_nsq);
    auto* ch = cmd.add_option("--channel", f.channel, "NSQ channel")->group(group_nsq);
    if (channel_required) ch->required();
    env(cmd.add_option("--nsqd-tcp-address", f.nsqd_tcp_addresses, "nsqd TCP address host:port (repeatable)")
            ->delimiter(',')
            ->group(group_nsq),
        env_scope::connection);
    env(cmd.add_option("--lookupd-http-address", f.lookupd_http_addresses,
                       "nsqlookupd HTTP address host:port (repeatable; not with --nsqd-tcp-address)")
            ->delimiter(',')
            ->group(group_nsq),
        env_scope::connection);
    cmd.add_option("--max-in-flight", f.max_in_flight,
                   "messages handled at once (sum of RDY); above 2500 (nsqd's default --max-rdy-count) only "
                   "with --max-in-flight-above-nsqd-default")
        ->capture_default_str()
        ->group(group_nsq);
    // An acknowledgement: never from the environment.
    env(cmd.add_flag("--max-in-flight-above-nsqd-default", f.max_in_flight_acknowledged,
                     "allow --max-in-flight above 2500 (nsqd must run with a --max-rdy-count that high)")
            ->group(group_nsq),
        env_scope::never);
    env(cmd.add_option("--msg-timeout", f.msg_timeout, "per-message timeout asked of nsqd (1s..15m)")
            ->capture_default_str()
            ->type_name("DURATION")
            ->group(group_nsq),
        env_scope::connection);
    env(cmd.add_option("--heartbeat-interval", f.heartbeat_interval, "nsqd heartbeat interval (1s..60s)")
            ->capture_default_str()
            ->type_name("DURATION")
            ->group(group_nsq),
        env_scope::connection);
    cmd.add_option("--max-attempts", f.max_attempts,
                   "deliveries before giving up on a message (0 = unlimited)")
        ->capture_default_str()
        ->group(group_nsq);
    env(cmd.add_option("--lookupd-poll-interval", f.lookupd_poll_interval, "how often to query nsqlookupd")
            ->capture_default_str()
            ->type_name("DURATION")
            ->group(group_nsq),
        env_scope::connection);
    add_nsq_security_flags(cmd, f.security);
}

void add_nsq_security_flags(CLI::App& cmd, nsq_security_flags& f) {
    auto conn = [](CLI::Option* o) { env(o->group(group_nsq), env_scope::connection); };
    conn(cmd.add_flag("--nsq-tls", f.tls, "TLS to nsqd (tls_v1), verifying its certificate"));
    conn(cmd.add_option("--nsq-tls-ca-file", f.tls_ca_file,
                        "PEM CA bundle to verify nsqd with (default: system store)"));
    conn(cmd.add_option("--nsq-tls-cert", f.tls_cert_file,
                        "client certificate (PEM) for nsqd's --tls-client-auth-policy"));
    conn(cmd.add_option("--nsq-tls-key", f.tls_key_file, "private key (PEM) of --nsq-tls-cert"));
    conn(cmd.add_option("--nsq-tls-server-name", f.tls_server_name,
                        "name nsqd's certificate must carry (default: the host of the address)"));
    conn(cmd.add_flag("--nsq-snappy", f.snappy, "snappy stream compression with nsqd"));
    conn(cmd.add_flag("--nsq-deflate", f.deflate, "deflate stream compression with nsqd"));
    conn(
        cmd.add_option("--nsq-deflate-level", f.deflate_level, "deflate level 1..9 (nsqd caps it at its max)")
            ->capture_default_str());
    conn(cmd.add_option("--nsq-auth-secret-file", f.auth_secret_file,
                        "file holding the secret for nsqd's AUTH (else CHARGEGUARD_NSQ_AUTH_SECRET)"));
}

void bad_secret_file(const std::string& flag, const std::string& path, const std::string& why) {
    // A path that looks like a secret is one typed where its file's path belongs: named by flag only.
    if (looks_like_secret(path)) throw config_error(flag + ": " + why);
    throw config_error(value_origin(flag, path) + ": " + why);
}

std::string read_secret_file(const std::string& flag, const std::string& path) {
    if (looks_like_secret(path))
        bad_secret_file(flag, path,
                        "the value is a secret, not the path of a file holding one (a secret on the command "
                        "line is visible to every local user; write it to a file)");
    // Startup only, before any event loop runs: plain blocking reads are fine here.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) bad_secret_file(flag, path, "no such file");
        if (e == EACCES)
            bad_secret_file(
                flag, path,
                "permission denied (this process runs as uid " + std::to_string(::getuid()) + ")");
        bad_secret_file(flag, path, std::string("cannot open: ") + std::strerror(e));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        bool dir = S_ISDIR(st.st_mode);
        ::close(fd);
        bad_secret_file(flag, path, dir ? "is a directory, not a file" : "is not a regular file");
    }
    std::string out;
    char buf[4096];
    for (;;) {
        auto n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            ::close(fd);
            bad_secret_file(flag, path, std::string("cannot read: ") + std::strerror(e));
        }
        if (n == 0) break;
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > 65536) {
            ::close(fd);
            bad_secret_file(flag, path, "larger than 64 KiB: not a secret file");
        }
    }
    ::close(fd);
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.front()))) out.erase(0, 1);
    if (out.empty()) bad_secret_file(flag, path, "is empty");
    return out;
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
    if (f.snappy && f.deflate) throw usage_error("choose at most one of --nsq-snappy and --nsq-deflate");
    if (f.deflate_level < 1 || f.deflate_level > 9)
        bad_value("--nsq-deflate-level", std::to_string(f.deflate_level), "out of range 1 .. 9");
    if (f.tls_cert_file.empty() != f.tls_key_file.empty())
        throw usage_error("--nsq-tls-cert and --nsq-tls-key go together");
    if (!f.auth_secret_file.empty()) {
        auto secret = read_secret_file("--nsq-auth-secret-file", f.auth_secret_file);
        if (secret.find_first_of("\r\n") != std::string::npos)
            bad_secret_file("--nsq-auth-secret-file", f.auth_secret_file,
                            "holds more than one line (the AUTH secret is one line)");
        s.auth_secret = std::move(secret);
    } else if (env_secret && *env_secret) {
        s.auth_secret = env_secret;
    }
    if (auto v = nsq::validate(s); !v) throw usage_error(v.err().message);
    return s;
}

namespace {
// As the environment variable holds them (the options' delimiter).
std::string joined_addresses(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& a : v) out += (out.empty() ? "" : ",") + a;
    return out;
}
}  // namespace

nsq::consumer_config to_consumer_config(const nsq_consumer_flags& f) {
    nsq::consumer_config c;
    c.topic = f.topic;
    c.channel = f.channel;
    c.nsqd_tcp_addresses = f.nsqd_tcp_addresses;
    c.lookupd_http_addresses = f.lookupd_http_addresses;
    c.max_in_flight = f.max_in_flight;
    c.max_attempts = f.max_attempts;
    c.msg_timeout = duration_flag("--msg-timeout", f.msg_timeout);
    // 0 would ask nsqd for its own --msg-timeout, which this process cannot see, while the TOUCH pacing and
    // the sweeper's bound must know the real one: the value is always explicit.
    if (c.msg_timeout.count() == 0)
        bad_value("--msg-timeout", f.msg_timeout,
                  "0 is not accepted: give the timeout itself, 1s .. 15m (nsqd's default is 60s), so that "
                  "TOUCH and the sweeper use the value nsqd applies");
    if (!nsq::proto::check_msg_timeout(c.msg_timeout.count()))
        bad_value("--msg-timeout", f.msg_timeout,
                  "out of range: 1s .. 15m (nsqd's max-msg-timeout); nsqd would refuse IDENTIFY with "
                  "E_BAD_BODY");
    c.heartbeat_interval = duration_flag("--heartbeat-interval", f.heartbeat_interval);
    if (c.heartbeat_interval < milliseconds(1000) || c.heartbeat_interval > milliseconds(60000))
        bad_value("--heartbeat-interval", f.heartbeat_interval,
                  "out of range: 1s .. 60s (heartbeats cannot be disabled)");
    c.lookupd_poll_interval = duration_flag("--lookupd-poll-interval", f.lookupd_poll_interval);
    c.security = to_nsq_security(f.security, std::getenv("CHARGEGUARD_NSQ_AUTH_SECRET"));
    if (c.nsqd_tcp_addresses.empty() && c.lookupd_http_addresses.empty())
        throw usage_error("give --nsqd-tcp-address or --lookupd-http-address");
    // An address kind given on the command line replaces the other kind coming from the environment (a
    // debug shell with the ConfigMap's CHARGEGUARD_LOOKUPD_HTTP_ADDRESS, pointed at one nsqd).
    auto from_env = [](const char* flag, const std::vector<std::string>& v) {
        return !v.empty() && value_origin(flag, joined_addresses(v)).rfind("CHARGEGUARD_", 0) == 0;
    };
    if (!c.nsqd_tcp_addresses.empty() && !c.lookupd_http_addresses.empty()) {
        bool nsqd_env = from_env("--nsqd-tcp-address", c.nsqd_tcp_addresses);
        bool lookupd_env = from_env("--lookupd-http-address", c.lookupd_http_addresses);
        if (lookupd_env && !nsqd_env) c.lookupd_http_addresses.clear();
        if (nsqd_env && !lookupd_env) c.nsqd_tcp_addresses.clear();
    }
    // As nsq_to_http: one source of nsqd addresses, or the consumer would join some nsqd twice.
    if (!c.nsqd_tcp_addresses.empty() && !c.lookupd_http_addresses.empty())
        throw usage_error(
            "--nsqd-tcp-address and --lookupd-http-address exclude each other: give one"
            " (check CHARGEGUARD_NSQD_TCP_ADDRESS and CHARGEGUARD_LOOKUPD_HTTP_ADDRESS)");
    for (const auto& a : c.nsqd_tcp_addresses)
        if (auto hp = net::parse_host_port(a); !hp)
            bad_value("--nsqd-tcp-address", a, hp.err().code.message());
    for (const auto& a : c.lookupd_http_addresses)
        if (auto hp = net::parse_host_port(a); !hp)
            bad_value("--lookupd-http-address", a, hp.err().code.message());
    if (f.max_in_flight < 1)
        bad_value("--max-in-flight", std::to_string(f.max_in_flight), "must be at least 1");
    if (f.max_in_flight > max_rdy_count_default && !f.max_in_flight_acknowledged)
        bad_value("--max-in-flight", std::to_string(f.max_in_flight),
                  "above 2500, nsqd's default --max-rdy-count: nsqd refuses RDY above its limit. Give "
                  "--max-in-flight-above-nsqd-default if nsqd runs with a higher --max-rdy-count");
    if (auto v = nsq::validate(c); !v) throw usage_error(v.err().message);
    return c;
}

}  // namespace cg::app
