// The start every nsqd connection shares (consumer and producer): magic → IDENTIFY → the negotiated
// reply → TLS (tls_v1) → snappy or deflate → AUTH when nsqd asks for it, each upgrade confirmed by an
// OK frame as nsqd 1.3.0 sends it (protocol_v2.go IDENTIFY/AUTH). Heartbeats nsqd's ticker writes in
// between (after an upgrade switched the stream, before its OK; before the AUTH reply) are skipped.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "core/log.hpp"
#include "core/result.hpp"
#include "nsq/config.hpp"
#include "nsq/proto/frame.hpp"
#include "nsq/proto/identify.hpp"
#include "nsq/transport.hpp"

namespace cg::nsq {

// A TLS client context for nsqd: verification against the CA file or the system store, plus the client
// certificate when given. nullptr (and no error) when TLS is off. Reads files: call it once, at start.
result<std::shared_ptr<asio::ssl::context>> make_nsq_tls_context(const nsq_security& s);

// One frame through `t` into `d`, by `deadline` (errc::timeout naming `what` after it).
asio::awaitable<result<proto::frame>> read_frame(transport& t, proto::frame_decoder& d,
                                                 std::chrono::steady_clock::time_point deadline,
                                                 const std::string& what);

struct handshake_options {
    proto::identify_request identify;
    const nsq_security* security = nullptr;
    asio::ssl::context* tls = nullptr;  // required when security->tls
    std::string tls_host;               // the name (or IP) nsqd's certificate must carry
    std::string what;                   // "nsqd 127.0.0.1:4150", for messages
};

// Runs the exchange on a connected transport. Returns nsqd's negotiated settings, or an error naming
// the step (nsqd's own error text for an error frame: E_BAD_BODY …, E_AUTH_FAILED, E_UNAUTHORIZED).
// Refuses an upgrade nsqd enabled that was not asked for, and fails if one asked for is refused.
// Completes on the transport's executor.
asio::awaitable<result<proto::identify_response>> handshake(transport& t, proto::frame_decoder& d,
                                                            const handshake_options& o,
                                                            std::chrono::steady_clock::time_point deadline,
                                                            logger& log);

}  // namespace cg::nsq
