#include "stripe/refunds.hpp"

#include "http/proto/message.hpp"
#include "stripe/client.hpp"
#include "stripe/error.hpp"
#include "stripe/form.hpp"

namespace cg::stripe {

net::awaitable<refund_outcome> create_refund(client& c, refund_request req) {
    form_map f;
    f.emplace_back("charge", req.charge);
    f.emplace_back("amount", std::to_string(req.amount));
    if (!req.metadata.empty()) {
        form_map md;
        for (const auto& [k, v] : req.metadata) md.emplace_back(k, form_value(v));
        f.emplace_back("metadata", std::move(md));
    }
    auto r = co_await c.call("POST", "/v1/refunds", encode_form(f), std::move(req.idempotency_key),
                             std::move(req.stripe_account));
    refund_outcome out;
    out.cls = r.cls;
    out.http_status = r.http.ok() ? r.http.resp.status : 0;
    out.replayed = r.replayed;
    out.message = std::move(r.message);
    if (r.error) out.error = std::move(*r.error);
    if (out.cls == outcome_class::succeeded) {
        auto parsed = parse_refund(r.http.resp.body);
        if (!parsed) {
            // Done, but we cannot tell which refund: recovery's search finds it by its metadata.
            out.cls = outcome_class::indeterminate;
            out.message = "HTTP " + std::to_string(out.http_status) + " with unreadable body";
        } else {
            out.refund = std::move(*parsed);
        }
    }
    co_return out;
}

net::awaitable<result<std::optional<refund>>> find_refund_by_metadata(client& c, std::string charge,
                                                                      std::string name, std::string value,
                                                                      std::string stripe_account) {
    std::string after;
    for (;;) {
        std::string target = "/v1/refunds?limit=100&charge=" + http::url_encode(charge);
        if (!after.empty()) target += "&starting_after=" + http::url_encode(after);
        auto r = co_await c.call("GET", std::move(target), {}, {}, stripe_account);
        if (r.cls != outcome_class::succeeded) co_return error(errc_for(r.cls), std::move(r.message));
        auto page = parse_refund_page(r.http.resp.body);
        if (!page) co_return page.err();
        for (auto& one : page->data)
            if (metadata_value(one.metadata, name) == value) co_return std::optional<refund>(std::move(one));
        if (!page->has_more || page->data.empty()) co_return std::optional<refund>();
        after = page->data.back().id;
    }
}

}  // namespace cg::stripe
