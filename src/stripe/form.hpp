// application/x-www-form-urlencoded bodies with Stripe's bracket nesting. Pure.
//   {"amount": "100", "metadata": {"billing_key": "k"}, "expand": ["charges"]}
//   → amount=100&metadata[billing_key]=k&expand[]=charges
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/result.hpp"

namespace cg::stripe {

struct form_value;
using form_map = std::vector<std::pair<std::string, form_value>>;  // keeps insertion order
using form_list = std::vector<form_value>;

struct form_value {
    std::variant<std::string, form_map, form_list> v;
    form_value(std::string s) : v(std::move(s)) {}
    form_value(const char* s) : v(std::string(s)) {}
    form_value(form_map m) : v(std::move(m)) {}
    form_value(form_list l) : v(std::move(l)) {}
};

// Encodes `fields` in order. Names and values are percent-encoded (RFC 3986 unreserved kept); the
// brackets that express nesting are written literally, as Stripe's SDKs do. Lists of strings use
// `key[]`, lists of maps use indices `key[0][sub]`.
std::string encode_form(const form_map& fields);

using form_pairs = std::vector<std::pair<std::string, std::string>>;
// Decodes a body into flat pairs in order ("metadata[k]" stays one name). Fails on a bad escape.
result<form_pairs> decode_form(std::string_view body);

}  // namespace cg::stripe
