#include "tests/doubles/stripe/fake_stripe.hpp"

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator for large
// coroutines (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "http/proto/message.hpp"
#include "net/timeout.hpp"
#include "stripe/form.hpp"

namespace cg::fake {
namespace {

using params = std::map<std::string, std::string>;

// Minimal JSON object writer.
class json_obj {
  public:
    json_obj& str(std::string_view k, std::string_view v) {
        key(k);
        append_json_string(s_, v);
        return *this;
    }
    json_obj& str_or_null(std::string_view k, std::string_view v) {
        return v.empty() ? raw(k, "null") : str(k, v);
    }
    json_obj& num(std::string_view k, std::int64_t v) { return raw(k, std::to_string(v)); }
    json_obj& boolean(std::string_view k, bool v) { return raw(k, v ? "true" : "false"); }
    json_obj& raw(std::string_view k, std::string_view json) {
        key(k);
        s_ += json;
        return *this;
    }
    std::string done() { return s_ + "}"; }

  private:
    void key(std::string_view k) {
        if (s_.size() > 1) s_ += ',';
        append_json_string(s_, k);
        s_ += ':';
    }
    std::string s_ = "{";
};

std::string meta_json(const std::vector<std::pair<std::string, std::string>>& m) {
    json_obj o;
    for (const auto& [k, v] : m) o.str(k, v);
    return o.done();
}

std::string charge_json(const charge_rec& c) {
    bool ok = c.status == "succeeded";
    return json_obj()
        .str("id", c.id)
        .str("object", "charge")
        .num("amount", c.amount)
        .num("amount_captured", ok ? c.amount : 0)
        .num("amount_refunded", 0)
        .boolean("captured", ok)
        .num("created", c.created)
        .str("currency", c.currency)
        .str_or_null("customer", c.customer)
        .str_or_null("description", c.description)
        .str_or_null("failure_code", c.failure_code)
        .str_or_null("failure_message", c.failure_code.empty() ? "" : "Your card was declined.")
        .boolean("livemode", false)
        .raw("metadata", meta_json(c.metadata))
        .boolean("paid", ok)
        .str_or_null("payment_intent", c.payment_intent)
        .boolean("refunded", false)
        .str("status", c.status)
        .done();
}

std::string intent_json(const intent_rec& p) {
    std::string last_error = "null";
    if (!p.last_error_code.empty())
        last_error = json_obj()
                         .str("type", "card_error")
                         .str("code", p.last_error_code)
                         .str("message", "Your card was declined.")
                         .done();
    std::string next_action = "null";
    if (p.status == "requires_action")
        next_action = json_obj().str("type", "use_stripe_sdk").raw("use_stripe_sdk", "{}").done();
    return json_obj()
        .str("id", p.id)
        .str("object", "payment_intent")
        .num("amount", p.amount)
        .num("amount_received", p.status == "succeeded" ? p.amount : 0)
        .str_or_null("cancellation_reason", p.cancellation_reason)
        .str("client_secret", p.id + "_secret_fake")
        .str("confirmation_method", "automatic")
        .num("created", p.created)
        .str("currency", p.currency)
        .str_or_null("customer", p.customer)
        .str_or_null("description", p.description)
        .raw("last_payment_error", last_error)
        .str_or_null("latest_charge", p.latest_charge)
        .boolean("livemode", false)
        .raw("metadata", meta_json(p.metadata))
        .raw("next_action", next_action)
        .str_or_null("payment_method", p.payment_method)
        .str("status", p.status)
        .done();
}

http::response json_response(int status, std::string body) {
    return http::make_response(status, std::move(body), "application/json");
}

std::string error_body(std::string_view type, std::string_view code, std::string_view message,
                       std::string_view param = {}, std::string_view extra_fields = {}) {
    json_obj e;
    e.str("type", type);
    if (!code.empty()) e.str("code", code);
    e.str("message", message);
    if (!param.empty()) e.str("param", param);
    std::string inner = e.done();
    if (!extra_fields.empty())
        inner = inner.substr(0, inner.size() - 1) + "," + std::string(extra_fields) + "}";
    return json_obj().raw("error", inner).done();
}

http::response error_response(int status, std::string_view type, std::string_view code,
                              std::string_view message, std::string_view param = {}) {
    return json_response(status, error_body(type, code, message, param));
}

std::optional<std::int64_t> to_int(std::string_view s) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
    return v;
}

std::vector<std::pair<std::string, std::string>> metadata_of(const params& p) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [k, v] : p)
        if (k.starts_with("metadata[") && k.ends_with("]")) out.emplace_back(k.substr(9, k.size() - 10), v);
    return out;
}

std::string param(const params& p, const std::string& k) {
    auto it = p.find(k);
    return it == p.end() ? std::string() : it->second;
}

// Stripe's parameter checks shared by both creating endpoints; nullopt when valid.
std::optional<http::response> validate_common(const params& p, const std::vector<std::string>& allowed) {
    for (const auto& [k, v] : p) {
        auto top = k.substr(0, k.find('['));
        if (std::find(allowed.begin(), allowed.end(), top) == allowed.end())
            return error_response(400, "invalid_request_error", "parameter_unknown",
                                  "Received unknown parameter: " + k, k);
    }
    auto amount = to_int(param(p, "amount"));
    if (!p.count("amount"))
        return error_response(400, "invalid_request_error", "parameter_missing",
                              "Missing required param: amount.", "amount");
    if (!amount || *amount <= 0 || *amount > 99999999)
        return error_response(400, "invalid_request_error", "amount_too_small", "Invalid positive integer",
                              "amount");
    auto cur = param(p, "currency");
    if (cur.size() != 3 || !std::all_of(cur.begin(), cur.end(), [](char c) { return c >= 'a' && c <= 'z'; }))
        return error_response(400, "invalid_request_error", "parameter_invalid", "Invalid currency: " + cur,
                              "currency");
    if (!param(p, "customer").starts_with("cus_"))
        return error_response(400, "invalid_request_error", "resource_missing",
                              "No such customer: '" + param(p, "customer") + "'", "customer");
    auto meta = metadata_of(p);
    if (meta.size() > 50)
        return error_response(400, "invalid_request_error", "parameter_invalid",
                              "Metadata can have at most 50 keys", "metadata");
    for (const auto& [k, v] : meta) {
        if (k.empty() || k.size() > 40 || k.find_first_of("[]") != std::string::npos)
            return error_response(400, "invalid_request_error", "parameter_invalid",
                                  "Invalid metadata key: " + k, "metadata");
        if (v.size() > 500)
            return error_response(400, "invalid_request_error", "parameter_invalid",
                                  "Metadata values can have up to 500 characters", "metadata[" + k + "]");
    }
    return std::nullopt;
}

// "/v1/payment_intents/pi_…/cancel" → "pi_…"; empty for any other path.
std::string cancelled_intent_id(const std::string& path) {
    constexpr std::string_view prefix = "/v1/payment_intents/", suffix = "/cancel";
    if (!path.starts_with(prefix) || !path.ends_with(suffix) || path.size() <= prefix.size() + suffix.size())
        return {};
    auto id = path.substr(prefix.size(), path.size() - prefix.size() - suffix.size());
    return id.find('/') == std::string::npos ? id : std::string();
}

std::optional<http::response> validate(const std::string& path, const params& p) {
    if (!cancelled_intent_id(path).empty()) {
        for (const auto& [k, v] : p) {
            auto top = k.substr(0, k.find('['));
            if (top != "cancellation_reason" && top != "expand")
                return error_response(400, "invalid_request_error", "parameter_unknown",
                                      "Received unknown parameter: " + k, k);
        }
        return std::nullopt;
    }
    if (path == "/v1/charges")
        return validate_common(p, {"amount", "currency", "customer", "description", "metadata", "expand",
                                   "capture", "statement_descriptor", "receipt_email", "source"});
    if (path == "/v1/payment_intents") {
        auto bad = validate_common(p, {"amount", "currency", "customer", "description", "metadata", "expand",
                                       "payment_method", "confirm", "off_session", "payment_method_types"});
        if (bad) return bad;
        if (p.count("off_session") && param(p, "confirm") != "true")
            return error_response(400, "invalid_request_error", "parameter_invalid",
                                  "off_session can only be used when confirm=true", "off_session");
        if (param(p, "confirm") == "true" && param(p, "payment_method").empty())
            return error_response(400, "invalid_request_error", "parameter_missing",
                                  "A payment method is required to confirm this PaymentIntent",
                                  "payment_method");
        return std::nullopt;
    }
    return error_response(404, "invalid_request_error", "resource_missing",
                          "Unrecognized request URL (POST: " + path + ")");
}

std::string fingerprint(const std::string& path, const params& p) {
    std::string f = path;
    for (const auto& [k, v] : p) f += "\n" + k + "=" + v;  // std::map: sorted, order-independent
    return f;
}

int qint(const http::request& req, std::string_view key, int dflt) {
    auto v = http::query_param(req.query(), key);
    if (!v) return dflt;
    auto n = to_int(*v);
    return n ? static_cast<int>(*n) : dflt;
}

// GET /v1/charges or /v1/payment_intents: customer and created[gte] filters, newest first, limit 1..100,
// starting_after an id of the list (400 resource_missing otherwise), has_more.
template <typename Rec, typename Json>
http::response list(const http::request& req, const std::vector<Rec>& recs, Json to_json) {
    auto customer = http::query_param(req.query(), "customer");
    auto gte = http::query_param(req.query(), "created[gte]");
    std::int64_t since = gte ? to_int(*gte).value_or(0) : 0;
    int limit = std::clamp(qint(req, "limit", 10), 1, 100);
    auto after = http::query_param(req.query(), "starting_after").value_or("");
    std::vector<const Rec*> all;
    for (auto it = recs.rbegin(); it != recs.rend(); ++it)  // newest first
        if ((!customer || it->customer == *customer) && it->created >= since) all.push_back(&*it);
    std::size_t start = 0;
    if (!after.empty()) {
        auto pos = std::find_if(all.begin(), all.end(), [&](const Rec* c) { return c->id == after; });
        if (pos == all.end())
            return error_response(400, "invalid_request_error", "resource_missing",
                                  "No such object: '" + std::string(after) + "'", "starting_after");
        start = static_cast<std::size_t>(pos - all.begin()) + 1;
    }
    std::string data = "[";
    std::size_t end = std::min(all.size(), start + static_cast<std::size_t>(limit));
    for (std::size_t i = start; i < end; ++i) {
        if (i > start) data += ',';
        data += to_json(*all[i]);
    }
    data += "]";
    return json_response(200, json_obj()
                                  .str("object", "list")
                                  .raw("data", data)
                                  .boolean("has_more", end < all.size())
                                  .str("url", req.path())
                                  .done());
}

}  // namespace

fake_stripe::fake_stripe(asio::any_io_executor ex, std::shared_ptr<asio::ssl::context> tls, logger log,
                         std::size_t max_connections)
    : ex_(ex), log_(log) {
    http::router r;
    r.add_prefix("", "/v1/", [this](http::request& q) { return api(q); });
    r.add_prefix("", "/_admin/", [this](http::request& q) { return admin(q); });
    http::server_options o;
    o.tls = std::move(tls);
    o.max_connections = max_connections;
    o.server_name = "fake-stripe";
    server_ = std::make_unique<http::server>(ex, std::move(r), std::move(o), std::move(log));
}

fake_stripe::~fake_stripe() = default;

result<net::tcp::endpoint> fake_stripe::listen(const net::host_port& where) {
    return server_->listen(where);
}
void fake_stripe::start() {
    server_->start();
}
void fake_stripe::stop() {
    server_->stop();
}

void fake_stripe::set_limits(const limits& l) {
    limiter_.set(l, std::chrono::steady_clock::now());
}

void fake_stripe::decline(std::string customer, decline_rule rule) {
    declines_[std::move(customer)] = std::move(rule);
}

std::int64_t fake_stripe::now() const {
    auto t = std::chrono::system_clock::now() + clock_offset_;
    return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

int fake_stripe::posts_for(const std::string& key) const {
    auto it = posts_.find(key);
    return it == posts_.end() ? 0 : it->second;
}

void fake_stripe::reset() {
    faults_ = {};
    declines_.clear();
    charges_.clear();
    intents_.clear();
    idem_.clear();
    posts_.clear();
    fault_hits_.clear();
    clock_offset_ = std::chrono::seconds(0);
    max_active_ = active_;
}

std::string fake_stripe::new_id(const char* prefix) {
    static constexpr char alphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    std::string id = prefix;
    std::uniform_int_distribution<int> pick(0, 61);
    for (int i = 0; i < 24; ++i) id += alphabet[pick(rng_)];
    return id;
}

asio::awaitable<void> fake_stripe::delay(bool stall_ok, const std::string& path) {
    int ms = faults_.latency_ms;
    if (faults_.latency_jitter_ms > 0)
        ms += std::uniform_int_distribution<int>(0, faults_.latency_jitter_ms)(rng_);
    if (stall_ok && faults_.stall_count > 0) {
        --faults_.stall_count;
        ++fault_hits_["stall " + path];
        ms += faults_.stall_ms;
    }
    if (ms > 0) co_await net::sleep_for(std::chrono::milliseconds(ms));
}

asio::awaitable<http::response> fake_stripe::api(http::request& req) {
    ++requests_;
    std::string rid = "req_" + std::to_string(++next_req_);
    struct active_guard {
        fake_stripe* f;
        explicit active_guard(fake_stripe* x) : f(x) {
            f->max_active_ = std::max(f->max_active_, ++f->active_);
        }
        ~active_guard() { --f->active_; }
    } guard(this);

    http::response resp;
    auto auth = req.headers.get("Authorization").value_or("");
    limiter::verdict admitted = limiter::verdict::ok;
    if (auth.starts_with("Bearer sk_") || auth.starts_with("Bearer rk_"))
        admitted = limiter_.admit(limiter::endpoint_of(req.method, req.path()),
                                  std::chrono::steady_clock::now(), active_ - 1);
    if (!auth.starts_with("Bearer sk_") && !auth.starts_with("Bearer rk_")) {
        resp = error_response(401, "invalid_request_error", "", "Invalid API Key provided.");
    } else if (admitted != limiter::verdict::ok) {
        // Rate limiting runs before idempotency: nothing is saved, the same key may be sent again.
        resp = error_response(
            429, "invalid_request_error", "rate_limit",
            admitted == limiter::verdict::rate_limited
                ? "Request rate limit exceeded. You can learn more about rate limits here "
                  "https://stripe.com/docs/rate-limits."
                : "Request concurrency limit exceeded. You can learn more about rate limits here "
                  "https://stripe.com/docs/rate-limits.");
        resp.headers.add("Stripe-Should-Retry", "true");
    } else if (req.method == "POST") {
        resp = co_await post(req, rid);
    } else {
        co_await delay(true, std::string(req.path()));
        resp = get(req);
    }
    resp.headers.add("Request-Id", rid);
    co_return resp;
}

asio::awaitable<http::response> fake_stripe::post(http::request& req, std::string rid) {
    std::string key(req.headers.get("Idempotency-Key").value_or(""));
    if (!key.empty()) ++posts_[key];
    if (key.size() > 255)
        co_return error_response(400, "invalid_request_error", "",
                                 "Idempotency-Key must be at most 255 characters");
    // Rate limiting runs before idempotency: nothing is saved.
    if (faults_.rate_limit > 0 && faults_.targets(req.path())) {
        --faults_.rate_limit;
        ++fault_hits_["rate_limit " + std::string(req.path())];
        auto r = error_response(429, "invalid_request_error", "rate_limit",
                                "Too many requests hit the API too quickly.");
        r.headers.add("Stripe-Should-Retry", "true");
        co_return r;
    }
    auto decoded = stripe::decode_form(req.body);
    if (!decoded) co_return error_response(400, "invalid_request_error", "", "Invalid request body");
    params p(decoded->begin(), decoded->end());
    std::string path(req.path());
    std::string fp = fingerprint(path, p);

    if (!key.empty()) {
        auto it = idem_.find(key);
        if (it != idem_.end() && now() - it->second.created >= 24 * 3600) {
            idem_.erase(it);  // pruned: the key starts a new request
            it = idem_.end();
        }
        if (it != idem_.end()) {
            if (it->second.fingerprint != fp)
                co_return error_response(
                    400, "idempotency_error", "",
                    "Keys for idempotent requests can only be used with the same parameters they "
                    "were first used with. Try using a key other than '" +
                        key + "' if you meant to execute a different request.");
            if (it->second.executing) {
                auto r =
                    error_response(409, "idempotency_error", "idempotency_key_in_use",
                                   "There is currently another in-progress request using this Idempotent Key "
                                   "(that probably means you submitted twice, and the other request is still "
                                   "going through): " +
                                       key + ". Please try again later.");
                r.headers.add("Stripe-Should-Retry", "true");
                co_return r;
            }
            auto r = json_response(it->second.status, it->second.body);
            r.headers.add("Idempotent-Replayed", "true");
            r.headers.add("Original-Request", it->second.request_id);
            r.headers.add("Idempotency-Key", key);
            co_return r;
        }
        if (faults_.in_use > 0 && faults_.targets(path)) {
            --faults_.in_use;
            auto r =
                error_response(409, "idempotency_error", "idempotency_key_in_use",
                               "There is currently another in-progress request using this Idempotent Key.");
            r.headers.add("Stripe-Should-Retry", "true");
            co_return r;
        }
    }
    // Validation failures are not saved: the same key may be used again with fixed parameters.
    if (auto bad = validate(path, p)) co_return std::move(*bad);
    if (!key.empty()) idem_[key] = idem_rec{fp, true, 0, {}, rid, now()};

    co_await delay(true, path);
    int status = 0;
    std::string body;
    bool created = false;
    if (path == "/v1/charges")
        create_charge(p, status, body, created);
    else if (path == "/v1/payment_intents")
        create_intent(p, status, body, created);
    else
        cancel_intent(cancelled_intent_id(path), p, status, body);
    if (created && faults_.fail_after_create > 0 && faults_.targets(path)) {
        --faults_.fail_after_create;
        ++fault_hits_["fail_after_create " + path];
        status = 500;
        body = error_body("api_error", "", "An unknown error occurred");
    }
    bool drop = created && status == 200 && faults_.drop_after_create > 0 && faults_.targets(path);
    if (drop) {
        --faults_.drop_after_create;
        ++fault_hits_["drop_after_create " + path];
    }
    if (!key.empty()) {
        // Saved once the endpoint executed, success or failure, 500s included. (reset() may have run.)
        if (auto it = idem_.find(key);
            it != idem_.end() && it->second.executing && it->second.request_id == rid) {
            it->second.executing = false;
            it->second.status = status;
            it->second.body = body;
        }
    }
    auto r = json_response(status, std::move(body));
    if (!key.empty()) r.headers.add("Idempotency-Key", key);
    r.abort_connection = drop;
    co_return r;
}

charge_rec& fake_stripe::new_charge(const params& p, const decline_rule* declined) {
    charge_rec c;
    c.id = new_id("ch_");
    c.amount = to_int(param(p, "amount")).value_or(0);
    c.currency = param(p, "currency");
    c.customer = param(p, "customer");
    c.description = param(p, "description");
    c.created = now();
    c.metadata = metadata_of(p);
    c.status = declined ? "failed" : "succeeded";
    if (declined) c.failure_code = declined->code;
    c.seq = ++seq_;
    charges_.push_back(std::move(c));
    return charges_.back();
}

void fake_stripe::create_charge(const params& p, int& status, std::string& body, bool& created) {
    auto d = declines_.find(param(p, "customer"));
    const decline_rule* rule = d == declines_.end() ? nullptr : &d->second;
    auto& c = new_charge(p, rule);
    created = true;
    if (!rule) {
        status = 200;
        body = charge_json(c);
        return;
    }
    status = 402;
    std::string fields = "\"charge\":\"" + c.id + "\"";
    if (rule->code == "card_declined") fields += ",\"decline_code\":\"" + rule->decline_code + "\"";
    body = error_body("card_error", rule->code, "Your card was declined.", {}, fields);
}

void fake_stripe::create_intent(const params& p, int& status, std::string& body, bool& created) {
    intent_rec pi;
    pi.id = new_id("pi_");
    pi.amount = to_int(param(p, "amount")).value_or(0);
    pi.currency = param(p, "currency");
    pi.customer = param(p, "customer");
    pi.description = param(p, "description");
    pi.payment_method = param(p, "payment_method");
    pi.created = now();
    pi.metadata = metadata_of(p);
    created = true;
    if (param(p, "confirm") != "true") {
        pi.status = "requires_confirmation";
        status = 200;
        body = intent_json(pi);
        intents_.push_back(std::move(pi));
        return;
    }
    auto d = declines_.find(pi.customer);
    const decline_rule* rule = d == declines_.end() ? nullptr : &d->second;
    if (rule && rule->code == "authentication_required" && param(p, "off_session") != "true") {
        // On-session: the customer is there to authenticate. No charge until they do.
        pi.status = "requires_action";
        status = 200;
        body = intent_json(pi);
        intents_.push_back(std::move(pi));
        return;
    }
    auto& c = new_charge(p, rule);
    c.payment_intent = pi.id;
    pi.latest_charge = c.id;
    pi.status = rule ? "requires_payment_method" : "succeeded";
    if (rule) pi.last_error_code = rule->code;
    if (!rule) {
        status = 200;
        body = intent_json(pi);
    } else {
        status = 402;
        std::string fields = "\"charge\":\"" + c.id + "\",\"payment_intent\":" + intent_json(pi);
        if (rule->code == "card_declined") fields += ",\"decline_code\":\"" + rule->decline_code + "\"";
        std::string msg = rule->code == "authentication_required"
                              ? "Your card was declined. This transaction requires authentication."
                              : "Your card was declined.";
        body = error_body("card_error", rule->code, msg, {}, fields);
    }
    intents_.push_back(std::move(pi));
}

// POST /v1/payment_intents/{id}/cancel: any status but succeeded or canceled → canceled (Stripe's rule).
void fake_stripe::cancel_intent(const std::string& id, const params& p, int& status, std::string& body) {
    auto it = std::find_if(intents_.begin(), intents_.end(), [&](const intent_rec& r) { return r.id == id; });
    if (it == intents_.end()) {
        status = 404;
        body = error_body("invalid_request_error", "resource_missing", "No such payment_intent: '" + id + "'",
                          "intent");
        return;
    }
    if (it->status == "succeeded" || it->status == "canceled") {
        status = 400;
        body = error_body("invalid_request_error", "payment_intent_unexpected_state",
                          "You cannot cancel this PaymentIntent because it has a status of " + it->status +
                              ". Only a PaymentIntent with one of the following statuses may be canceled: "
                              "requires_payment_method, requires_capture, requires_confirmation, "
                              "requires_action, processing.");
        return;
    }
    it->status = "canceled";
    it->cancellation_reason = param(p, "cancellation_reason");
    status = 200;
    body = intent_json(*it);
}

http::response fake_stripe::get(const http::request& req) {
    std::string path(req.path());
    if (path == "/v1/charges") return list(req, charges_, charge_json);
    if (path == "/v1/payment_intents") return list(req, intents_, intent_json);
    if (path.starts_with("/v1/charges/")) {
        auto id = path.substr(12);
        for (const auto& c : charges_)
            if (c.id == id) return json_response(200, charge_json(c));
        return error_response(404, "invalid_request_error", "resource_missing",
                              "No such charge: '" + id + "'", "id");
    }
    if (path.starts_with("/v1/payment_intents/")) {
        auto id = path.substr(20);
        for (const auto& p : intents_)
            if (p.id == id) return json_response(200, intent_json(p));
        return error_response(404, "invalid_request_error", "resource_missing",
                              "No such payment_intent: '" + id + "'", "intent");
    }
    return error_response(404, "invalid_request_error", "", "Unrecognized request URL (GET: " + path + ")");
}

asio::awaitable<http::response> fake_stripe::admin(http::request& req) {
    std::string path(req.path());
    auto form = stripe::decode_form(req.body);
    params p = form ? params(form->begin(), form->end()) : params();
    auto num = [&](const char* k, int& field) {
        if (auto v = p.find(k); v != p.end()) field = static_cast<int>(to_int(v->second).value_or(field));
    };
    if (path == "/_admin/charges") {
        std::string data = "[";
        for (std::size_t i = 0; i < charges_.size(); ++i) data += (i ? "," : "") + charge_json(charges_[i]);
        co_return json_response(200, json_obj()
                                         .raw("data", data + "]")
                                         .num("count", static_cast<std::int64_t>(charges_.size()))
                                         .done());
    }
    if (path == "/_admin/intents") {
        std::string data = "[";
        for (std::size_t i = 0; i < intents_.size(); ++i) data += (i ? "," : "") + intent_json(intents_[i]);
        co_return json_response(200, json_obj()
                                         .raw("data", data + "]")
                                         .num("count", static_cast<std::int64_t>(intents_.size()))
                                         .done());
    }
    if (path == "/_admin/posts") {
        auto key = http::query_param(req.query(), "key").value_or("");
        co_return json_response(200, json_obj().str("key", key).num("count", posts_for(key)).done());
    }
    if (path == "/_admin/faults" && req.method == "POST") {
        num("latency_ms", faults_.latency_ms);
        num("latency_jitter_ms", faults_.latency_jitter_ms);
        num("stall_ms", faults_.stall_ms);
        num("stall_count", faults_.stall_count);
        num("fail_after_create", faults_.fail_after_create);
        num("drop_after_create", faults_.drop_after_create);
        num("rate_limit", faults_.rate_limit);
        num("in_use", faults_.in_use);
        if (auto v = p.find("fault_path"); v != p.end()) faults_.fault_path = v->second;
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/limits" && req.method == "POST") {
        limits l = limiter_.get();
        auto real = [&](const char* k, double& field) {
            if (auto v = p.find(k); v != p.end()) field = std::strtod(v->second.c_str(), nullptr);
        };
        real("global_rps", l.global_rps);
        real("endpoint_rps", l.endpoint_rps);
        real("burst_s", l.burst_s);
        num("max_concurrent", l.max_concurrent);
        set_limits(l);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/stats") {
        json_obj hits;
        for (const auto& [k, n] : fault_hits_) hits.num(k, n);
        co_return json_response(
            200, json_obj()
                     .num("requests", static_cast<std::int64_t>(requests_))
                     .num("rate_limited", static_cast<std::int64_t>(limiter_.rate_limited()))
                     .num("concurrency_limited", static_cast<std::int64_t>(limiter_.too_concurrent()))
                     .num("max_concurrent", max_active_)
                     .num("charges", static_cast<std::int64_t>(charges_.size()))
                     .num("intents", static_cast<std::int64_t>(intents_.size()))
                     .raw("fault_hits", hits.done())
                     .done());
    }
    if (path == "/_admin/clock" && req.method == "POST") {
        if (auto v = to_int(param(p, "advance_s"))) advance_clock(std::chrono::seconds(*v));
        co_return json_response(200, json_obj().num("now", now()).done());
    }
    if (path == "/_admin/declines" && req.method == "POST") {
        decline_rule rule;
        if (p.count("code")) rule.code = param(p, "code");
        if (p.count("decline_code")) rule.decline_code = param(p, "decline_code");
        decline(param(p, "customer"), rule);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/reset" && req.method == "POST") {
        reset();
        co_return json_response(200, "{}");
    }
    co_return http::make_response(404, "unknown admin endpoint\n");
}

}  // namespace cg::fake
