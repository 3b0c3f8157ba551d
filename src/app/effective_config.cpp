#include "app/effective_config.hpp"

#include <charconv>
#include <cmath>
#include <type_traits>

namespace cg::app {

effective_config& effective_config::add(std::string key, value v) {
    settings_.push_back({std::move(key), std::move(v), false});
    return *this;
}

effective_config& effective_config::add_address(std::string key, std::string v) {
    settings_.push_back({std::move(key), value(std::move(v)), true});
    return *this;
}

effective_config& effective_config::add_address(std::string key, const std::vector<std::string>& v) {
    std::string joined;
    for (const auto& a : v) joined += (joined.empty() ? "" : ",") + a;
    return add_address(std::move(key), std::move(joined));
}

std::vector<log_field> effective_config::fields() const {
    std::vector<log_field> out;
    out.reserve(settings_.size());
    for (const auto& s : settings_)
        std::visit([&out, &s](const auto& x) { out.emplace_back(s.key, x); }, s.v);
    return out;
}

void effective_config::log(const logger& log, std::string_view msg) const {
    auto f = fields();
    log.log(log_level::info, msg, f);
}

std::string effective_config::json(bool redact_addresses) const {
    std::string out = "{\"command\":";
    append_json_string(out, command_);
    out += ",\"settings\":{";
    bool first = true;
    for (const auto& s : settings_) {
        if (!first) out += ',';
        first = false;
        append_json_string(out, s.key);
        out += ':';
        if (s.address && redact_addresses) {
            out += "\"(redacted)\"";
            continue;
        }
        std::visit(
            [&out](const auto& x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<T, std::string>) {
                    append_json_string(out, x);
                } else if constexpr (std::is_same_v<T, bool>) {
                    out += x ? "true" : "false";
                } else if constexpr (std::is_same_v<T, double>) {
                    if (!std::isfinite(x)) {
                        out += "null";
                    } else {
                        char buf[32];
                        auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest exact form
                        out.append(buf, r.ptr);
                    }
                } else {
                    out += std::to_string(x);
                }
            },
            s.v);
    }
    out += "}}\n";
    return out;
}

}  // namespace cg::app
