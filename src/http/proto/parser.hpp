// Incremental HTTP/1.1 parsing through libhttp-parser, with size limits checked before buffering.
// Pure: bytes in, messages out.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "http/proto/error.hpp"
#include "http/proto/message.hpp"

namespace cg::http {

struct parse_limits {
    std::size_t max_header_bytes = 16 * 1024;  // request/status line + all header lines
    std::size_t max_body_bytes = 1024 * 1024;
};

enum class parse_state { need_more, done, failed };

namespace detail {
struct parser_impl;
}

template <typename Message>
class basic_parser {
  public:
    explicit basic_parser(parse_limits limits = {});
    ~basic_parser();
    basic_parser(basic_parser&&) noexcept;
    basic_parser& operator=(basic_parser&&) noexcept;

    // Consumes bytes up to the end of one message (pipelined bytes after it are left unconsumed).
    // Returns how many bytes were used; check state() afterwards.
    std::size_t feed(std::string_view data);
    // Tells the parser the peer closed: completes a read-until-close body, or fails.
    void feed_eof();

    parse_state state() const noexcept;
    // Valid when state() == failed.
    errc error() const noexcept;
    const std::string& error_detail() const noexcept;
    // True once a full header block has been seen (useful to tell "no bytes yet" from "partial").
    bool started() const noexcept;

    Message& message() noexcept;
    // Ready for the next message on the same connection.
    void reset();

    // Request parsers: the head is complete, its body has a Content-Length and none of it was fed yet. Its
    // length, with the message's method and version filled in as for a complete message; 0 otherwise. The
    // caller may then leave the body to the handler (request::unread_body) and reset() before the next
    // message.
    std::size_t body_left_unfed();

    // Response parsers only: the request was HEAD, so no body follows.
    void expect_no_body(bool v) noexcept;

  private:
    std::unique_ptr<detail::parser_impl> impl_;
    Message msg_;
};

using request_parser = basic_parser<request>;
using response_parser = basic_parser<response>;

}  // namespace cg::http
