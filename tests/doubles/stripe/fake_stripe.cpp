// fake-stripe's server: routing of /v1 and /_admin, the /v1 front door (Stripe-Account, limits, faults,
// the request log) and POST's idempotency cache; the endpoints live in payments.cpp, settlement.cpp,
// lists.cpp and admin.cpp.
#include "tests/doubles/stripe/fake_stripe.hpp"

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator for large
// coroutines (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>

#include "http/proto/message.hpp"
#include "net/timeout.hpp"
#include "stripe/form.hpp"
#include "tests/doubles/stripe/params.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake {

using namespace stripe_impl;

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
    server_ = std::make_unique<http::server>(ex, std::move(r), std::move(o), log_);
    webhooks_ = std::make_unique<fake::webhook_sender>(ex, log_, [this] { return now(); });
}

fake_stripe::~fake_stripe() {
    *alive_ = false;
}

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
    for (auto& [account, one] : account_limiters_) one.set(l, std::chrono::steady_clock::now());
}

void fake_stripe::add_account(const std::string& account, const std::vector<std::string>& customers) {
    auto& known = accounts_[account];
    for (const auto& c : customers)
        if (std::find(known.begin(), known.end(), c) == known.end()) known.push_back(c);
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
    refunds_.clear();
    disputes_.clear();
    bank_outcomes_.clear();
    default_methods_.clear();
    default_sources_.clear();
    events_.clear();
    webhooks_->reset();
    ++settle_gen_;
    pending_settle_ = 0;
    idem_.clear();
    posts_.clear();
    accounts_.clear();
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
    const bool authenticated = auth.starts_with("Bearer sk_") || auth.starts_with("Bearer rk_");
    auto account_header = req.headers.get("Stripe-Account");
    const std::string account(account_header.value_or(""));
    const bool reachable = !account_header || (well_formed_account(account) && accounts_.count(account));
    limiter::verdict admitted = limiter::verdict::ok;
    if (authenticated && reachable) {
        // Each account is limited on its own: a connected account's requests spend its bucket only.
        auto& lim = account.empty() ? limiter_ : account_limiters_.try_emplace(account).first->second;
        if (!account.empty() && lim.changes() == 0 && limiter_.changes() > 0)
            lim.set(limiter_.get(), std::chrono::steady_clock::now());
        admitted = lim.admit(limiter::endpoint_of(req.method, req.path()), std::chrono::steady_clock::now(),
                             active_ - 1);
    }
    if (!authenticated) {
        resp = error_response(401, "invalid_request_error", "", "Invalid API Key provided.");
    } else if (!reachable) {
        // Stripe's answer to a Stripe-Account the key cannot act for (unknown, not connected, malformed).
        resp = error_response(403, "invalid_request_error", "account_invalid",
                              "The provided key '" + std::string(auth.substr(7, 8)) +
                                  "***' does not have access to account '" + account +
                                  "' (or that account does not exist). Application access may have been "
                                  "revoked.");
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
    if (record_requests_)
        request_log_.push_back({req.method, std::string(req.path()), std::string(req.query()), req.body,
                                std::string(req.headers.get("Stripe-Version").value_or("")), account,
                                resp.status, resp.body});
    co_return resp;
}

asio::awaitable<http::response> fake_stripe::post(http::request& req, std::string rid) {
    std::string key(req.headers.get("Idempotency-Key").value_or(""));
    const std::string account = account_of(req);
    // Idempotency keys are per account: the same key on two accounts is two requests.
    const std::string idem_key = account.empty() ? key : account + "\n" + key;
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
        auto it = idem_.find(idem_key);
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
    // The API version the request is rendered and validated in: its Stripe-Version, else the account's
    // default.
    const std::string version(req.headers.get("Stripe-Version").value_or(default_api_version_));
    if (auto bad = validate(path, p, version)) co_return std::move(*bad);
    if (!account.empty() && (path == "/v1/charges" || path == "/v1/payment_intents")) {
        // A connected account has only its own customers (the platform's are not shared).
        const auto& known = accounts_[account];
        if (std::find(known.begin(), known.end(), param(p, "customer")) == known.end())
            co_return error_response(400, "invalid_request_error", "resource_missing",
                                     "No such customer: '" + param(p, "customer") + "'", "customer");
    }
    if (!key.empty()) idem_[idem_key] = idem_rec{fp, true, 0, {}, rid, now()};

    co_await delay(true, path);
    int status = 0;
    std::string body;
    bool created = false;
    cur_request_id_ = rid;
    cur_idem_key_ = key;
    cur_account_ = account;
    cur_version_ = version;
    if (path == "/v1/charges")
        create_charge(p, status, body, created);
    else if (path == "/v1/payment_intents")
        create_intent(p, status, body, created);
    else if (path == "/v1/refunds")
        create_refund(p, status, body, created);
    else
        cancel_intent(cancelled_intent_id(path), p, status, body);
    cur_request_id_.clear();
    cur_idem_key_.clear();
    cur_account_.clear();
    cur_version_ = default_api_version_;
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
        if (auto it = idem_.find(idem_key);
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

}  // namespace cg::fake
