#include "support/prom_text.hpp"

#include <cmath>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace cg::test {
namespace {

std::runtime_error bad(int line, const std::string& what) {
    return std::runtime_error("metrics line " + std::to_string(line) + ": " + what);
}

std::string base_name(const std::string& sample, const std::map<std::string, prom_family>& fams) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        std::string s(suffix);
        if (sample.size() > s.size() && sample.ends_with(s)) {
            auto base = sample.substr(0, sample.size() - s.size());
            if (fams.count(base)) return base;
        }
    }
    return sample;
}

double parse_value(const std::string& v, int line) {
    if (v == "+Inf") return INFINITY;
    if (v == "-Inf") return -INFINITY;
    if (v == "NaN") return NAN;
    std::size_t used = 0;
    double d = 0;
    try {
        d = std::stod(v, &used);
    } catch (const std::logic_error&) {
        used = 0;
    }
    if (used == 0 || used != v.size()) throw bad(line, "bad value '" + v + "'");
    return d;
}

}  // namespace

std::map<std::string, prom_family> parse_prometheus(const std::string& text) {
    static const std::regex help_re(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
    static const std::regex type_re(
        R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
    static const std::regex sample_re(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?[0-9]+)?)");
    static const std::regex label_re(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?)re");
    std::map<std::string, prom_family> fams;
    std::istringstream in(text);
    std::string l;
    int n = 0;
    while (std::getline(in, l)) {
        ++n;
        if (l.empty()) continue;
        std::smatch m;
        if (std::regex_match(l, m, help_re)) {
            fams[m[1]].name = m[1];
            fams[m[1]].help = m[2];
        } else if (std::regex_match(l, m, type_re)) {
            fams[m[1]].name = m[1];
            fams[m[1]].type = m[2];
        } else if (l[0] == '#') {
            continue;
        } else if (std::regex_match(l, m, sample_re)) {
            prom_sample s;
            s.name = m[1];
            std::string labels = m[3];
            for (std::sregex_iterator it(labels.begin(), labels.end(), label_re), end; it != end; ++it)
                s.labels[(*it)[1]] = (*it)[2];
            s.value = parse_value(m[4], n);
            auto base = base_name(s.name, fams);
            auto f = fams.find(base);
            if (f == fams.end() || f->second.type.empty()) throw bad(n, "sample before TYPE: " + l);
            f->second.samples.push_back(std::move(s));
        } else {
            throw bad(n, "unparsable: " + l);
        }
    }
    for (auto& [name, f] : fams) {
        if (f.type != "histogram") continue;
        // Group buckets by their non-le labels and check they are cumulative and end in +Inf == _count.
        std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> series;
        std::map<std::map<std::string, std::string>, double> counts;
        for (const auto& s : f.samples) {
            auto key = s.labels;
            key.erase("le");
            if (s.name == name + "_bucket") {
                if (!s.labels.count("le")) throw std::runtime_error(name + ": bucket without le");
                series[key].emplace_back(parse_value(s.labels.at("le"), 0), s.value);
            } else if (s.name == name + "_count") {
                counts[key] = s.value;
            }
        }
        for (auto& [key, buckets] : series) {
            double prev_le = -INFINITY, prev = 0;
            for (auto [le, c] : buckets) {
                if (le <= prev_le) throw std::runtime_error(name + ": buckets not in increasing le order");
                if (c < prev) throw std::runtime_error(name + ": buckets not cumulative");
                prev_le = le;
                prev = c;
            }
            if (!std::isinf(prev_le)) throw std::runtime_error(name + ": no +Inf bucket");
            if (!counts.count(key) || counts[key] != prev)
                throw std::runtime_error(name + ": _count != +Inf bucket");
        }
    }
    return fams;
}

double bucket_count(const prom_family& f, const std::string& le,
                    const std::map<std::string, std::string>& labels) {
    for (const auto& s : f.samples) {
        if (s.name != f.name + "_bucket") continue;
        auto key = s.labels;
        auto it = key.find("le");
        if (it == key.end() || it->second != le) continue;
        key.erase("le");
        if (key == labels) return s.value;
    }
    throw std::runtime_error(f.name + ": no bucket le=" + le);
}

}  // namespace cg::test
