// JSON-lines logger. No global instance: components take a `logger` (cheap to copy) by value.
// Each line: {"time":"…Z","level":"info","msg":"…",<context fields>,<call fields>}.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

namespace cg {

enum class log_level { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

std::optional<log_level> parse_log_level(std::string_view s) noexcept;
std::string_view to_string(log_level l) noexcept;

// One key/value of a log line. Holds views: valid only for the duration of the call.
struct log_field {
    using value_type = std::variant<std::string_view, std::int64_t, std::uint64_t, double, bool>;

    std::string_view key;
    value_type value;

    log_field(std::string_view k, const char* v) : key(k), value(std::string_view(v)) {}
    log_field(std::string_view k, std::string_view v) : key(k), value(v) {}
    log_field(std::string_view k, const std::string& v) : key(k), value(std::string_view(v)) {}
    log_field(std::string_view k, bool v) : key(k), value(v) {}
    log_field(std::string_view k, double v) : key(k), value(v) {}
    template <typename I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool> && std::is_signed_v<I>)
        log_field(std::string_view k, I v)
        : key(k), value(static_cast<std::int64_t>(v)) {}
    template <typename I>
    requires(std::is_integral_v<I> && !std::is_same_v<I, bool> && std::is_unsigned_v<I>)
        log_field(std::string_view k, I v)
        : key(k), value(static_cast<std::uint64_t>(v)) {}
};

// Where finished lines go. Implementations must be safe to call from several threads.
class log_sink {
  public:
    virtual ~log_sink() = default;
    virtual void write(std::string_view line) = 0;  // line includes the trailing '\n'
};

// Writes each line with a single write(2) to a file descriptor (stderr by default).
class fd_sink final : public log_sink {
  public:
    explicit fd_sink(int fd = 2) : fd_(fd) {}
    void write(std::string_view line) override;

  private:
    int fd_;
    std::mutex mu_;
};

// The process's log sink: write() appends the line to a bounded buffer and returns; one writer thread of its
// own writes the buffer to `fd`. A caller — the event loop above all — never waits for the descriptor: a
// log reader that stalls (a full pipe to a container runtime's log driver) would otherwise stop heartbeats,
// TOUCH and lease renewals with it. When `capacity` bytes are waiting, new lines are dropped and counted,
// and the writer reports how many ("log lines dropped") once it can write again. flush() waits until every
// line accepted so far is written; the destructor flushes and stops the writer. A SIGKILL loses what the
// writer had not written yet (normally nothing: it wakes for each line).
class async_fd_sink final : public log_sink {
  public:
    explicit async_fd_sink(int fd = 2, std::size_t capacity = 8u << 20);
    ~async_fd_sink() override;
    async_fd_sink(const async_fd_sink&) = delete;
    async_fd_sink& operator=(const async_fd_sink&) = delete;

    void write(std::string_view line) override;
    void flush();
    std::uint64_t dropped() const;

  private:
    void run();

    int fd_;
    std::size_t capacity_;
    mutable std::mutex mu_;
    std::condition_variable wake_, idle_;
    std::string pending_;
    std::uint64_t dropped_ = 0, unreported_ = 0;
    std::size_t drop_at_ = 0;  // where in pending_ the first unreported drop happened
    bool writing_ = false, stop_ = false;
    std::thread writer_;
};

// Keeps lines in memory; for tests.
class memory_sink final : public log_sink {
  public:
    void write(std::string_view line) override;
    std::vector<std::string> lines() const;
    bool contains(std::string_view needle) const;

  private:
    mutable std::mutex mu_;
    std::vector<std::string> lines_;
};

class logger {
  public:
    // A logger that drops everything.
    logger();
    logger(std::shared_ptr<log_sink> sink, log_level level);

    // A child logger whose lines carry `fields` in addition to this logger's.
    logger with(std::span<const log_field> fields) const;
    logger with(std::initializer_list<log_field> fields) const {
        return with(std::span(fields.begin(), fields.size()));
    }

    bool enabled(log_level l) const noexcept { return sink_ && l >= level_ && level_ != log_level::off; }
    log_level level() const noexcept { return level_; }

    void log(log_level l, std::string_view msg, std::span<const log_field> fields = {}) const;
    void debug(std::string_view m, std::initializer_list<log_field> f = {}) const {
        emit(log_level::debug, m, f);
    }
    void info(std::string_view m, std::initializer_list<log_field> f = {}) const {
        emit(log_level::info, m, f);
    }
    void warn(std::string_view m, std::initializer_list<log_field> f = {}) const {
        emit(log_level::warn, m, f);
    }
    void error(std::string_view m, std::initializer_list<log_field> f = {}) const {
        emit(log_level::error, m, f);
    }

  private:
    void emit(log_level l, std::string_view m, std::initializer_list<log_field> f) const {
        if (enabled(l)) log(l, m, std::span(f.begin(), f.size()));
    }

    std::shared_ptr<log_sink> sink_;
    log_level level_ = log_level::off;
    std::string context_;  // pre-rendered ,"k":v pairs
};

// Appends `s` as a JSON string literal (with quotes), escaping control characters and invalid UTF-8
// bytes so a line is always valid JSON.
void append_json_string(std::string& out, std::string_view s);

}  // namespace cg
