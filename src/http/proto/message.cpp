#include "http/proto/message.hpp"

#include "core/bytes.hpp"

namespace cg::http {
namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

void append_headers(const headers& h, std::string& out) {
    for (const auto& [k, v] : h) {
        out += k;
        out += ": ";
        out += v;
        out += "\r\n";
    }
}

int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

}  // namespace

void headers::set(std::string_view name, std::string value) {
    remove(name);
    items_.emplace_back(std::string(name), std::move(value));
}

void headers::remove(std::string_view name) {
    std::erase_if(items_, [&](const auto& kv) { return iequals(kv.first, name); });
}

std::optional<std::string_view> headers::get(std::string_view name) const {
    for (const auto& [k, v] : items_)
        if (iequals(k, name)) return std::string_view(v);
    return std::nullopt;
}

bool headers::has_token(std::string_view name, std::string_view token) const {
    for (const auto& [k, v] : items_) {
        if (!iequals(k, name)) continue;
        std::string_view rest = v;
        while (!rest.empty()) {
            auto comma = rest.find(',');
            if (iequals(trim(rest.substr(0, comma)), token)) return true;
            if (comma == std::string_view::npos) break;
            rest.remove_prefix(comma + 1);
        }
    }
    return false;
}

std::string_view request::path() const {
    std::string_view t = target;
    return t.substr(0, t.find('?'));
}

std::string_view request::query() const {
    std::string_view t = target;
    auto q = t.find('?');
    return q == std::string_view::npos ? std::string_view{} : t.substr(q + 1);
}

std::optional<std::string> request::peek_body() const {
    if (unread_body == 0) return body;
    auto rest = unread_from->read(unread_body, false);
    if (!rest) return std::nullopt;
    return body + *rest;
}

bool request::take_body() {
    if (unread_body == 0) return true;
    auto rest = unread_from->read(std::exchange(unread_body, 0), true);
    if (!rest) return false;
    if (body.empty())
        body = std::move(*rest);
    else
        body += *rest;
    return true;
}

bool request::keep_alive() const {
    if (headers.has_token("Connection", "close")) return false;
    if (version_minor == 0) return headers.has_token("Connection", "keep-alive");
    return true;
}

bool response::keep_alive() const {
    if (headers.has_token("Connection", "close")) return false;
    if (version_minor == 0) return headers.has_token("Connection", "keep-alive");
    return true;
}

std::string_view reason_phrase(int status) noexcept {
    switch (status) {
        case 100:
            return "Continue";
        case 200:
            return "OK";
        case 201:
            return "Created";
        case 202:
            return "Accepted";
        case 204:
            return "No Content";
        case 301:
            return "Moved Permanently";
        case 302:
            return "Found";
        case 304:
            return "Not Modified";
        case 400:
            return "Bad Request";
        case 401:
            return "Unauthorized";
        case 402:
            return "Payment Required";
        case 403:
            return "Forbidden";
        case 404:
            return "Not Found";
        case 405:
            return "Method Not Allowed";
        case 408:
            return "Request Timeout";
        case 409:
            return "Conflict";
        case 411:
            return "Length Required";
        case 413:
            return "Content Too Large";
        case 414:
            return "URI Too Long";
        case 424:
            return "Failed Dependency";
        case 429:
            return "Too Many Requests";
        case 431:
            return "Request Header Fields Too Large";
        case 500:
            return "Internal Server Error";
        case 501:
            return "Not Implemented";
        case 502:
            return "Bad Gateway";
        case 503:
            return "Service Unavailable";
        case 504:
            return "Gateway Timeout";
        case 505:
            return "HTTP Version Not Supported";
    }
    return "Unknown";
}

void serialize(const request& r, std::string& out) {
    out += r.method;
    out += ' ';
    out += r.target;
    out += r.version_minor == 0 ? " HTTP/1.0\r\n" : " HTTP/1.1\r\n";
    append_headers(r.headers, out);
    if (!r.headers.has("Transfer-Encoding") && !r.headers.has("Content-Length") &&
        (!r.body.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH")) {
        out += "Content-Length: ";
        out += std::to_string(r.body.size());
        out += "\r\n";
    }
    out += "\r\n";
    out += r.body;
}

void serialize(const response& r, std::string& out, bool head_request) {
    out += r.version_minor == 0 ? "HTTP/1.0 " : "HTTP/1.1 ";
    out += std::to_string(r.status);
    out += ' ';
    out += r.reason.empty() ? reason_phrase(r.status) : std::string_view(r.reason);
    out += "\r\n";
    append_headers(r.headers, out);
    bool bodyless = r.status == 204 || r.status == 304 || (r.status >= 100 && r.status < 200);
    if (!bodyless && !r.headers.has("Transfer-Encoding") && !r.headers.has("Content-Length")) {
        out += "Content-Length: ";
        out += std::to_string(r.body.size());
        out += "\r\n";
    }
    out += "\r\n";
    if (!head_request && !bodyless) out += r.body;
}

response make_response(int status, std::string body, std::string_view content_type) {
    response r;
    r.status = status;
    r.body = std::move(body);
    if (!content_type.empty()) r.headers.add("Content-Type", std::string(content_type));
    return r;
}

std::optional<std::string> url_decode(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '+') {
            out += ' ';
        } else if (s[i] == '%') {
            if (i + 2 >= s.size()) return std::nullopt;
            int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0) return std::nullopt;
            out += static_cast<char>(hi << 4 | lo);
            i += 2;
        } else {
            out += s[i];
        }
    }
    return out;
}

std::string url_encode(std::string_view s) {
    static constexpr char digits[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        auto u = static_cast<unsigned char>(c);
        bool unreserved = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') ||
                          c == '-' || c == '.' || c == '_' || c == '~';
        if (unreserved) {
            out += c;
        } else {
            out += '%';
            out += digits[u >> 4];
            out += digits[u & 0xf];
        }
    }
    return out;
}

std::optional<std::string> query_param(std::string_view query, std::string_view key) {
    while (!query.empty()) {
        auto amp = query.find('&');
        auto part = query.substr(0, amp);
        auto eq = part.find('=');
        auto k = url_decode(part.substr(0, eq));
        if (k && *k == key)
            return eq == std::string_view::npos ? std::string() : url_decode(part.substr(eq + 1));
        if (amp == std::string_view::npos) break;
        query.remove_prefix(amp + 1);
    }
    return std::nullopt;
}

}  // namespace cg::http
