// HTTP/1.1 request and response types and their serialisation. Pure, no I/O.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cg::http {

// Ordered header list; lookups are case-insensitive.
class headers {
  public:
    void add(std::string name, std::string value) { items_.emplace_back(std::move(name), std::move(value)); }
    // Replaces every header named `name` with one value.
    void set(std::string_view name, std::string value);
    void remove(std::string_view name);
    std::optional<std::string_view> get(std::string_view name) const;
    bool has(std::string_view name) const { return get(name).has_value(); }
    // True if a comma-separated header contains `token` (case-insensitive), e.g. Connection: close.
    bool has_token(std::string_view name, std::string_view token) const;

    auto begin() const { return items_.begin(); }
    auto end() const { return items_.end(); }
    std::size_t size() const { return items_.size(); }
    void clear() { items_.clear(); }

  private:
    std::vector<std::pair<std::string, std::string>> items_;
};

// What reads a request's body that the server left in its connection (router::leave_bodies_unread).
class body_source {
  public:
    // The next `n` bytes of the connection, which are there already: consumed (`take`), or copied and left
    // there. nullopt when the socket can no longer be read (the server's stop closed it).
    virtual std::optional<std::string> read(std::size_t n, bool take) = 0;

  protected:
    ~body_source() = default;
};

struct request {
    std::string method = "GET";
    std::string target = "/";  // origin-form: path?query
    int version_minor = 1;
    http::headers headers;
    std::string body;
    // Bytes of the body still in the connection, all of them arrived (`body` is empty until take_body()),
    // and what reads them; 0 when the whole body is in `body`.
    std::size_t unread_body = 0;
    body_source* unread_from = nullptr;

    std::size_t body_size() const noexcept { return body.size() + unread_body; }
    // The whole body, a copy of what is still unread, which stays in the connection: what a check reads
    // without holding the body while the request waits. nullopt when the connection is gone.
    std::optional<std::string> peek_body() const;
    // Moves what is still unread into `body`. False when the connection is gone (`body` stays empty).
    bool take_body();

    std::string_view path() const;   // target up to '?'
    std::string_view query() const;  // after '?', or empty
    // Keep-alive per RFC 9112: HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with keep-alive.
    bool keep_alive() const;
};

struct response {
    int status = 200;
    std::string reason;  // empty: the standard phrase
    http::headers headers;
    std::string body;
    int version_minor = 1;
    // Server side only: close the connection without writing this response (fault injection in test
    // doubles: "the peer vanished after doing the work").
    bool abort_connection = false;
    bool keep_alive() const;
};

std::string_view reason_phrase(int status) noexcept;

// Appends the wire form. Content-Length is set from the body (unless a Transfer-Encoding is present).
void serialize(const request& r, std::string& out);
// `head_request`: body omitted (the length still announced).
void serialize(const response& r, std::string& out, bool head_request = false);

// Convenience for handlers.
response make_response(int status, std::string body = {},
                       std::string_view content_type = "text/plain; charset=utf-8");

// Percent-decoding of a query component ('+' → space); nullopt on a bad escape.
std::optional<std::string> url_decode(std::string_view s);
// Percent-encoding of everything outside RFC 3986 unreserved characters.
std::string url_encode(std::string_view s);
// Value of `key` in a query string ("a=1&b=2"), decoded; nullopt when absent.
std::optional<std::string> query_param(std::string_view query, std::string_view key);

}  // namespace cg::http
