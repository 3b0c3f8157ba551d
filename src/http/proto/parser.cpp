#include "http/proto/parser.hpp"

#include <http_parser.h>

#include "core/error.hpp"

namespace cg::http {

namespace {
const char* describe(int v) noexcept {
    switch (static_cast<errc>(v)) {
        case errc::ok:
            return "ok";
        case errc::bad_message:
            return "malformed HTTP message";
        case errc::header_too_large:
            return "header section too large";
        case errc::body_too_large:
            return "body too large";
        case errc::unsupported:
            return "unsupported HTTP feature";
        case errc::connection_closed:
            return "connection closed";
        case errc::timeout:
            return "HTTP timeout";
        case errc::pool_exhausted:
            return "HTTP connection pool exhausted";
    }
    return "unknown http error";
}
}  // namespace

const std::error_category& category() noexcept {
    static const simple_category cat("chargeguard.http", describe);
    return cat;
}

int status_for(errc e) noexcept {
    switch (e) {
        case errc::header_too_large:
            return 431;
        case errc::body_too_large:
            return 413;
        case errc::unsupported:
            return 501;
        default:
            return 400;
    }
}

namespace detail {

struct parser_impl {
    http_parser p{};
    http_parser_settings settings{};
    parse_limits limits;
    parse_state state = parse_state::need_more;
    errc err = errc::ok;
    std::string detail;
    std::size_t header_bytes = 0;
    bool started = false;
    bool no_body = false;
    bool is_request = true;
    bool head_done = false;    // on_headers_complete accepted the head
    std::string field, value;  // current header being assembled
    bool in_value = false;
    // Message sinks, bound by the owning parser.
    std::string* target = nullptr;  // request target
    http::headers* hdrs = nullptr;
    std::string* body = nullptr;
    std::string* reason = nullptr;

    bool charge_header(std::size_t n) {
        header_bytes += n;
        if (header_bytes > limits.max_header_bytes) {
            err = errc::header_too_large;
            detail = "over " + std::to_string(limits.max_header_bytes) + " bytes";
            return false;
        }
        return true;
    }
    void flush_header() {
        if (!field.empty()) hdrs->add(std::move(field), std::move(value));
        field.clear();
        value.clear();
        in_value = false;
    }
};

}  // namespace detail

namespace {

detail::parser_impl& self(http_parser* p) {
    return *static_cast<detail::parser_impl*>(p->data);
}

int on_message_begin(http_parser* p) {
    self(p).started = true;
    return 0;
}

int on_url(http_parser* p, const char* at, std::size_t n) {
    auto& s = self(p);
    if (!s.charge_header(n)) return 1;
    if (s.target) s.target->append(at, n);
    return 0;
}

int on_status(http_parser* p, const char* at, std::size_t n) {
    auto& s = self(p);
    if (!s.charge_header(n)) return 1;
    if (s.reason) s.reason->append(at, n);
    return 0;
}

int on_header_field(http_parser* p, const char* at, std::size_t n) {
    auto& s = self(p);
    // ": " and CRLF count too, once per header: a name split across reads arrives in pieces.
    bool new_field = s.in_value || s.field.empty();
    if (!s.charge_header(new_field ? n + 4 : n)) return 1;
    if (s.in_value) s.flush_header();
    s.field.append(at, n);
    return 0;
}

int on_header_value(http_parser* p, const char* at, std::size_t n) {
    auto& s = self(p);
    if (!s.charge_header(n)) return 1;
    s.in_value = true;
    s.value.append(at, n);
    return 0;
}

int on_headers_complete(http_parser* p) {
    auto& s = self(p);
    s.flush_header();
    if (p->upgrade && s.is_request) {
        s.err = errc::unsupported;
        s.detail = "protocol upgrade";
        return -1;  // abort: the parser reports HPE_CB_headers_complete
    }
    // libhttp-parser takes a status of one or two digits; RFC 9112 says three.
    if (!s.is_request && p->status_code < 100) {
        s.err = errc::bad_message;
        s.detail = "status code " + std::to_string(p->status_code) + " is not three digits";
        return -1;
    }
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > s.limits.max_body_bytes) {
        s.err = errc::body_too_large;
        s.detail = "Content-Length " + std::to_string(p->content_length) + " over " +
                   std::to_string(s.limits.max_body_bytes);
        return -1;
    }
    s.head_done = true;
    if (!s.is_request && s.no_body) return 1;  // response to HEAD: skip the body
    return 0;
}

int on_body(http_parser* p, const char* at, std::size_t n) {
    auto& s = self(p);
    if (s.body->size() + n > s.limits.max_body_bytes) {
        s.err = errc::body_too_large;
        s.detail = "body over " + std::to_string(s.limits.max_body_bytes) + " bytes";
        return 1;
    }
    s.body->append(at, n);
    return 0;
}

int on_message_complete(http_parser* p) {
    auto& s = self(p);
    s.state = parse_state::done;
    http_parser_pause(p, 1);  // stop here: bytes after this message belong to the next one
    return 0;
}

void fail(detail::parser_impl& s) {
    s.state = parse_state::failed;
    if (s.err == errc::ok) {
        auto e = HTTP_PARSER_ERRNO(&s.p);
        s.err = errc::bad_message;
        s.detail = std::string(http_errno_name(e)) + ": " + http_errno_description(e);
    }
}

}  // namespace

template <typename Message>
basic_parser<Message>::basic_parser(parse_limits limits) : impl_(std::make_unique<detail::parser_impl>()) {
    impl_->limits = limits;
    impl_->is_request = std::is_same_v<Message, request>;
    http_parser_settings_init(&impl_->settings);
    auto& st = impl_->settings;
    st.on_message_begin = on_message_begin;
    st.on_url = on_url;
    st.on_status = on_status;
    st.on_header_field = on_header_field;
    st.on_header_value = on_header_value;
    st.on_headers_complete = on_headers_complete;
    st.on_body = on_body;
    st.on_message_complete = on_message_complete;
    reset();
}

template <typename Message>
basic_parser<Message>::~basic_parser() = default;
template <typename Message>
basic_parser<Message>::basic_parser(basic_parser&& o) noexcept
    : impl_(std::move(o.impl_)), msg_(std::move(o.msg_)) {
    if (impl_) reset();
}
template <typename Message>
basic_parser<Message>& basic_parser<Message>::operator=(basic_parser&& o) noexcept {
    impl_ = std::move(o.impl_);
    msg_ = std::move(o.msg_);
    if (impl_) reset();
    return *this;
}

template <typename Message>
void basic_parser<Message>::reset() {
    auto& s = *impl_;
    http_parser_init(&s.p, s.is_request ? HTTP_REQUEST : HTTP_RESPONSE);
    s.p.data = impl_.get();
    s.state = parse_state::need_more;
    s.err = errc::ok;
    s.detail.clear();
    s.header_bytes = 0;
    s.started = false;
    s.head_done = false;
    s.field.clear();
    s.value.clear();
    s.in_value = false;
    msg_ = Message{};
    s.hdrs = &msg_.headers;
    s.body = &msg_.body;
    if constexpr (std::is_same_v<Message, request>) {
        msg_.target.clear();
        s.target = &msg_.target;
        s.reason = nullptr;
    } else {
        s.target = nullptr;
        s.reason = &msg_.reason;
    }
}

template <typename Message>
std::size_t basic_parser<Message>::feed(std::string_view data) {
    auto& s = *impl_;
    if (s.state != parse_state::need_more || data.empty()) return 0;
    std::size_t n = http_parser_execute(&s.p, &s.settings, data.data(), data.size());
    auto e = HTTP_PARSER_ERRNO(&s.p);
    if (s.state == parse_state::done) {
        if constexpr (std::is_same_v<Message, request>) {
            msg_.method = http_method_str(static_cast<http_method>(s.p.method));
        } else {
            msg_.status = static_cast<int>(s.p.status_code);
        }
        msg_.version_minor = s.p.http_minor;
        return n;
    }
    if (e != HPE_OK) fail(s);
    return n;
}

template <typename Message>
void basic_parser<Message>::feed_eof() {
    auto& s = *impl_;
    if (s.state != parse_state::need_more) return;
    http_parser_execute(&s.p, &s.settings, nullptr, 0);
    if (s.state == parse_state::done) {
        if constexpr (!std::is_same_v<Message, request>) msg_.status = static_cast<int>(s.p.status_code);
        msg_.version_minor = s.p.http_minor;
        return;
    }
    s.state = parse_state::failed;
    if (s.err == errc::ok) {
        s.err = errc::connection_closed;
        s.detail = s.started ? "peer closed mid-message" : "peer closed";
    }
}

template <typename Message>
std::size_t basic_parser<Message>::body_left_unfed() {
    auto& s = *impl_;
    if constexpr (!std::is_same_v<Message, request>) {
        return 0;
    } else {
        if (s.state != parse_state::need_more || !s.head_done || !s.body->empty()) return 0;
        if (!(s.p.flags & F_CONTENTLENGTH) || (s.p.flags & F_CHUNKED) || s.p.content_length == 0) return 0;
        msg_.method = http_method_str(static_cast<http_method>(s.p.method));
        msg_.version_minor = s.p.http_minor;
        return static_cast<std::size_t>(s.p.content_length);
    }
}

template <typename Message>
parse_state basic_parser<Message>::state() const noexcept {
    return impl_->state;
}
template <typename Message>
errc basic_parser<Message>::error() const noexcept {
    return impl_->err;
}
template <typename Message>
const std::string& basic_parser<Message>::error_detail() const noexcept {
    return impl_->detail;
}
template <typename Message>
bool basic_parser<Message>::started() const noexcept {
    return impl_->started;
}
template <typename Message>
Message& basic_parser<Message>::message() noexcept {
    return msg_;
}
template <typename Message>
void basic_parser<Message>::expect_no_body(bool v) noexcept {
    impl_->no_body = v;
}

template class basic_parser<request>;
template class basic_parser<response>;

}  // namespace cg::http
