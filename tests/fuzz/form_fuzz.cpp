// libFuzzer target for the form encoder (the body of every Stripe request: amounts, customer ids,
// descriptions and metadata taken from billing events) and its decoder: the input describes a nested
// form (maps, lists, strings of any bytes); encoding it and decoding the result gives exactly the
// flattened names and values Stripe's bracket convention defines, in order. The rest of the input, read
// as a form body, decodes without crashing, and re-encoding what it decoded decodes to the same pairs.
// Percent-encoding round-trips any bytes. Built and run by ci/fuzz.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "check.hpp"
#include "http/proto/message.hpp"
#include "stripe/form.hpp"

using namespace cg::stripe;

namespace {

form_value make_value(FuzzedDataProvider& in, int depth);

form_map make_map(FuzzedDataProvider& in, int depth) {
    form_map m;
    auto n = in.ConsumeIntegralInRange<int>(0, 4);
    for (int i = 0; i < n; ++i) {
        auto k = in.ConsumeRandomLengthString(24);
        m.emplace_back(std::move(k), make_value(in, depth + 1));
    }
    return m;
}

form_value make_value(FuzzedDataProvider& in, int depth) {
    int kind = depth >= 3 ? 0 : in.ConsumeIntegralInRange<int>(0, 2);
    if (kind == 0) return form_value(in.ConsumeRandomLengthString(48));
    if (kind == 1) return form_value(make_map(in, depth));
    form_list l;
    auto n = in.ConsumeIntegralInRange<int>(0, 3);
    for (int i = 0; i < n; ++i) l.push_back(make_value(in, depth + 1));
    return form_value(std::move(l));
}

// The pairs Stripe reads from a nested form: map entries as name[key], strings in lists as name[],
// other list items as name[index].
void flatten(const std::string& name, const form_value& v, form_pairs& out) {
    if (auto s = std::get_if<std::string>(&v.v)) {
        out.emplace_back(name, *s);
    } else if (auto m = std::get_if<form_map>(&v.v)) {
        for (const auto& [k, sub] : *m) flatten(name + "[" + k + "]", sub, out);
    } else {
        const auto& l = std::get<form_list>(v.v);
        for (std::size_t i = 0; i < l.size(); ++i) {
            bool scalar = std::holds_alternative<std::string>(l[i].v);
            flatten(name + (scalar ? "[]" : "[" + std::to_string(i) + "]"), l[i], out);
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    auto fields = make_map(in, 0);
    form_pairs expected;
    for (const auto& [k, v] : fields) flatten(k, v, expected);
    auto body = encode_form(fields);
    auto decoded = decode_form(body);
    FUZZ_CHECK(decoded);
    FUZZ_CHECK(*decoded == expected);

    auto rest = in.ConsumeRemainingBytesAsString();
    auto s = cg::http::url_decode(cg::http::url_encode(rest));
    FUZZ_CHECK(s && *s == rest);
    auto pairs = decode_form(rest);
    if (pairs) {
        form_map flat;
        for (const auto& [k, v] : *pairs) flat.emplace_back(k, form_value(v));
        auto again = decode_form(encode_form(flat));
        FUZZ_CHECK(again);
        // Empty parts ("a=1&&b=2") are skipped: the pairs are what survives, in order.
        FUZZ_CHECK(*again == *pairs);
    }
    return 0;
}
