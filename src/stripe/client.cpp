// stripe::client: set-up, the reads (retrieve, list, the metadata searches), raw calls and shared pacing.
// The call path is client_call.cpp, the creating POSTs client_create.cpp.
#include "stripe/client.hpp"

#include <asio/co_spawn.hpp>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "net/tls.hpp"
#include "stripe/client_call.hpp"
#include "stripe/error.hpp"
#include "stripe/json.hpp"

namespace cg::stripe {
namespace {

using namespace client_detail;

// client::call: one logical call of its own.
net::awaitable<call_result> run_raw_call(state_ptr st, std::string method, std::string target,
                                         std::string body, std::string key, std::string account) {
    auto start = begin_call(*st);
    auto r = co_await run_call(st, operation::call, std::move(method), std::move(target), std::move(body),
                               std::move(key), std::move(account));
    end_call(*st, operation::call, r.cls, start);
    co_return r;
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
