// libFuzzer target for the Stripe response readers (src/stripe/json: charges, PaymentIntents, list pages,
// error objects): arbitrary bodies must never crash; an object read as a charge or a PaymentIntent has
// its id; and the same text as the only item of a list page reads as the same object (the page reader
// and the single-object reader agree). Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "check.hpp"
#include "stripe/json.hpp"

using namespace cg::stripe;

namespace {

bool same(const charge& a, const charge& b) {
    return a.id == b.id && a.amount == b.amount && a.currency == b.currency && a.customer == b.customer &&
           a.status == b.status && a.paid == b.paid && a.created == b.created &&
           a.payment_intent == b.payment_intent && a.description == b.description &&
           a.failure_code == b.failure_code && a.metadata == b.metadata;
}

bool same(const payment_intent& a, const payment_intent& b) {
    return a.id == b.id && a.amount == b.amount && a.currency == b.currency && a.customer == b.customer &&
           a.status == b.status && a.latest_charge == b.latest_charge && a.created == b.created &&
           a.last_error_code == b.last_error_code && a.metadata == b.metadata;
}

std::string page_of(std::string_view item, bool more) {
    return std::string("{\"object\":\"list\",\"has_more\":") + (more ? "true" : "false") + ",\"data\":[" +
           std::string(item) + "]}";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view body(reinterpret_cast<const char*>(data), size);
    auto c = parse_charge(body);
    auto p = parse_payment_intent(body);
    // One body is never both kinds: `object` decides.
    FUZZ_CHECK(!(c && p));
    if (c) {
        FUZZ_CHECK(!c->id.empty());
        for (const auto& [k, v] : c->metadata) FUZZ_CHECK(metadata_value(c->metadata, k).has_value());
        auto page = parse_charge_page(page_of(body, size % 2 == 0));
        FUZZ_CHECK(page && page->data.size() == 1 && same(page->data[0], *c) &&
                   page->has_more == (size % 2 == 0));
    }
    if (p) {
        FUZZ_CHECK(!p->id.empty());
        auto page = parse_payment_intent_page(page_of(body, false));
        FUZZ_CHECK(page && page->data.size() == 1 && same(page->data[0], *p) && !page->has_more);
    }
    if (auto cp = parse_charge_page(body)) {
        for (const auto& one : cp->data) FUZZ_CHECK(!one.id.empty());
    }
    if (auto pp = parse_payment_intent_page(body)) {
        for (const auto& one : pp->data) FUZZ_CHECK(!one.id.empty());
    }
    (void)parse_error(body);
    return 0;
}
