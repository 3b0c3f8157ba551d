// A minimal HTTP/1.1 GET over plain TCP for nsqlookupd's /lookup (one request per connection,
// Connection: close), on http/proto's serializer and response parser.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <string>

#include "core/result.hpp"
#include "http/proto/message.hpp"
#include "net/address.hpp"

namespace cg::nsq {

// Resolves `where` (asynchronously), connects, sends GET `target` with `accept`, and reads the whole
// response (body ≤ 1 MiB). Returns the response or an error (timeout: nsq::errc::timeout). The whole
// exchange is bounded by `timeout`. Completes on the caller's executor; owns everything it uses.
asio::awaitable<result<http::response>> http_get(net::host_port where, std::string target, std::string accept,
                                                 std::chrono::milliseconds timeout);

}  // namespace cg::nsq
