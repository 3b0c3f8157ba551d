#include "lab/report.hpp"

#include <cstdio>

namespace cg::lab {

namespace {
std::string json_string(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
            continue;
        }
        o += c;
    }
    return o + "\"";
}
}  // namespace

std::string render_table(const std::vector<row>& rows) {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "%-20s %-7s %10s %12s %8s %10s %10s %14s %12s\n", "scenario", "variant",
                  "deliveries", "stripe POSTs", "charges", "duplicates", "uncharged", "nsqd timeouts",
                  "E_FIN_FAILED");
    out += line;
    out += std::string(110, '-') + "\n";
    for (const auto& r : rows) {
        std::snprintf(line, sizeof line, "%-20s %-7s %10llu %12llu %8llu %10llu %10llu %14llu %12llu\n",
                      r.scenario.c_str(), r.variant.c_str(), static_cast<unsigned long long>(r.deliveries),
                      static_cast<unsigned long long>(r.stripe_posts),
                      static_cast<unsigned long long>(r.charges_created),
                      static_cast<unsigned long long>(r.duplicate_charges),
                      static_cast<unsigned long long>(r.customers_uncharged),
                      static_cast<unsigned long long>(r.nsqd_timeouts),
                      static_cast<unsigned long long>(r.fin_failed));
        out += line;
    }
    return out;
}

std::string render_json(const std::vector<row>& rows) {
    std::string out = "[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        out += i ? ",\n " : "\n ";
        out += "{\"scenario\":" + json_string(r.scenario) + ",\"variant\":" + json_string(r.variant) +
               ",\"deliveries\":" + std::to_string(r.deliveries) +
               ",\"stripe_posts\":" + std::to_string(r.stripe_posts) +
               ",\"charges_created\":" + std::to_string(r.charges_created) +
               ",\"duplicate_charges\":" + std::to_string(r.duplicate_charges) +
               ",\"customers_uncharged\":" + std::to_string(r.customers_uncharged) +
               ",\"nsqd_timeouts\":" + std::to_string(r.nsqd_timeouts) +
               ",\"e_fin_failed\":" + std::to_string(r.fin_failed) + "}";
    }
    return out + "\n]\n";
}

}  // namespace cg::lab
