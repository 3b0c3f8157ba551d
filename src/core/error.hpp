// Error vocabulary shared by every module: std::error_code categories plus a message.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <system_error>

namespace cg {

// Errors of the core module itself (parsing helpers, configuration).
enum class core_errc {
    ok = 0,
    invalid_argument,
    parse_error,
    out_of_range,
    not_found,
    io_error,
};

const std::error_category& core_category() noexcept;

inline std::error_code make_error_code(core_errc e) noexcept {
    return {static_cast<int>(e), core_category()};
}

// An error code plus a human-readable diagnostic. The message never carries secrets.
struct error {
    std::error_code code;
    std::string message;

    error() = default;
    error(std::error_code c, std::string m = {}) : code(c), message(std::move(m)) {}
    template <typename E>
    requires std::is_error_code_enum_v<E> error(E e, std::string m = {})
        : code(make_error_code(e)), message(std::move(m)) {}

    explicit operator bool() const noexcept { return static_cast<bool>(code); }
    // "category: code message; detail" — suitable for logs and operator-facing errors.
    std::string describe() const;
};

// Defines a category from a name and a function mapping values to messages, so each module's
// errc needs only an enum and a table.
class simple_category : public std::error_category {
  public:
    using describe_fn = const char* (*)(int) noexcept;
    constexpr simple_category(const char* name, describe_fn fn) noexcept : name_(name), fn_(fn) {}
    const char* name() const noexcept override { return name_; }
    std::string message(int v) const override { return fn_(v); }

  private:
    const char* name_;
    describe_fn fn_;
};

// What a failed background task threw, for the log line of the completion handler that restarts it or
// stops loudly (docs/contributing.md "Errors": never an empty completion).
std::string describe_exception(std::exception_ptr ep);

}  // namespace cg

template <>
struct std::is_error_code_enum<cg::core_errc> : std::true_type {};
