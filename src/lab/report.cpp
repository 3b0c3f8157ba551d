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
    std::snprintf(line, sizeof line, "%-20s %-22s %10s %12s %8s %10s %10s %14s %12s\n", "scenario", "variant",
                  "deliveries", "stripe POSTs", "charges", "duplicates", "uncharged", "nsqd timeouts",
                  "E_FIN_FAILED");
    out += line;
    out += std::string(125, '-') + "\n";
    for (const auto& r : rows) {
        std::snprintf(line, sizeof line, "%-20s %-22s %10llu %12llu %8llu %10llu %10llu %14llu %12llu\n",
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

std::string variant_label(const std::string& base, const std::optional<row::vault_figures>& v) {
    if (!v) return base;
    return base + "+cap " + std::to_string(v->charged_cents) + "/" + std::to_string(v->cap_cents);
}

std::string render_vault_notes(const std::vector<row>& rows) {
    std::string out;
    char line[512];
    for (const auto& r : rows) {
        if (!r.vault) continue;
        const auto& v = *r.vault;
        auto pct = [](std::int64_t a, std::int64_t b) { return b > 0 ? 100.0 * double(a) / double(b) : 0.0; };
        std::snprintf(
            line, sizeof line,
            "%s %s: vault key capped at %lld cents (expected %lld x 1.10); charged %lld cents = %.1f %% "
            "of expected, %.1f %% of the cap; the proxy got %llu creating POSTs: %llu refused with "
            "spend_cap_exceeded (not forwarded), %llu forwarded\n",
            r.scenario.c_str(), r.variant.c_str(), static_cast<long long>(v.cap_cents),
            static_cast<long long>(v.expected_cents), static_cast<long long>(v.charged_cents),
            pct(v.charged_cents, v.expected_cents), pct(v.charged_cents, v.cap_cents),
            static_cast<unsigned long long>(v.posts), static_cast<unsigned long long>(v.refused),
            static_cast<unsigned long long>(v.forwarded));
        out += line;
    }
    return out;
}

}  // namespace cg::lab
