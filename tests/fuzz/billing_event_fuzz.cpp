// libFuzzer target for the billing event reader (the body of every NSQ message): arbitrary bodies must
// never crash; an event that reads satisfies every rule parse_event documents; to_json of it reads back
// as the same event (the sweeper's stand-in deliveries depend on that), and a rejection names its reason.
// Built and run by ci/fuzz.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "billing/machine/event.hpp"
#include "check.hpp"

using namespace cg::billing;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::string_view body(reinterpret_cast<const char*>(data), size);
    auto e = parse_event(body);
    if (!e) {
        FUZZ_CHECK(e.code().category() == event_category() && !e.err().message.empty());
        return 0;
    }
    FUZZ_CHECK(size <= max_event_bytes);
    FUZZ_CHECK(!e->customer_id.empty() && e->customer_id.size() <= 255);
    FUZZ_CHECK(!e->billing_period.empty() && e->billing_period.size() <= 64);
    // A correction carries the period's new total, which may be 0 (everything refunded); a charge moves
    // money.
    FUZZ_CHECK(e->amount_cents >= (e->is_correction() ? 0 : 1) && e->amount_cents <= 99'999'999);
    FUZZ_CHECK(e->currency.size() == 3);
    for (char c : e->currency) FUZZ_CHECK(c >= 'a' && c <= 'z');
    FUZZ_CHECK(e->stripe_customer_id.starts_with("cus_"));
    FUZZ_CHECK(e->description.size() <= 500);
    FUZZ_CHECK(e->uses_payment_intent() || e->off_session);
    auto again = parse_event(to_json(*e));
    FUZZ_CHECK(again);
    FUZZ_CHECK(again->customer_id == e->customer_id && again->billing_period == e->billing_period &&
               again->amount_cents == e->amount_cents && again->currency == e->currency &&
               again->stripe_customer_id == e->stripe_customer_id && again->description == e->description &&
               again->payment_method == e->payment_method && again->off_session == e->off_session &&
               again->stripe_account == e->stripe_account && again->revision == e->revision);
    return 0;
}
