#include "lab/keys.hpp"

#include <array>
#include <cstdio>
#include <random>

#include "billing/machine/key.hpp"
#include "core/enum_names.hpp"

namespace cg::lab {

namespace {

constexpr enum_names<key_policy, 6> key_policy_names({{
    {key_policy::content, "content"},
    {key_policy::attempts, "attempts"},
    {key_policy::connection, "connection"},
    {key_policy::nsqd_address, "nsqd_address"},
    {key_policy::call_time, "call_time"},
    {key_policy::message_id, "message_id"},
}});

}  // namespace

std::string_view to_string(key_policy p) noexcept {
    return key_policy_names.name(p);
}

std::optional<key_policy> parse_key_policy(std::string_view s) noexcept {
    return key_policy_names.parse(s);
}

std::string make_key(key_policy p, const key_inputs& in) {
    auto content = billing::base_key(in.key_namespace, in.customer_id, in.billing_period);
    switch (p) {
        case key_policy::content:
            return content;
        case key_policy::attempts:
            return content + "-a" + std::to_string(in.attempts);
        case key_policy::connection:
            return content + "-c" + in.connection_uuid;
        case key_policy::nsqd_address:
            return content + "@" + in.nsqd_address;
        case key_policy::call_time:
            return content + "-t" + std::to_string(in.call_time_ns);
        case key_policy::message_id:
            return "nsq-" + in.message_id;
    }
    return content;
}

std::string random_uuid() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    std::array<unsigned char, 16> b{};
    for (auto& x : b) x = static_cast<unsigned char>(rng());
    b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
    b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
    char out[37];
    std::snprintf(out, sizeof out, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    return out;
}

}  // namespace cg::lab
