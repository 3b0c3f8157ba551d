// The path every stripe::client call takes (stripe/client_call.hpp): the request with auth, Stripe-Version,
// Idempotency-Key and Stripe-Account; the rate control's admission; the classification of each attempt; the
// bounded jittered retries; the metrics around a logical call; the bound on calls under way.
#include "stripe/client_call.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

#include "http/proto/message.hpp"
#include "net/error.hpp"
#include "net/timeout.hpp"
#include "stripe/json.hpp"
#include "stripe/outcome.hpp"
#include "stripe/retry.hpp"

namespace cg::stripe {
namespace {

std::optional<std::chrono::seconds> retry_after(const http::response& r) {
    auto h = r.headers.get("Retry-After");
    if (!h) return std::nullopt;
    long s = 0;
    auto [p, ec] = std::from_chars(h->data(), h->data() + h->size(), s);
    if (ec != std::errc{} || s < 0) return std::nullopt;
    return std::chrono::seconds(s);
}

// Fills cls, error, request id, replay flag and message from the last attempt.
void classify(call_result& out) {
    const auto& h = out.http;
    if (!h.ok()) {
        out.cls = classify_transport_failure(h.request_sent);
        out.message = (h.request_sent ? "after sending: " : "before sending: ") + h.err.describe();
        return;
    }
    const auto& r = h.resp;
    out.request_id = std::string(r.headers.get("Request-Id").value_or(""));
    out.replayed = r.headers.get("Idempotent-Replayed").value_or("") == "true";
    if (r.status >= 300) out.error = parse_error(r.body);
    response_facts f;
    f.status = r.status;
    if (out.error) {
        f.error_type = out.error->type;
        f.error_code = out.error->code;
        f.error_param = out.error->param;
    }
    f.should_retry = parse_should_retry(r.headers.get("Stripe-Should-Retry"));
    out.cls = classify_response(f);
    out.message = "HTTP " + std::to_string(r.status);
    if (out.error) {
        out.message += " " + out.error->type;
        if (!out.error->code.empty()) out.message += "/" + out.error->code;
        if (!out.error->decline_code.empty()) out.message += "/" + out.error->decline_code;
        if (!out.error->message.empty()) out.message += ": " + out.error->message;
    }
}

http::request build(const client_config& cfg, const std::string& method, const std::string& target,
                    const std::string& body, const std::string& key, const std::string& account) {
    http::request req;
    req.method = method;
    req.target = target;
    req.body = body;
    req.headers.add("Authorization", "Bearer " + cfg.api_key);
    req.headers.add("Stripe-Version", cfg.stripe_version);
    req.headers.add("Accept", "application/json");
    req.headers.add("User-Agent", "chargeguard/0.1");
    if (method != "GET") req.headers.add("Content-Type", "application/x-www-form-urlencoded");
    if (!key.empty()) req.headers.add("Idempotency-Key", key);
    if (!account.empty()) req.headers.add("Stripe-Account", account);
    return req;
}

// A Stripe-Account value the client sends: "acct_" and letters and digits (never a line break).
bool sendable_account(std::string_view a) {
    if (!a.starts_with("acct_") || a.size() <= 5 || a.size() > 255) return false;
    for (char c : a.substr(5))
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
    return true;
}

// The rate control a request to `account` waits on: the platform's, or the account's own (made on first use).
pacer& pacer_for(client::state& st, const std::string& account) {
    if (account.empty()) return *st.pace;
    auto it = st.account_pace.find(account);
    if (it == st.account_pace.end())
        it = st.account_pace.emplace(account, pacer::create(st.http->get_executor(), st.cfg.rate)).first;
    return *it->second;
}

// Waits for the rate control's admission (on the strand; a timer, never a blocked thread). The limit gauge
// shows the platform's.
net::awaitable<void> pace(client::state& st, pacer& p) {
    auto waited = co_await p.acquire();
    if (st.metrics) {
        st.metrics->paced(waited);
        if (&p == st.pace.get()) st.metrics->rate_limit(p.limit());
    }
}

}  // namespace

namespace client_detail {

// Start of a logical call, on the strand: the connection figures catch up and the clock starts.
steady::time_point begin_call(const client::state& st) {
    if (st.metrics) st.metrics->sync(st.http->stats());
    return steady::now();
}

// End of a logical call (after its retries), on the strand.
void end_call(const client::state& st, operation op, outcome_class cls, steady::time_point start) {
    if (!st.metrics) return;
    st.metrics->finished(op, cls, steady::now() - start);
    st.metrics->sync(st.http->stats());
}

// The retry loop. Runs on the http client's strand. Counts attempts, retries and replays under `op`.
net::awaitable<call_result> run_call(state_ptr st, operation op, std::string method, std::string target,
                                     std::string body, std::string key, std::string account) {
    call_result out;
    if (method == "POST" && (key.empty() || key.size() > 255)) {
        out.cls = outcome_class::rejected;
        out.message = "POST needs an Idempotency-Key of 1 to 255 characters";
        co_return out;
    }
    if (!account.empty() && !sendable_account(account)) {
        out.cls = outcome_class::rejected;
        out.message = "Stripe-Account must look like acct_…";
        co_return out;
    }
    pacer* paced = st->pace ? &pacer_for(*st, account) : nullptr;
    const bool safe_to_repeat = method == "GET";
    const auto& policy = st->cfg.retry;
    for (unsigned attempt = 1;; ++attempt) {
        out = call_result{};
        if (paced) co_await pace(*st, *paced);
        auto sent_at = steady::now();
        out.http = co_await st->http->request(build(st->cfg, method, target, body, key, account));
        if (paced && out.http.ok()) paced->on_response(out.http.resp.status == 429, sent_at);
        if (st->metrics && out.http.ok() && out.http.resp.status == 429) st->metrics->throttled();
        out.attempts = attempt;
        if (st->metrics) st->metrics->attempt(op);
        classify(out);
        bool retryable = out.cls == outcome_class::retry_same_key ||
                         (safe_to_repeat && out.cls == outcome_class::indeterminate);
        bool told_not_to =
            out.http.ok() && parse_should_retry(out.http.resp.headers.get("Stripe-Should-Retry")) == false;
        // A certificate we refuse will be refused again: retrying only delays the alert.
        bool hopeless = out.http.err.code == net::errc::tls_verify_failed;
        bool rate_limited = out.http.ok() && out.http.resp.status == 429;
        unsigned allowed =
            rate_limited ? std::max(policy.max_retries, policy.max_rate_limited_retries) : policy.max_retries;
        if (!retryable || told_not_to || hopeless || attempt > allowed) break;
        if (st->metrics) st->metrics->retry(op, retry_reason(out.http));
        double unit = std::uniform_real_distribution<double>(0.0, 1.0)(st->rng);
        auto delay =
            backoff_delay(policy, attempt, unit, out.http.ok() ? retry_after(out.http.resp) : std::nullopt);
        st->log.info("stripe retry", {{"method", method},
                                      {"path", std::string_view(target).substr(0, target.find('?'))},
                                      {"attempt", attempt},
                                      {"delay_ms", static_cast<std::int64_t>(delay.count())},
                                      {"reason", out.message},
                                      {"request_id", out.request_id}});
        co_await net::sleep_for(delay);
    }
    if (out.replayed && st->metrics) st->metrics->replay(op);
    co_return out;
}

// A place among cfg.max_calls logical calls, taken before the call builds anything (its request, its
// coroutines on the strand, a pool slot): callers beyond the bound wait here holding only their own frame.
net::awaitable<net::admission::ticket> admit(client::state& st) {
    if (!st.calls) co_return net::admission::ticket();
    co_return co_await st.calls->enter();
}

}  // namespace client_detail
}  // namespace cg::stripe
