// result<T>: a value or a cg::error, for expected outcomes (docs/contributing.md "Errors").
#pragma once

#include <cassert>
#include <stdexcept>
#include <utility>
#include <variant>

#include "core/error.hpp"

namespace cg {

// Thrown by result::value() when the result holds an error: a broken invariant in the caller.
class bad_result_access : public std::runtime_error {
  public:
    explicit bad_result_access(const error& e) : std::runtime_error(e.describe()), err(e) {}
    error err;
};

template <typename T>
class [[nodiscard]] result {
  public:
    result(T v) : v_(std::in_place_index<0>, std::move(v)) {}
    result(error e) : v_(std::in_place_index<1>, std::move(e)) {}
    template <typename E>
    requires std::is_error_code_enum_v<E> result(E e, std::string msg = {})
        : v_(std::in_place_index<1>, error(e, std::move(msg))) {}

    bool has_value() const noexcept { return v_.index() == 0; }
    explicit operator bool() const noexcept { return has_value(); }

    T& value() & {
        check();
        return std::get<0>(v_);
    }
    const T& value() const& {
        check();
        return std::get<0>(v_);
    }
    T&& value() && {
        check();
        return std::get<0>(std::move(v_));
    }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

    const error& err() const& {
        assert(!has_value());
        return std::get<1>(v_);
    }
    std::error_code code() const noexcept { return has_value() ? std::error_code{} : std::get<1>(v_).code; }

  private:
    void check() const {
        if (!has_value()) throw bad_result_access(std::get<1>(v_));
    }
    std::variant<T, error> v_;
};

// result<void>: success or an error.
template <>
class [[nodiscard]] result<void> {
  public:
    result() = default;
    result(error e) : e_(std::move(e)) {}
    template <typename E>
    requires std::is_error_code_enum_v<E> result(E e, std::string msg = {}) : e_(e, std::move(msg)) {}

    bool has_value() const noexcept { return !e_.code; }
    explicit operator bool() const noexcept { return has_value(); }
    void value() const {
        if (!has_value()) throw bad_result_access(e_);
    }
    const error& err() const& { return e_; }
    std::error_code code() const noexcept { return e_.code; }

  private:
    error e_;
};

}  // namespace cg
