// The one duration syntax of every time flag and variable (app/cli.hpp): parsing ("250ms", "30s", "1m30s",
// a bare number of seconds), printing, and the option that reads one within bounds.
#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "app/cli.hpp"

namespace cg::app {
namespace {

constexpr const char* not_a_duration = "not a duration (e.g. 250ms, 30s, 1m30s; a bare number is seconds)";

// Microseconds, so that "500us" and "0.0005" keep their precision.
std::optional<std::int64_t> parse_duration_us(std::string_view s) {
    if (s.empty()) return std::nullopt;
    double total_us = 0;
    bool first = true;
    while (!s.empty()) {
        double v = 0;
        auto r = std::from_chars(s.data(), s.data() + s.size(), v);
        if (r.ec != std::errc{} || v < 0 || !std::isfinite(v)) return std::nullopt;
        s.remove_prefix(static_cast<std::size_t>(r.ptr - s.data()));
        if (first && s.empty()) {
            total_us = v * 1e6;  // a bare number: seconds
            break;
        }
        first = false;
        std::size_t n = 0;
        while (n < s.size() && s[n] >= 'a' && s[n] <= 'z') ++n;
        auto unit = s.substr(0, n);
        s.remove_prefix(n);
        double mult;
        if (unit == "us")
            mult = 1;
        else if (unit == "ms")
            mult = 1e3;
        else if (unit == "s")
            mult = 1e6;
        else if (unit == "m")
            mult = 60e6;
        else if (unit == "h")
            mult = 3600e6;
        else
            return std::nullopt;
        total_us += v * mult;
    }
    if (total_us > 1e15) return std::nullopt;
    return static_cast<std::int64_t>(std::llround(total_us));
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view s) {
    auto us = parse_duration_us(s);
    if (!us) return std::nullopt;
    return std::chrono::milliseconds((*us + 500) / 1000);
}

std::chrono::milliseconds duration_flag(const std::string& flag, const std::string& v) {
    auto d = parse_duration(v);
    if (!d) bad_value(flag, v, not_a_duration);
    return *d;
}

std::string format_duration(double seconds) {
    auto us = static_cast<long long>(std::llround(seconds * 1e6));
    if (us == 0) return "0s";
    if (us % 1000000 != 0) {
        if (us % 1000 == 0) return std::to_string(us / 1000) + "ms";
        return std::to_string(us) + "us";
    }
    long long s = us / 1000000;
    std::string out;
    if (s >= 3600) out += std::to_string(s / 3600) + "h", s %= 3600;
    if (s >= 60) out += std::to_string(s / 60) + "m", s %= 60;
    if (s > 0 || out.empty()) out += std::to_string(s) + "s";
    return out;
}

CLI::Option* add_duration_option(CLI::App& cmd, const std::string& name, double& seconds,
                                 const std::string& help, double min_s, double max_s) {
    auto* opt = cmd.add_option(
        name,
        [&seconds, name, min_s, max_s](const CLI::results_t& r) {
            const std::string& v = r.back();
            auto us = parse_duration_us(v);
            if (!us) bad_value(name, v, not_a_duration);
            double s = static_cast<double>(*us) / 1e6;
            if (s < min_s || s > max_s)
                bad_value(name, v,
                          "out of range " + format_duration(min_s) + " .. " + format_duration(max_s));
            seconds = s;
            return true;
        },
        help);
    opt->type_name("DURATION")->default_str(format_duration(seconds));
    return opt;
}

}  // namespace cg::app
