#include "nsq/proto/identify.hpp"

#include <simdjson.h>

#include "core/log.hpp"
#include "nsq/proto/error.hpp"

namespace cg::nsq::proto {
namespace {

void field(std::string& out, std::string_view key) {
    if (out.size() > 1) out.push_back(',');
    append_json_string(out, key);
    out.push_back(':');
}
void field(std::string& out, std::string_view key, std::int64_t v) {
    field(out, key);
    out += std::to_string(v);
}
void field(std::string& out, std::string_view key, bool v) {
    field(out, key);
    out += v ? "true" : "false";
}
void field(std::string& out, std::string_view key, std::string_view v) {
    field(out, key);
    append_json_string(out, v);
}

error bad(std::string m) {
    return error(errc::bad_response, std::move(m));
}

// Reads one JSON value into an int64 / bool / string with Go's strictness about types.
bool read(simdjson::dom::element v, std::int64_t& out) {
    if (v.is_int64()) return v.get_int64().get(out) == simdjson::SUCCESS;
    if (v.is_uint64()) return false;  // overflows Go's int
    return false;
}
bool read(simdjson::dom::element v, bool& out) {
    return v.get_bool().get(out) == simdjson::SUCCESS;
}
bool read(simdjson::dom::element v, std::string& out) {
    std::string_view s;
    if (v.get_string().get(s) != simdjson::SUCCESS) return false;
    out.assign(s);
    return true;
}

template <typename T>
bool read_field(simdjson::dom::object obj, std::string_view key, T& out) {
    simdjson::dom::element v;
    if (obj.at_key(key).get(v) != simdjson::SUCCESS) return true;  // absent: keep the default
    if (v.is_null()) return true;                                  // Go leaves the zero value
    return read(v, out);
}

result<simdjson::dom::object> parse_object(simdjson::dom::parser& p, std::string_view json) {
    simdjson::dom::element doc;
    if (p.parse(json.data(), json.size()).get(doc) != simdjson::SUCCESS) return bad("invalid JSON");
    simdjson::dom::object obj;
    if (doc.get_object().get(obj) != simdjson::SUCCESS) return bad("JSON is not an object");
    return obj;
}

}  // namespace

std::string to_json(const identify_request& r) {
    std::string out = "{";
    field(out, "client_id", r.client_id);
    field(out, "hostname", r.hostname);
    field(out, "user_agent", r.user_agent);
    field(out, "feature_negotiation", r.feature_negotiation);
    field(out, "heartbeat_interval", r.heartbeat_interval_ms);
    field(out, "msg_timeout", r.msg_timeout_ms);
    if (r.output_buffer_size) field(out, "output_buffer_size", r.output_buffer_size);
    if (r.output_buffer_timeout) field(out, "output_buffer_timeout", r.output_buffer_timeout);
    if (r.sample_rate) field(out, "sample_rate", r.sample_rate);
    if (r.tls_v1) field(out, "tls_v1", true);
    if (r.snappy) field(out, "snappy", true);
    if (r.deflate) {
        field(out, "deflate", true);
        field(out, "deflate_level", r.deflate_level);
    }
    out.push_back('}');
    return out;
}

result<identify_request> parse_identify_request(std::string_view json) {
    simdjson::dom::parser p;
    auto obj = parse_object(p, json);
    if (!obj) return obj.err();
    identify_request r;
    r.heartbeat_interval_ms = 0;  // absent → nsqd's default, like Go's zero value
    bool ok = read_field(*obj, "client_id", r.client_id) && read_field(*obj, "hostname", r.hostname) &&
              read_field(*obj, "user_agent", r.user_agent) &&
              read_field(*obj, "feature_negotiation", r.feature_negotiation) &&
              read_field(*obj, "heartbeat_interval", r.heartbeat_interval_ms) &&
              read_field(*obj, "msg_timeout", r.msg_timeout_ms) &&
              read_field(*obj, "output_buffer_size", r.output_buffer_size) &&
              read_field(*obj, "output_buffer_timeout", r.output_buffer_timeout) &&
              read_field(*obj, "sample_rate", r.sample_rate) && read_field(*obj, "tls_v1", r.tls_v1) &&
              read_field(*obj, "snappy", r.snappy) && read_field(*obj, "deflate", r.deflate) &&
              read_field(*obj, "deflate_level", r.deflate_level);
    if (!ok) return bad("IDENTIFY JSON field of the wrong type");
    simdjson::dom::element fn;
    if (obj->at_key("feature_negotiation").get(fn) != simdjson::SUCCESS) r.feature_negotiation = false;
    return r;
}

result<identify_response> parse_identify_response(std::string_view data) {
    if (data == "OK") return bad("nsqd answered IDENTIFY with OK: feature negotiation was not honoured");
    simdjson::dom::parser p;
    auto obj = parse_object(p, data);
    if (!obj) return obj.err();
    identify_response r;
    bool ok = read_field(*obj, "max_rdy_count", r.max_rdy_count) && read_field(*obj, "version", r.version) &&
              read_field(*obj, "max_msg_timeout", r.max_msg_timeout) &&
              read_field(*obj, "msg_timeout", r.msg_timeout) && read_field(*obj, "tls_v1", r.tls_v1) &&
              read_field(*obj, "deflate", r.deflate) && read_field(*obj, "deflate_level", r.deflate_level) &&
              read_field(*obj, "max_deflate_level", r.max_deflate_level) &&
              read_field(*obj, "snappy", r.snappy) && read_field(*obj, "sample_rate", r.sample_rate) &&
              read_field(*obj, "auth_required", r.auth_required) &&
              read_field(*obj, "output_buffer_size", r.output_buffer_size) &&
              read_field(*obj, "output_buffer_timeout", r.output_buffer_timeout);
    if (!ok) return bad("IDENTIFY response field of the wrong type");
    if (r.max_rdy_count < 1)
        return bad("IDENTIFY response: max_rdy_count " + std::to_string(r.max_rdy_count));
    if (r.msg_timeout < 1) return bad("IDENTIFY response: msg_timeout " + std::to_string(r.msg_timeout));
    if (r.max_msg_timeout < r.msg_timeout) r.max_msg_timeout = r.msg_timeout;
    return r;
}

std::string to_json(const identify_response& r) {
    std::string out = "{";
    field(out, "max_rdy_count", r.max_rdy_count);
    field(out, "version", r.version);
    field(out, "max_msg_timeout", r.max_msg_timeout);
    field(out, "msg_timeout", r.msg_timeout);
    field(out, "tls_v1", r.tls_v1);
    field(out, "deflate", r.deflate);
    field(out, "deflate_level", r.deflate_level);
    field(out, "max_deflate_level", r.max_deflate_level);
    field(out, "snappy", r.snappy);
    field(out, "sample_rate", r.sample_rate);
    field(out, "auth_required", r.auth_required);
    field(out, "output_buffer_size", r.output_buffer_size);
    field(out, "output_buffer_timeout", r.output_buffer_timeout);
    out.push_back('}');
    return out;
}

result<auth_response> parse_auth_response(std::string_view data) {
    simdjson::dom::parser p;
    auto obj = parse_object(p, data);
    if (!obj) return obj.err();
    auth_response r;
    if (!read_field(*obj, "identity", r.identity) || !read_field(*obj, "identity_url", r.identity_url) ||
        !read_field(*obj, "permission_count", r.permission_count))
        return bad("AUTH response field of the wrong type");
    return r;
}

std::string to_json(const auth_response& r) {
    std::string out = "{";
    field(out, "identity", r.identity);
    field(out, "identity_url", r.identity_url);
    field(out, "permission_count", r.permission_count);
    out.push_back('}');
    return out;
}

result<void> check_heartbeat_interval(std::int64_t ms, std::int64_t max_ms) {
    if (ms == -1 || ms == 0 || (ms >= min_heartbeat_interval_ms && ms <= max_ms)) return {};
    return error(errc::bad_config, "heartbeat interval (" + std::to_string(ms) + ") is invalid");
}

result<void> check_msg_timeout(std::int64_t ms, std::int64_t max_ms) {
    if (ms == 0 || (ms >= min_msg_timeout_ms && ms <= max_ms)) return {};
    return error(errc::bad_config, "msg timeout (" + std::to_string(ms) + ") is invalid");
}

}  // namespace cg::nsq::proto
