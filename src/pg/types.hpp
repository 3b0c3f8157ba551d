// Text encodings of the PostgreSQL types chargeguard uses (int8, bool, text, timestamptz, bytea).
// Pure functions: params.cpp encodes with them, rows.cpp decodes with them, unit tests cover them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/bytes.hpp"

namespace cg::pg {

// timestamptz at PostgreSQL's precision (microseconds), always UTC.
using timestamp = std::chrono::sys_time<std::chrono::microseconds>;

// Type OIDs (pg_type.dat); stable across PostgreSQL versions.
namespace oid {
inline constexpr unsigned bool_ = 16, bytea = 17, name = 19, int8 = 20, int2 = 21, int4 = 23, text = 25,
                          oid = 26, varchar = 1043, bpchar = 1042, timestamptz = 1184, unknown = 0;
}

std::optional<std::int64_t> parse_int64(std::string_view s) noexcept;
std::optional<bool> parse_bool(std::string_view s) noexcept;  // "t" / "f" (also true/false)
// ISO output ("2024-01-02 03:04:05.123456+00", any offset "+05:30", optional fraction). The
// connection forces DateStyle=ISO and TimeZone=UTC, so other styles are rejected.
std::optional<timestamp> parse_timestamptz(std::string_view s) noexcept;
// bytea hex output "\x0a0b" (the connection forces bytea_output=hex).
std::optional<bytes> parse_bytea_hex(std::string_view s);

// "2024-01-02 03:04:05.123456+00" (years 1..9999).
std::string format_timestamptz(timestamp t);

}  // namespace cg::pg
