// Consumer and producer settings, with go-nsq's names and defaults where they exist, and the validation
// that refuses values nsqd would reject before any connection is made.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/result.hpp"
#include "nsq/proto/frame.hpp"

namespace cg::nsq {

using std::chrono::milliseconds;

// Stands in for DNS (tests): the addresses a host name resolves to, numeric, in order.
using resolve_hook = std::function<std::vector<std::string>(const std::string& host)>;

// TLS, compression and AUTH towards nsqd (consumer, producer, publish, tail).
struct nsq_security {
    bool tls = false;           // ask for tls_v1; the connection fails if nsqd cannot do it
    std::string tls_ca_file;    // PEM bundle to verify nsqd against; empty: the system store
    std::string tls_cert_file;  // optional client certificate (--tls-client-auth-policy)
    std::string tls_key_file;
    std::string tls_server_name;  // name to verify instead of the address's host (empty: the host)
    bool snappy = false;
    bool deflate = false;
    int deflate_level = 6;    // 1..9, capped by nsqd's max_deflate_level
    std::string auth_secret;  // sent with AUTH when nsqd asks for it; never logged
};

// Checks TLS/compression settings (at most one compression, level bounds, key without cert…).
result<void> validate(const nsq_security& s);

struct consumer_config {
    std::string topic;
    std::string channel;
    std::vector<std::string> nsqd_tcp_addresses;      // "host:port", connected to directly
    std::vector<std::string> lookupd_http_addresses;  // "host:port" or "http://host:port"

    unsigned max_in_flight = 1;  // the sum of RDY over all connections (and handlers at once)
    // Handlers at once, when fewer than max_in_flight (0: max_in_flight), while `held_up` (when set) says
    // the handlers running are held up downstream (more would only wait there too); otherwise up to
    // max_in_flight. The other deliveries in flight wait queued, holding only their message, TOUCHed from
    // receipt, and start as handlers finish, oldest first. Called on the consumer's executor.
    unsigned max_handlers = 0;
    std::function<bool()> held_up;
    milliseconds msg_timeout{0};             // 0: nsqd's --msg-timeout; else 1 s .. 15 min
    milliseconds heartbeat_interval{30000};  // 1 s .. 60 s
    unsigned max_attempts = 5;               // 0: unlimited; past it the give-up callback runs instead
    milliseconds lookupd_poll_interval{60000};
    double lookupd_poll_jitter = 0.3;

    // Reconnect to an address that failed: min · 2^(n-1), capped, with ±20 % jitter.
    milliseconds reconnect_backoff_min{1000};
    milliseconds reconnect_backoff_max{60000};
    // Handler-failure backoff (go-nsq): multiplier · 2^level, capped.
    milliseconds backoff_multiplier{1000};
    milliseconds max_backoff_duration{120000};
    // requeue() without a delay: default · attempts, capped (go-nsq's DefaultRequeueDelay/MaxRequeueDelay).
    milliseconds default_requeue_delay{90000};
    milliseconds max_requeue_delay{15 * 60 * 1000};
    // With more connections than max_in_flight, RDY 1 moves on to idle connections this often.
    milliseconds rdy_redistribute_interval{5000};
    milliseconds low_rdy_idle_timeout{10000};
    // A budget freed by lowering RDY on one connection is given to another only after this long, so the
    // sum of RDY nsqd sees never exceeds max_in_flight even though connections are separate streams.
    milliseconds rdy_settle_delay{100};
    milliseconds connect_timeout{5000};  // TCP connect + IDENTIFY + SUB
    milliseconds lookupd_timeout{5000};  // one /lookup request
    // Graceful stop: wait this long for in-flight handlers, then for CLOSE_WAIT.
    milliseconds drain_timeout{30000};

    std::string client_id;  // default: the short host name
    std::string hostname;   // default: the host name
    std::string user_agent = "chargeguard-nsq/0.1";
    std::size_t max_frame_size = proto::default_max_frame_size;
    nsq_security security;
    resolve_hook resolver;  // empty: DNS
};

// Checks names, addresses and bounds; the message names the offending setting.
result<void> validate(const consumer_config& c);

struct producer_config {
    milliseconds heartbeat_interval{30000};
    milliseconds connect_timeout{5000};
    milliseconds publish_timeout{10000};  // from write to OK
    milliseconds reconnect_backoff_min{100};
    milliseconds reconnect_backoff_max{10000};
    // nsqd's publish limits (1.3.0 defaults). nsqd answers a publish beyond them with a fatal error that
    // closes the connection under every publish pipelined with it, and its IDENTIFY reply does not carry
    // them: set them to nsqd's --max-msg-size, --max-body-size and --max-req-timeout when those differ.
    std::int64_t max_msg_size = 1024 * 1024;       // one message body (PUB, DPUB, each MPUB element)
    std::int64_t max_body_size = 5 * 1024 * 1024;  // an MPUB body: 4 + Σ (4 + size)
    milliseconds max_req_timeout{60 * 60 * 1000};  // the longest DPUB delay
    std::string client_id, hostname;
    std::string user_agent = "chargeguard-nsq/0.1";
    std::size_t max_frame_size = proto::default_max_frame_size;
    nsq_security security;
    resolve_hook resolver;  // empty: DNS
};

result<void> validate(const producer_config& c);

// The machine's host name (gethostname), and its first label.
std::string local_hostname();
std::string short_hostname();

}  // namespace cg::nsq
