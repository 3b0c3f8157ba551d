#include "pg/types.hpp"

#include <charconv>
#include <cstdio>

namespace cg::pg {
namespace {

// Reads exactly `n` digits at `s[pos]`.
bool digits(std::string_view s, std::size_t& pos, std::size_t n, int& out) noexcept {
    if (pos + n > s.size()) return false;
    int v = 0;
    for (std::size_t i = 0; i < n; ++i) {
        char c = s[pos + i];
        if (c < '0' || c > '9') return false;
        v = v * 10 + (c - '0');
    }
    pos += n;
    out = v;
    return true;
}

bool expect(std::string_view s, std::size_t& pos, char c) noexcept {
    if (pos >= s.size() || s[pos] != c) return false;
    ++pos;
    return true;
}

// Parses "+HH", "+HH:MM" or "+HH:MM:SS" into seconds east of UTC.
bool parse_offset(std::string_view s, std::size_t& pos, int& offset_s) noexcept {
    if (pos >= s.size() || (s[pos] != '+' && s[pos] != '-')) return false;
    int sign = s[pos] == '-' ? -1 : 1;
    ++pos;
    int h = 0, m = 0, sec = 0;
    if (!digits(s, pos, 2, h)) return false;
    if (pos < s.size() && s[pos] == ':') {
        ++pos;
        if (!digits(s, pos, 2, m)) return false;
        if (pos < s.size() && s[pos] == ':') {
            ++pos;
            if (!digits(s, pos, 2, sec)) return false;
        }
    }
    offset_s = sign * (h * 3600 + m * 60 + sec);
    return true;
}

}  // namespace

std::optional<std::int64_t> parse_int64(std::string_view s) noexcept {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
    return v;
}

std::optional<bool> parse_bool(std::string_view s) noexcept {
    if (s == "t" || s == "true") return true;
    if (s == "f" || s == "false") return false;
    return std::nullopt;
}

std::optional<timestamp> parse_timestamptz(std::string_view s) noexcept {
    using namespace std::chrono;
    std::size_t pos = 0;
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
    if (!digits(s, pos, 4, y) || !expect(s, pos, '-') || !digits(s, pos, 2, mo) || !expect(s, pos, '-') ||
        !digits(s, pos, 2, d) || !expect(s, pos, ' ') || !digits(s, pos, 2, h) || !expect(s, pos, ':') ||
        !digits(s, pos, 2, mi) || !expect(s, pos, ':') || !digits(s, pos, 2, sec))
        return std::nullopt;
    std::int64_t micros = 0;
    if (pos < s.size() && s[pos] == '.') {
        ++pos;
        int n = 0;
        while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
            if (n >= 6) return std::nullopt;  // PostgreSQL never prints more than 6
            micros = micros * 10 + (s[pos] - '0');
            ++pos;
            ++n;
        }
        if (n == 0) return std::nullopt;
        for (; n < 6; ++n) micros *= 10;
    }
    int offset_s = 0;
    if (!parse_offset(s, pos, offset_s) || pos != s.size()) return std::nullopt;
    year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)}, day{static_cast<unsigned>(d)}};
    if (!ymd.ok() || h > 23 || mi > 59 || sec > 60) return std::nullopt;
    auto t = sys_days(ymd) + hours(h) + minutes(mi) + seconds(sec) + microseconds(micros) - seconds(offset_s);
    return time_point_cast<microseconds>(t);
}

std::optional<bytes> parse_bytea_hex(std::string_view s) {
    if (s.size() < 2 || s[0] != '\\' || s[1] != 'x') return std::nullopt;
    return from_hex(s.substr(2));
}

std::string format_timestamptz(timestamp t) {
    using namespace std::chrono;
    auto day_point = floor<days>(t);
    year_month_day ymd(day_point);
    auto rest = t - day_point;  // microseconds within the day
    auto h = duration_cast<hours>(rest);
    auto mi = duration_cast<minutes>(rest - h);
    auto sec = duration_cast<seconds>(rest - h - mi);
    auto us = rest - h - mi - sec;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%04d-%02u-%02u %02d:%02d:%02d.%06lld+00", static_cast<int>(ymd.year()),
                  static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                  static_cast<int>(h.count()), static_cast<int>(mi.count()), static_cast<int>(sec.count()),
                  static_cast<long long>(us.count()));
    return buf;
}

}  // namespace cg::pg
