// fake-stripe's /_admin API: the test hooks of fake_stripe.hpp over HTTP, for tests and tools that run the
// fake as a separate process.
#include "tests/doubles/stripe/fake_stripe.hpp"

// g++ 12 at -O2 reports a false mismatched-new-delete on Asio's coroutine frame allocator for large
// coroutines (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <algorithm>

#include "http/proto/message.hpp"
#include "stripe/form.hpp"
#include "tests/doubles/stripe/lists.hpp"
#include "tests/doubles/stripe/params.hpp"
#include "tests/doubles/stripe/render.hpp"

namespace cg::fake {

using namespace stripe_impl;

asio::awaitable<http::response> fake_stripe::admin(http::request& req) {
    std::string path(req.path());
    auto form = stripe::decode_form(req.body);
    params p = form ? params(form->begin(), form->end()) : params();
    auto num = [&](const char* k, int& field) {
        if (auto v = p.find(k); v != p.end()) field = static_cast<int>(to_int(v->second).value_or(field));
    };
    if (path == "/_admin/charges") co_return admin_list(charges_, charge_json);
    if (path == "/_admin/intents")
        co_return admin_list(
            intents_, [this](const intent_rec& r) { return intent_json(r, default_api_version_, charges_); });
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
        real("refill_s", l.refill_s);
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
    if (path == "/_admin/accounts" && req.method == "POST") {
        std::vector<std::string> customers;
        const auto list = param(p, "customers");
        for (std::size_t pos = 0; pos < list.size();) {
            auto comma = std::min(list.find(',', pos), list.size());
            if (comma > pos) customers.push_back(list.substr(pos, comma - pos));
            pos = comma + 1;
        }
        if (!well_formed_account(param(p, "account")))
            co_return error_response(400, "invalid_request_error", "", "account must look like acct_…");
        add_account(param(p, "account"), customers);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/declines" && req.method == "POST") {
        if (param(p, "clear") == "true") {
            clear_decline(param(p, "customer"));
            co_return json_response(200, "{}");
        }
        decline_rule rule;
        if (p.count("code")) rule.code = param(p, "code");
        if (p.count("decline_code")) rule.decline_code = param(p, "decline_code");
        decline(param(p, "customer"), rule);
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/webhooks" && req.method == "POST") {
        auto e = webhooks_->endpoint();
        auto split = [](const std::string& v) {
            std::vector<std::string> out;
            std::size_t pos = 0;
            while (pos <= v.size()) {
                auto c = v.find(',', pos);
                auto item = v.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
                if (!item.empty()) out.push_back(item);
                if (c == std::string::npos) break;
                pos = c + 1;
            }
            return out;
        };
        if (p.count("url")) e.url = param(p, "url");
        if (p.count("secrets")) e.secrets = split(param(p, "secrets"));
        if (p.count("enabled_events")) e.enabled_events = split(param(p, "enabled_events"));
        if (p.count("ca_file")) e.ca_file = param(p, "ca_file");
        if (p.count("api_version")) e.api_version = param(p, "api_version");
        num("retry_base_ms", e.retry_base_ms);
        num("retry_max_ms", e.retry_max_ms);
        num("max_attempts", e.max_attempts);
        num("timeout_ms", e.timeout_ms);
        webhooks_->configure(std::move(e));
        auto& f = webhooks_->faults();
        num("delay_ms", f.delay_ms);
        num("duplicate", f.duplicate);
        num("reorder", f.reorder);
        num("duplicate_pct", f.duplicate_pct);
        num("reorder_pct", f.reorder_pct);
        num("reorder_hold_ms", f.reorder_hold_ms);
        num("sign_skew_s", f.sign_skew_s);
        co_return json_response(200, "{}");
    }
    auto stats_json = [this] {
        auto st = webhooks_->stats();
        auto n = [](std::uint64_t v) { return static_cast<std::int64_t>(v); };
        return json_obj()
            .num("events", n(st.events))
            .num("attempts", n(st.attempts))
            .num("acked", n(st.acked))
            .num("acked_events", n(st.acked_events))
            .num("failed", n(st.failed))
            .num("duplicates", n(st.duplicates))
            .num("reordered", n(st.reordered))
            .num("given_up", n(st.given_up))
            .num("outstanding", n(st.outstanding))
            .num("pending_settlements", pending_settle_)
            .done();
    };
    if (path == "/_admin/webhooks/deliveries") {
        bool full = http::query_param(req.query(), "full").value_or("") == "1";
        std::string data = "[";
        const auto& ds = webhooks_->deliveries();
        for (std::size_t i = 0; i < ds.size(); ++i) {
            const auto& d = ds[i];
            json_obj o;
            o.str("event", d.event_id)
                .str("type", d.type)
                .num("attempt", d.attempt)
                .num("status", d.status)
                .str_or_null("error", d.error)
                .boolean("duplicate", d.duplicate)
                .boolean("reordered", d.reordered);
            if (full) o.str("signature", d.signature).str("body", d.body);
            data += (i ? "," : "") + o.done();
        }
        co_return json_response(200, json_obj().raw("data", data + "]").raw("stats", stats_json()).done());
    }
    if (path == "/_admin/webhooks/wait") {
        // Awaits acked_events ≥ N, and/or idle=1 (nothing outstanding and no settlement pending).
        int acked = qint(req, "acked_events", -1), events = qint(req, "events", -1);
        bool idle = http::query_param(req.query(), "idle").value_or("") == "1";
        int timeout_ms = std::clamp(qint(req, "timeout_ms", 10000), 0, 600000);
        bool ok = co_await webhooks_->wait(
            [&] {
                auto st = webhooks_->stats();
                if (acked >= 0 && st.acked_events < static_cast<std::uint64_t>(acked)) return false;
                if (events >= 0 && events_.size() < static_cast<std::size_t>(events)) return false;
                if (idle && (!webhooks_->idle() || pending_settle_ > 0)) return false;
                return true;
            },
            std::chrono::milliseconds(timeout_ms));
        co_return json_response(ok ? 200 : 408, stats_json());
    }
    if (path == "/_admin/events") {
        std::string data = "[";
        for (std::size_t i = 0; i < events_.size(); ++i)
            data += (i ? "," : "") + json_obj()
                                         .str("id", events_[i].id)
                                         .str("type", events_[i].type)
                                         .str("object", events_[i].object_id)
                                         .done();
        co_return json_response(200, json_obj().raw("data", data + "]").done());
    }
    if (path == "/_admin/async" && req.method == "POST") {
        int ms = static_cast<int>(settle_after_.count());
        num("settle_after_ms", ms);
        settle_after(std::chrono::milliseconds(ms));
        co_return json_response(200, json_obj().num("settle_after_ms", ms).done());
    }
    if (path == "/_admin/bank" && req.method == "POST") {
        bank_outcome(param(p, "customer"), param(p, "outcome"), param(p, "failure_code"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/settle" && req.method == "POST" && p.count("charge")) {
        if (!settle_charge(param(p, "charge"), param(p, "outcome"), param(p, "failure_code")))
            co_return json_response(409, R"({"error":"no such Charges-API debit pending"})");
        co_return json_response(200, charge_json(*find_charge(param(p, "charge"))));
    }
    if (path == "/_admin/payment_methods/attach" && req.method == "POST") {
        auto id = attach_payment_method(param(p, "customer"), param(p, "account"));
        co_return json_response(200, json_obj().str("id", id).done());
    }
    if (path == "/_admin/customers/default" && req.method == "POST") {
        set_default_payment_method(param(p, "customer"), param(p, "payment_method"), param(p, "account"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/customers" && req.method == "POST") {
        default_source(param(p, "customer"), param(p, "default_source"));
        co_return json_response(200, "{}");
    }
    if (path == "/_admin/settle" && req.method == "POST") {
        bool ok = settle(param(p, "payment_intent"), param(p, "outcome"), param(p, "failure_code"));
        if (!ok) co_return json_response(409, R"({"error":"no such payment intent processing"})");
        co_return json_response(
            200, intent_json(*find_intent(param(p, "payment_intent")), default_api_version_, charges_));
    }
    if (path == "/_admin/disputes" && req.method == "POST") {
        auto id = open_dispute(param(p, "charge"), p.count("reason") ? param(p, "reason") : "fraudulent",
                               to_int(param(p, "amount")).value_or(0), param(p, "inquiry") == "true");
        if (id.empty())
            co_return json_response(409, R"({"error":"charge missing, not succeeded or disputed"})");
        co_return json_response(200, dispute_json(disputes_.back()));
    }
    if (path == "/_admin/disputes/close" && req.method == "POST") {
        if (!close_dispute(param(p, "dispute"), param(p, "status")))
            co_return json_response(
                409, R"({"error":"no such open dispute, or status not won|lost|warning_closed"})");
        for (const auto& d : disputes_)
            if (d.id == param(p, "dispute")) co_return json_response(200, dispute_json(d));
    }
    if (path == "/_admin/disputes/update" && req.method == "POST") {
        if (!update_dispute(param(p, "dispute"), param(p, "status")))
            co_return json_response(409, R"({"error":"no such open dispute, or not a step Stripe takes"})");
        for (const auto& d : disputes_)
            if (d.id == param(p, "dispute")) co_return json_response(200, dispute_json(d));
    }
    if (path == "/_admin/reset" && req.method == "POST") {
        reset();
        co_return json_response(200, "{}");
    }
    co_return http::make_response(404, "unknown admin endpoint\n");
}

}  // namespace cg::fake
