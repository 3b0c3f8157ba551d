// Shared by the HTTP/1.1 request and response targets: drives a parser the way the server's and the
// client's read loops do (bytes appended to a buffer, fed until the parser stops, the rest kept for the
// next message), in chunks of a given size, and records every message or error as text to compare runs.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "check.hpp"
#include "core/bytes.hpp"
#include "http/proto/message.hpp"
#include "http/proto/parser.hpp"

namespace fuzz_http {

using namespace cg::http;

// Small limits, so inputs of a few KiB reach them.
inline parse_limits small_limits() {
    parse_limits l;
    l.max_header_bytes = 1024;
    l.max_body_bytes = 2048;
    return l;
}

inline std::string describe(const headers& h) {
    std::string out;
    for (const auto& [n, v] : h) {
        out += n;
        out += '\0';
        out += v;
        out += '\0';
    }
    return out;
}

inline std::string describe(const request& r) {
    return "request " + r.method + ' ' + r.target + ' ' + std::to_string(r.version_minor) + '\n' +
           describe(r.headers) + '\n' + r.body;
}

inline std::string describe(const response& r) {
    return "response " + std::to_string(r.status) + ' ' + r.reason + ' ' + std::to_string(r.version_minor) +
           '\n' + describe(r.headers) + '\n' + r.body;
}

// Every message (and a final error) that `in` yields when read `chunk` bytes at a time; `messages`
// receives the parsed ones. At most `max_messages`.
template <typename Parser, typename Message>
std::vector<std::string> run(std::string_view in, std::size_t chunk, bool no_body,
                             std::vector<Message>* messages = nullptr, parse_limits limits = small_limits(),
                             std::size_t max_messages = 64) {
    Parser p(limits);
    p.expect_no_body(no_body);
    std::vector<std::string> out;
    std::string buf;
    std::size_t off = 0;
    for (;;) {
        while (!buf.empty()) {
            auto used = p.feed(buf);
            FUZZ_CHECK(used <= buf.size());
            buf.erase(0, used);
            if (p.state() == parse_state::need_more) {
                // A parser that needs more has consumed everything it was given.
                FUZZ_CHECK(buf.empty());
                break;
            }
            if (p.state() == parse_state::failed) {
                FUZZ_CHECK(p.error() != errc::ok);
                FUZZ_CHECK(!p.error_detail().empty());
                out.push_back("error " + std::to_string(static_cast<int>(p.error())));
                return out;
            }
            out.push_back(describe(p.message()));
            if (messages) messages->push_back(p.message());
            if (out.size() >= max_messages) return out;
            p.reset();
            p.expect_no_body(no_body);
        }
        if (off >= in.size()) break;
        auto n = std::min(chunk, in.size() - off);
        buf.append(in.substr(off, n));
        off += n;
    }
    if (p.started()) {
        p.feed_eof();
        if (p.state() == parse_state::done) {
            out.push_back(describe(p.message()));
            if (messages) messages->push_back(p.message());
        } else {
            FUZZ_CHECK(p.state() == parse_state::failed && p.error() != errc::ok);
            out.push_back("eof error " + std::to_string(static_cast<int>(p.error())));
        }
    }
    return out;
}

// Two reads of the same bytes agree: the same messages, and both end in an error or neither does. The
// kind of error may differ when the bytes break two rules: the size limits are checked as bytes arrive, a
// syntax error when the parser reaches it (a 2 KiB target with a bad character after the first KiB is
// "too large" read in pieces, "malformed" read at once).
inline bool agree(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    auto is_error = [](const std::string& s) {
        return s.starts_with("error ") || s.starts_with("eof error ");
    };
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (a[i] == b[i]) continue;
        if (i + 1 != a.size() || !is_error(a[i]) || !is_error(b[i])) return false;
    }
    return true;
}

// Whether a parsed message can be written back as it was read: no chunked body (serialize writes the
// body as it is), header names and values the parser hands over unchanged (no control characters, no
// surrounding blanks, which the parser trims), HTTP/1.0 or 1.1. libhttp-parser 2.9 takes any header whose
// name starts with "Transfer-Encoding" for one when it refuses a Content-Length beside it, so such a
// message (read until close) is refused once serialize adds the length: left out.
template <typename Message>
bool reserializable(const Message& m) {
    if (m.version_minor > 1) return false;
    for (const auto& [n, v] : m.headers) {
        if (n.empty()) return false;
        auto plain = [](std::string_view s) {
            return std::all_of(s.begin(), s.end(), [](char c) {
                auto u = static_cast<unsigned char>(c);
                return u >= 0x21 && u != 0x7f && c != ':';
            });
        };
        if (!plain(n)) return false;
        if (n.size() >= 17 && cg::iequals(std::string_view(n).substr(0, 17), "transfer-encoding"))
            return false;
        for (char c : v) {
            auto u = static_cast<unsigned char>(c);
            if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
        }
        if (!v.empty() && (v.front() == ' ' || v.front() == '\t' || v.back() == ' ' || v.back() == '\t'))
            return false;
    }
    return !m.headers.has("Transfer-Encoding");
}

}  // namespace fuzz_http
