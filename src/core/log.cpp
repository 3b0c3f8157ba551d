#include "core/log.hpp"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>

namespace cg {
namespace {

void append_value(std::string& out, const log_field::value_type& v) {
    char buf[64];
    std::visit(
        [&](const auto& x) {
            using X = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<X, std::string_view>) {
                append_json_string(out, x);
            } else if constexpr (std::is_same_v<X, bool>) {
                out += x ? "true" : "false";
            } else if constexpr (std::is_same_v<X, double>) {
                if (!std::isfinite(x)) {
                    out += "null";
                    return;
                }
                auto r = std::to_chars(buf, buf + sizeof buf, x);
                out.append(buf, r.ptr);
            } else {
                auto r = std::to_chars(buf, buf + sizeof buf, x);
                out.append(buf, r.ptr);
            }
        },
        v);
}

void append_fields(std::string& out, std::span<const log_field> fields) {
    for (const auto& f : fields) {
        out += ',';
        append_json_string(out, f.key);
        out += ':';
        append_value(out, f.value);
    }
}

void append_time(std::string& out) {
    auto now = std::chrono::system_clock::now();
    auto secs = std::chrono::system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[40];
    std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    out.append(buf, n);
    char msbuf[8];
    std::snprintf(msbuf, sizeof msbuf, ".%03dZ", static_cast<int>(ms));
    out += msbuf;
}

// Length of a valid UTF-8 sequence starting at s[i], or 0 if invalid.
std::size_t utf8_len(std::string_view s, std::size_t i) {
    auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return 0;
    for (std::size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
    return n;
}

}  // namespace

std::optional<log_level> parse_log_level(std::string_view s) noexcept {
    if (s == "debug") return log_level::debug;
    if (s == "info") return log_level::info;
    if (s == "warn" || s == "warning") return log_level::warn;
    if (s == "error") return log_level::error;
    if (s == "off") return log_level::off;
    return std::nullopt;
}

std::string_view to_string(log_level l) noexcept {
    switch (l) {
        case log_level::debug:
            return "debug";
        case log_level::info:
            return "info";
        case log_level::warn:
            return "warn";
        case log_level::error:
            return "error";
        case log_level::off:
            return "off";
    }
    return "?";
}

void append_json_string(std::string& out, std::string_view s) {
    out += '"';
    for (std::size_t i = 0; i < s.size();) {
        char c = s[i];
        auto uc = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += c;
            ++i;
        } else if (c == '\n') {
            out += "\\n", ++i;
        } else if (c == '\r') {
            out += "\\r", ++i;
        } else if (c == '\t') {
            out += "\\t", ++i;
        } else if (uc < 0x20 || uc == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", uc);
            out += buf;
            ++i;
        } else if (uc < 0x80) {
            out += c;
            ++i;
        } else if (std::size_t n = utf8_len(s, i); n > 0) {
            out.append(s.substr(i, n));
            i += n;
        } else {
            out += "\\ufffd";  // invalid byte: replaced so the line stays valid JSON
            ++i;
        }
    }
    out += '"';
}

void fd_sink::write(std::string_view line) {
    std::lock_guard lock(mu_);
    while (!line.empty()) {
        ssize_t n = ::write(fd_, line.data(), line.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return;  // nowhere left to report a logging failure
        }
        line.remove_prefix(static_cast<std::size_t>(n));
    }
}

namespace {

// The whole of `s` to `fd`, blocking (the writer thread's job); false once the descriptor fails.
bool write_all(int fd, std::string_view s) {
    while (!s.empty()) {
        ssize_t n = ::write(fd, s.data(), s.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        s.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
}

}  // namespace

async_fd_sink::async_fd_sink(int fd, std::size_t capacity)
    : fd_(fd), capacity_(capacity), writer_([this] { run(); }) {}

async_fd_sink::~async_fd_sink() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    wake_.notify_one();
    writer_.join();
}

void async_fd_sink::write(std::string_view line) {
    {
        std::lock_guard lock(mu_);
        if (pending_.size() + line.size() > capacity_) {
            if (unreported_++ == 0) drop_at_ = pending_.size();
            ++dropped_;
            return;
        }
        pending_.append(line);
    }
    wake_.notify_one();
}

void async_fd_sink::flush() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return (pending_.empty() && !writing_) || stop_; });
}

std::uint64_t async_fd_sink::dropped() const {
    std::lock_guard lock(mu_);
    return dropped_;
}

void async_fd_sink::run() {
    std::string batch;
    bool broken = false;  // the descriptor failed: nowhere left to write, keep draining so nobody waits
    std::unique_lock lock(mu_);
    for (;;) {
        wake_.wait(lock, [this] { return !pending_.empty() || unreported_ > 0 || stop_; });
        if (pending_.empty() && unreported_ == 0) break;  // stop_, and everything is written
        batch.clear();
        if (unreported_ > 0) {
            // The notice goes where the lost lines would have been: after the lines accepted before the
            // first of them, before the lines accepted since.
            std::string notice = "{\"time\":\"";
            append_time(notice);
            notice +=
                "\",\"level\":\"warn\",\"msg\":\"log lines dropped: the log reader did not keep up\","
                "\"dropped\":" +
                std::to_string(unreported_) + "}\n";
            unreported_ = 0;
            batch.assign(pending_, 0, drop_at_);
            batch += notice;
            batch.append(pending_, drop_at_);
        } else {
            batch.swap(pending_);
        }
        pending_.clear();
        writing_ = true;
        lock.unlock();
        if (!broken) broken = !write_all(fd_, batch);
        lock.lock();
        writing_ = false;
        if (pending_.empty()) idle_.notify_all();
    }
    idle_.notify_all();
}

void memory_sink::write(std::string_view line) {
    std::lock_guard lock(mu_);
    lines_.emplace_back(line);
}

std::vector<std::string> memory_sink::lines() const {
    std::lock_guard lock(mu_);
    return lines_;
}

bool memory_sink::contains(std::string_view needle) const {
    std::lock_guard lock(mu_);
    for (const auto& l : lines_)
        if (l.find(needle) != std::string::npos) return true;
    return false;
}

logger::logger() = default;

logger::logger(std::shared_ptr<log_sink> sink, log_level level) : sink_(std::move(sink)), level_(level) {}

logger logger::with(std::span<const log_field> fields) const {
    logger child = *this;
    append_fields(child.context_, fields);
    return child;
}

void logger::log(log_level l, std::string_view msg, std::span<const log_field> fields) const {
    if (!enabled(l)) return;
    std::string line;
    line.reserve(96 + msg.size() + context_.size());
    line += "{\"time\":\"";
    append_time(line);
    line += "\",\"level\":\"";
    line += to_string(l);
    line += "\",\"msg\":";
    append_json_string(line, msg);
    line += context_;
    append_fields(line, fields);
    line += "}\n";
    sink_->write(line);
}

}  // namespace cg
