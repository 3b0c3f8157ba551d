#include "stripe/client.hpp"

#include <asio/co_spawn.hpp>
#include <charconv>
#include <map>
#include <random>

#include "http/proto/message.hpp"
#include "net/admission.hpp"
#include "net/boxed.hpp"
#include "net/error.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "net/tls.hpp"
#include "stripe/client_metrics.hpp"
#include "stripe/error.hpp"
#include "stripe/fact.hpp"
#include "stripe/form.hpp"
#include "stripe/json.hpp"
#include "stripe/pacer.hpp"

namespace cg::stripe {

struct client::state {
    client_config cfg;
    logger log;
    std::unique_ptr<http::client> http;
    std::unique_ptr<client_metrics> metrics;  // null: no registry given
    std::shared_ptr<pacer> pace;              // null: no rate control
    std::unique_ptr<net::admission> calls;    // null: no bound on logical calls at once (cfg.max_calls)
    // Stripe limits each connected account on its own: one pacer per Stripe-Account, made on first use
    // (only with rate control on). Used only on the http client's strand.
    std::map<std::string, std::shared_ptr<pacer>, std::less<>> account_pace;
    std::mt19937_64 rng{std::random_device{}()};  // jitter; used only on the http client's strand
};

namespace {

using state_ptr = std::shared_ptr<client::state>;
using steady = std::chrono::steady_clock;

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

// client::call: one logical call of its own.
net::awaitable<call_result> run_raw_call(state_ptr st, std::string method, std::string target,
                                         std::string body, std::string key, std::string account) {
    auto start = begin_call(*st);
    auto r = co_await run_call(st, operation::call, std::move(method), std::move(target), std::move(body),
                               std::move(key), std::move(account));
    end_call(*st, operation::call, r.cls, start);
    co_return r;
}

charge_outcome base_outcome(call_result&& r) {
    charge_outcome o;
    o.cls = r.cls;
    o.http_status = r.http.ok() ? r.http.resp.status : 0;
    o.request_id = std::move(r.request_id);
    o.replayed = r.replayed;
    o.attempts = r.attempts;
    o.message = std::move(r.message);
    if (r.error) {
        o.error = std::move(*r.error);
        o.charge_id = o.error.charge;
        o.payment_intent_id = o.error.payment_intent;
    }
    return o;
}

// A 2xx whose body we cannot read still means "done", but we do not know the object: let billing
// resolve it through the list like any other unknown.
void unreadable(charge_outcome& o, const cg::error& e) {
    o.cls = outcome_class::indeterminate;
    o.message = "HTTP " + std::to_string(o.http_status) + " with unreadable body: " + e.message;
}

form_map meta_form(const metadata& m) {
    form_map out;
    for (const auto& [k, v] : m) out.emplace_back(k, form_value(v));
    return out;
}

// The outcome of POST /v1/charges, read through the fact (stripe/fact.hpp): a 200 whose charge failed is a
// decline; a pending one is in flight; a status the pinned API version does not define says nothing certain,
// so the row is left for the search (indeterminate) rather than recorded as charged.
void read_charge(charge_outcome& o, const std::string& body) {
    auto c = parse_charge(body);
    if (!c) return unreadable(o, c.err());
    o.charge_id = c->id;
    o.payment_intent_id = c->payment_intent;
    auto f = read(*c);
    if (f.moved == movement::failed) {
        o.cls = outcome_class::declined;
        o.message = "charge " + c->id + " failed: " + c->failure_code;
    } else if (f.moved == movement::in_flight) {
        o.in_flight_status = c->status;
        o.message = "charge " + c->id + " is " + c->status;
    } else if (f.moved != movement::charged) {
        o.cls = outcome_class::indeterminate;
        o.message = "charge " + c->id + ": " + f.reason;
    }
    o.charge = std::move(*c);
}

// The outcome of a confirmed POST /v1/payment_intents, read through the fact: the charge recorded is the
// intent's latest_charge. succeeded settled; processing and requires_capture are in flight (in_flight_status:
// not a charge yet). requires_payment_method, requires_action and canceled mean the customer would have to
// act: a final decline for a billing run. requires_confirmation (Stripe never tried the payment method: the
// confirm did not run) and a status the pinned version does not define are not an answer: indeterminate, so
// the recovery search reads the intent again (where requires_confirmation is "not charged": a new key
// generation).
void read_intent(charge_outcome& o, const std::string& body) {
    auto p = parse_payment_intent(body);
    if (!p) return unreadable(o, p.err());
    o.payment_intent_id = p->id;
    o.charge_id = p->latest_charge;
    auto f = read(*p);
    switch (f.moved) {
        case movement::charged:
            break;
        case movement::in_flight:
        case movement::authorised:
            o.in_flight_status = p->status;
            o.message = "payment intent " + p->id + " is " + p->status;
            break;
        case movement::failed:
        case movement::needs_customer:
        case movement::canceled:
            o.cls = outcome_class::declined;
            o.message = "payment intent " + p->id + " is " + p->status;
            if (!p->last_error_code.empty()) o.message += ": " + p->last_error_code;
            break;
        default:
            o.cls = outcome_class::indeterminate;
            o.message = "payment intent " + p->id + " is " + p->status + ": " + f.reason;
            break;
    }
    o.intent = std::move(*p);
}

// A creating POST: the operation names the endpoint and how its 2xx body is read; everything else (key,
// retries, classification, metrics) is shared.
struct create_op {
    operation op;
    const char* path;
    void (*read_success)(charge_outcome&, const std::string&);
};
constexpr create_op charge_op{operation::create_charge, "/v1/charges", read_charge};
constexpr create_op intent_op{operation::create_payment_intent, "/v1/payment_intents", read_intent};

net::awaitable<charge_outcome> run_create(state_ptr st, create_op op, std::string form, std::string key,
                                          std::string account) {
    auto start = begin_call(*st);
    auto r =
        co_await run_call(st, op.op, "POST", op.path, std::move(form), std::move(key), std::move(account));
    std::string body = r.http.ok() ? std::move(r.http.resp.body) : std::string();
    charge_outcome o = base_outcome(std::move(r));
    if (o.cls == outcome_class::succeeded) op.read_success(o, body);
    end_call(*st, op.op, o.cls, start);
    co_return o;
}

// amount, currency, customer, then `extra`, then description and metadata (the order Stripe's SDKs use).
std::string create_form(std::int64_t amount, const std::string& currency, const std::string& customer,
                        form_map extra, const std::string& description, const metadata& md) {
    form_map f;
    f.emplace_back("amount", std::to_string(amount));
    f.emplace_back("currency", currency);
    f.emplace_back("customer", customer);
    for (auto& e : extra) f.push_back(std::move(e));
    if (!description.empty()) f.emplace_back("description", description);
    if (!md.empty()) f.emplace_back("metadata", meta_form(md));
    return encode_form(f);
}

std::string charge_form(const charge_request& req) {
    return create_form(req.amount, req.currency, req.customer, {}, req.description, req.metadata);
}

// Since API version 2023-08-16 an intent created without `payment_method_types` accepts the payment methods
// enabled in the Dashboard, redirect-based ones included, and Stripe refuses to confirm it without a
// `return_url`. A server-side confirmation has no page to return to, so it enables automatic payment methods
// with redirects never allowed: every method that can be charged without the customer present (cards and the
// bank debits: us_bank_account, sepa_debit, bacs_debit, acss_debit, au_becs_debit, link) stays accepted, on
// the pinned version and on older ones alike, and nothing that needs a redirect can be confirmed.
std::string intent_form(const payment_intent_request& req) {
    form_map extra;
    if (!req.payment_method.empty()) extra.emplace_back("payment_method", req.payment_method);
    if (req.confirm) {
        extra.emplace_back("automatic_payment_methods",
                           form_map{{"enabled", "true"}, {"allow_redirects", "never"}});
        extra.emplace_back("confirm", "true");
    }
    if (req.off_session) extra.emplace_back("off_session", "true");
    return create_form(req.amount, req.currency, req.customer, std::move(extra), req.description,
                       req.metadata);
}

// A read. A 2xx whose body is not the object counts as `indeterminate` in the metrics, as for creates. With
// `absent_on_404`, Stripe's 404 is "no such object" (nullopt) instead of an error.
template <typename T, typename Parse>
net::awaitable<result<std::optional<T>>> run_read(state_ptr st, operation op, std::string target, Parse parse,
                                                  bool absent_on_404, std::string account) {
    auto start = begin_call(*st);
    auto r = co_await run_call(st, op, "GET", std::move(target), {}, {}, std::move(account));
    result<std::optional<T>> out = std::optional<T>();
    if (r.cls == outcome_class::succeeded) {
        auto parsed = parse(r.http.resp.body);
        if (parsed)
            out = std::optional<T>(std::move(*parsed));
        else
            out = parsed.err();
    } else if (!(absent_on_404 && r.http.ok() && r.http.resp.status == 404)) {
        out = error(errc_for(r.cls), std::move(r.message));
    }
    end_call(*st, op, out ? r.cls : outcome_class::indeterminate, start);
    co_return out;
}

template <typename T, typename Parse>
net::awaitable<result<T>> run_get(state_ptr st, operation op, std::string target, Parse parse,
                                  std::string account) {
    auto r = co_await run_read<T>(std::move(st), op, std::move(target), parse, false, std::move(account));
    if (!r) co_return r.err();
    co_return std::move(**r);
}

std::string list_target(std::string_view path, const list_request& req) {
    // No customer: the account's whole list (the ledger's backfill).
    std::string t = std::string(path) + "?limit=" + std::to_string(req.limit);
    if (!req.customer.empty()) t += "&customer=" + http::url_encode(req.customer);
    if (req.created_gte) t += "&created[gte]=" + std::to_string(*req.created_gte);
    if (!req.starting_after.empty()) t += "&starting_after=" + http::url_encode(req.starting_after);
    return t;
}

// A list endpoint and how its page is read: charges or PaymentIntents.
template <typename Page>
struct list_op {
    operation op;
    const char* path;
    result<Page> (*parse)(std::string_view);
};
constexpr list_op<charge_page> charges_list{operation::list_charges, "/v1/charges", parse_charge_page};
constexpr list_op<payment_intent_page> intents_list{operation::list_payment_intents, "/v1/payment_intents",
                                                    parse_payment_intent_page};

// Pages through the customer's objects (newest first) for the first whose metadata[name] is `value`.
template <typename Page>
net::awaitable<result<std::optional<typename decltype(Page::data)::value_type>>> run_find(
    state_ptr st, list_op<Page> what, std::string customer, std::string name, std::string value,
    std::optional<std::int64_t> created_gte, unsigned page_size, std::string account) {
    using item = typename decltype(Page::data)::value_type;
    list_request req;
    req.limit = page_size;
    req.customer = std::move(customer);
    req.created_gte = created_gte;
    for (;;) {
        auto page = co_await run_get<Page>(st, what.op, list_target(what.path, req), what.parse, account);
        if (!page) co_return page.err();
        for (auto& one : page->data)
            if (metadata_value(one.metadata, name) == value) co_return std::optional<item>(std::move(one));
        if (!page->has_more || page->data.empty()) co_return std::optional<item>();
        req.starting_after = page->data.back().id;
    }
}

// Runs `a` on the client's strand and resumes the caller on its own executor.
template <typename T>
net::awaitable<T> on_strand(state_ptr st, net::awaitable<T> a) {
    // The hand-off (net/offload.hpp): the caller's cancellation stays on the caller's thread.
    co_return co_await net::offload(st->http->get_executor(), std::move(a));
}

// A place among cfg.max_calls logical calls, taken before the call builds anything (its request, its
// coroutines on the strand, a pool slot): callers beyond the bound wait here holding only their own frame.
net::awaitable<net::admission::ticket> admit(client::state& st) {
    if (!st.calls) co_return net::admission::ticket();
    co_return co_await st.calls->enter();
}

}  // namespace

result<std::unique_ptr<client>> client::create(asio::any_io_executor offload, client_config cfg, logger log,
                                               metrics::registry* metrics, asio::any_io_executor connect_on) {
    if (cfg.api_key.empty())
        return error(errc::bad_config, "no Stripe API key (STRIPE_API_KEY or --stripe-key-file)");
    if (cfg.api_key.find_first_of("\r\n") != std::string::npos)
        return error(errc::bad_config, "API key contains a line break");
    http::client_options o;
    o.max_connections = cfg.max_connections;
    o.growth.eager = cfg.eager_connections;
    o.connect_timeout = cfg.connect_timeout;
    o.request_timeout = cfg.request_timeout;
    o.connect_executor = std::move(connect_on);
    if (cfg.api_base.starts_with("https://")) {
        auto tls = net::make_tls_client_context({cfg.ca_file});
        if (!tls) return tls.err();
        o.tls = *tls;
    }
    auto h = http::client::create(offload, cfg.api_base, std::move(o), log);
    if (!h) return error(errc::bad_config, "--stripe-api-base: " + h.err().message);
    auto st = std::make_shared<state>();
    st->cfg = std::move(cfg);
    st->log = std::move(log);
    st->http = std::move(*h);
    if (metrics) st->metrics = std::make_unique<client_metrics>(*metrics);
    if (st->cfg.max_calls > 0) st->calls = std::make_unique<net::admission>(st->cfg.max_calls);
    if (st->cfg.rate.max_rps > 0 || st->cfg.rate.adaptive)
        st->pace = pacer::create(st->http->get_executor(), st->cfg.rate);
    return std::unique_ptr<client>(new client(std::move(st)));
}

client::client(std::shared_ptr<state> st) : st_(std::move(st)) {}

namespace {

net::awaitable<std::vector<client::pace_report>> reports_on_strand(state_ptr st) {
    std::vector<client::pace_report> out;
    if (!st->pace) co_return out;
    out.push_back({"", st->pace->take_report()});
    for (auto& [account, p] : st->account_pace) out.push_back({account, p->take_report()});
    co_return out;
}

net::awaitable<void> apply_on_strand(state_ptr st, std::vector<client::pace_view> views) {
    if (!st->pace) co_return;
    auto apply = [&](const std::string& account, pacer& p) {
        for (auto& v : views)
            if (v.account == account) return p.apply_peers(v.peers.data(), v.peers.size(), v.self);
        p.apply_peers(nullptr, 0, 0);
    };
    apply("", *st->pace);
    for (auto& [account, p] : st->account_pace) apply(account, *p);
}

}  // namespace

net::awaitable<std::vector<client::pace_report>> client::pace_reports() {
    co_return co_await on_strand(st_, reports_on_strand(st_));
}

net::awaitable<void> client::apply_pace(std::vector<pace_view> views) {
    co_await on_strand(st_, apply_on_strand(st_, std::move(views)));
}
client::~client() = default;

net::awaitable<client::call_turn> client::turn() {
    co_return co_await admit(*st_);
}

net::awaitable<charge_outcome> client::create_charge(charge_request req, call_turn turn) {
    if (!turn.held()) turn = co_await admit(*st_);
    std::string key = std::move(req.idempotency_key);
    co_return co_await on_strand(
        st_, run_create(st_, charge_op, charge_form(req), std::move(key), std::move(req.stripe_account)));
}

net::awaitable<charge_outcome> client::create_payment_intent(payment_intent_request req, call_turn turn) {
    if (!turn.held()) turn = co_await admit(*st_);
    std::string key = std::move(req.idempotency_key);
    co_return co_await on_strand(
        st_, run_create(st_, intent_op, intent_form(req), std::move(key), std::move(req.stripe_account)));
}

net::awaitable<result<charge>> client::retrieve_charge(std::string id, std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_get<charge>(st_, operation::retrieve_charge, "/v1/charges/" + http::url_encode(id),
                             parse_charge, std::move(stripe_account)));
}

net::awaitable<result<std::optional<charge>>> client::retrieve_charge_if_any(std::string id,
                                                                             std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_read<charge>(st_, operation::retrieve_charge, "/v1/charges/" + http::url_encode(id),
                              parse_charge, true, std::move(stripe_account)));
}

net::awaitable<result<payment_intent>> client::retrieve_payment_intent(std::string id,
                                                                       std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_get<payment_intent>(st_, operation::retrieve_payment_intent,
                                     "/v1/payment_intents/" + http::url_encode(id), parse_payment_intent,
                                     std::move(stripe_account)));
}

net::awaitable<result<charge_page>> client::list_charges(list_charges_request req) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_get<charge_page>(st_, operation::list_charges, list_target(charges_list.path, req),
                                  parse_charge_page, req.stripe_account));
}

net::awaitable<result<payment_intent_page>> client::list_payment_intents(list_request req) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_get<payment_intent_page>(st_, operation::list_payment_intents,
                                          list_target(intents_list.path, req), parse_payment_intent_page,
                                          req.stripe_account));
}

net::awaitable<result<std::optional<charge>>> client::find_charge_by_metadata(
    std::string customer, std::string name, std::string value, std::optional<std::int64_t> created_gte,
    unsigned page_size, std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_find(st_, charges_list, std::move(customer), std::move(name), std::move(value), created_gte,
                      page_size, std::move(stripe_account)));
}

net::awaitable<result<std::optional<payment_intent>>> client::find_payment_intent_by_metadata(
    std::string customer, std::string name, std::string value, std::optional<std::int64_t> created_gte,
    unsigned page_size, std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(
        st_, run_find(st_, intents_list, std::move(customer), std::move(name), std::move(value), created_gte,
                      page_size, std::move(stripe_account)));
}

net::awaitable<call_result> client::call(std::string method, std::string target, std::string body,
                                         std::string idempotency_key, std::string stripe_account) {
    auto turn = co_await admit(*st_);
    co_return co_await on_strand(st_, run_raw_call(st_, std::move(method), std::move(target), std::move(body),
                                                   std::move(idempotency_key), std::move(stripe_account)));
}

std::size_t client::calls_waiting() const {
    return st_->calls ? st_->calls->waiting() : 0;
}

const client_config& client::config() const noexcept {
    return st_->cfg;
}
http::client_stats client::http_stats() const {
    return st_->http->stats();
}

}  // namespace cg::stripe
