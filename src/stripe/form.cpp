#include "stripe/form.hpp"

#include "http/proto/message.hpp"

namespace cg::stripe {
namespace {

void append_pair(std::string& out, const std::string& name, const std::string& value) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += http::url_encode(value);
}

void encode_value(std::string& out, const std::string& name, const form_value& val) {
    if (auto s = std::get_if<std::string>(&val.v)) {
        append_pair(out, name, *s);
    } else if (auto m = std::get_if<form_map>(&val.v)) {
        for (const auto& [k, v] : *m) encode_value(out, name + "[" + http::url_encode(k) + "]", v);
    } else {
        const auto& l = std::get<form_list>(val.v);
        for (std::size_t i = 0; i < l.size(); ++i) {
            bool scalar = std::holds_alternative<std::string>(l[i].v);
            encode_value(out, name + (scalar ? "[]" : "[" + std::to_string(i) + "]"), l[i]);
        }
    }
}

}  // namespace

std::string encode_form(const form_map& fields) {
    std::string out;
    for (const auto& [k, v] : fields) encode_value(out, http::url_encode(k), v);
    return out;
}

result<form_pairs> decode_form(std::string_view body) {
    form_pairs out;
    while (!body.empty()) {
        auto amp = body.find('&');
        auto part = body.substr(0, amp);
        if (!part.empty()) {
            auto eq = part.find('=');
            auto k = http::url_decode(part.substr(0, eq));
            auto v = eq == std::string_view::npos ? std::optional<std::string>("")
                                                  : http::url_decode(part.substr(eq + 1));
            if (!k || !v) return error(core_errc::parse_error, "bad percent-escape in form body");
            out.emplace_back(std::move(*k), std::move(*v));
        }
        if (amp == std::string_view::npos) break;
        body.remove_prefix(amp + 1);
    }
    return out;
}

}  // namespace cg::stripe
