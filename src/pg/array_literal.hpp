// PostgreSQL array literals for `$n::text[]` / `$n::int8[]` parameters: {"a","b\"c",NULL}. The one encoder
// of the code base: every text element is quoted (backslash and double quote escaped), so no element can
// read as NULL or split in two; an absent optional is NULL. Pure.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace cg::pg {

std::string text_array_literal(std::span<const std::optional<std::string>> values);
std::string text_array_literal(std::span<const std::string> values);
// The same from views (a batch's columns read in place from its requests, no copy per element).
std::string text_array_literal(std::span<const std::optional<std::string_view>> values);
std::string text_array_literal(std::span<const std::string_view> values);
std::string int_array_literal(std::span<const std::int64_t> values);
std::string int_array_literal(std::span<const std::optional<std::int64_t>> values);

}  // namespace cg::pg
