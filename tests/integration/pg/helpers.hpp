// Small helpers for the PostgreSQL integration tests.
#pragma once

#include <stdexcept>
#include <string>

#include "core/result.hpp"

namespace cg::test {

template <typename T>
T must(result<T> r, const char* what) {
    if (!r) throw std::runtime_error(std::string(what) + ": " + r.err().describe());
    return std::move(*r);
}
inline void must(result<void> r, const char* what) {
    if (!r) throw std::runtime_error(std::string(what) + ": " + r.err().describe());
}

}  // namespace cg::test
