// Prints, as a stream of JSON objects (events pretty-printed as Stripe sends them), what the conformance
// check (check.py) validates against Stripe's published API description:
//   {"kind":"request","origin":"chargeguard",…}  every request chargeguard's own code builds — the billing
//       pipeline's creates (billing::build_request → stripe::client), recovery's and the poll's retrieves,
//       the searches and backfill's lists, the corrections' refunds — as fake-stripe received it, with its
//       answer;
//   {"kind":"request","origin":"sample",…}  requests that make fake-stripe show the rest of what it can say
//       (a Charges-API bank debit, disputes through their lifecycle, refunds that fail, the searches the
//       vault proxy forwards), with their answers;
//   {"kind":"event",…}  every event fake-stripe made;
//   {"kind":"verdict","enum":…,"value":…,"verdict":…}  with --verdicts FILE (lines "enum<TAB>value"): what
//       chargeguard's code makes of each value.
// Usage: stripe_conformance_capture CERT_DIR [--verdicts FILE]
// g++ 12 -O2 false positive on Asio coroutine frames (GCC bug 109224).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <variant>
#include <vector>

#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/machine/outcome.hpp"
#include "billing/machine/settlement.hpp"
#include "core/log.hpp"
#include "http/proto/message.hpp"
#include "net/offload.hpp"
#include "net/tls.hpp"
#include "stripe/client.hpp"
#include "stripe/outcome.hpp"
#include "stripe/refunds.hpp"
#include "support/run_async.hpp"
#include "tests/doubles/stripe/fake_stripe.hpp"

using namespace cg;
using namespace std::chrono_literals;

namespace {

std::string js(std::string_view s) {
    std::string out;
    append_json_string(out, s);
    return out;
}

billing::billing_event event_of(std::string customer, std::string stripe_customer, std::string pm = {},
                                bool off_session = true, std::string account = {}) {
    billing::billing_event ev;
    ev.customer_id = std::move(customer);
    ev.billing_period = "2026-11";
    ev.amount_cents = 4200;
    ev.currency = "usd";
    ev.stripe_customer_id = std::move(stripe_customer);
    ev.description = "plan 2026-11";
    ev.payment_method = std::move(pm);
    ev.off_session = off_session;
    ev.stripe_account = std::move(account);
    return ev;
}

// The pipeline's create call for an event, as it makes it.
asio::awaitable<stripe::charge_outcome> charge_event(stripe::client& c, billing::billing_event ev,
                                                     std::int32_t generation = 1) {
    const auto base = billing::base_key("conformance", ev.customer_id, ev.billing_period, ev.stripe_account);
    auto req = billing::build_request(ev, base, generation);
    if (auto* ch = std::get_if<stripe::charge_request>(&req)) co_return co_await c.create_charge(*ch);
    co_return co_await c.create_payment_intent(std::get<stripe::payment_intent_request>(req));
}

// The reads sampled from fake-stripe (built outside the coroutine: g++ 12 mishandles braced lists of
// temporaries in coroutine frames).
std::vector<std::string> sample_reads(const std::string& base, const std::string& debit,
                                      const std::string& dp, const std::string& dq) {
    return {
        "/v1/charges/search?query=" + http::url_encode("metadata['billing_key']:'" + base + "'"),
        "/v1/charges/search?query=" +
            http::url_encode("customer:'cus_ok' AND metadata['billing_key']:'" + base + "'") + "&limit=1",
        "/v1/payment_intents/search?query=" + http::url_encode("customer:'cus_ok'"),
        "/v1/charges/" + debit,
        "/v1/disputes/" + dp,
        "/v1/disputes/" + dq,
        "/v1/disputes?limit=10",
        "/v1/refunds?limit=10",
        "/v1/events?limit=100",
    };
}

// What the code makes of one enum value.
std::string verdict(const std::string& name, const std::string& value) {
    using namespace billing;
    if (name == "payment_intent.status") return std::string(to_string(fact_kind_for_intent_status(value)));
    if (name == "charge.status") return std::string(to_string(fact_kind_for_charge_status(value)));
    if (name == "event.type") return std::string(to_string(fact_kind_for_event(value)));
    if (name == "dispute.status") {
        // A charged row's dispute event in this status: is it disputed money, or an inquiry's note?
        settlement_row row;
        row.status = record_status::charged;
        row.amount_cents = 1000;
        row.charge_id = "ch_1";
        payment_fact f;
        f.kind = fact_kind::dispute_opened;
        f.charge_id = "ch_1";
        f.status = value;
        f.dispute_amount = 1000;
        auto n = apply_fact(row, f).row;
        return n.disputed_cents > 0 ? "disputed_money" : "recorded_no_money";
    }
    if (name == "error.type") {
        // At the status Stripe answers that type with.
        const int status = value == "card_error" ? 402 : value == "api_error" ? 500 : 400;
        stripe::response_facts f;
        f.status = status;
        f.error_type = value;
        return std::string(stripe::to_string(stripe::classify_response(f)));
    }
    return "?";
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s CERT_DIR [--verdicts FILE]\n", argv[0]);
        return 2;
    }
    const std::string certs = argv[1];
    if (argc == 4 && std::string(argv[2]) == "--verdicts") {
        std::ifstream in(argv[3]);
        std::string line;
        while (std::getline(in, line)) {
            auto tab = line.find('\t');
            if (tab == std::string::npos) continue;
            auto name = line.substr(0, tab), value = line.substr(tab + 1);
            std::cout << "{\"kind\":\"verdict\",\"enum\":" << js(name) << ",\"value\":" << js(value)
                      << ",\"verdict\":" << js(verdict(name, value)) << "}\n";
        }
        return 0;
    }

    asio::io_context io{1};
    net::offload_pool pool{2};
    auto tls = net::make_tls_server_context({certs + "/server.pem", certs + "/server.key"});
    if (!tls) {
        std::fprintf(stderr, "tls: %s\n", tls.err().describe().c_str());
        return 1;
    }
    fake::fake_stripe fake(io.get_executor(), *tls, logger());
    auto ep = fake.listen({"127.0.0.1", 0});
    if (!ep) return 1;
    fake.start();
    fake.record_requests(true);
    fake.settle_after(std::chrono::hours(1));  // settled by hand below
    fake.decline("cus_declined");
    fake.decline("cus_sca", {"authentication_required", ""});
    fake.add_account("acct_1Conformance", {"cus_connected"});
    fake.default_source("cus_ach", "ba_1ConformanceBank");

    stripe::client_config cfg;
    cfg.api_base = "https://127.0.0.1:" + std::to_string(ep->port());
    cfg.api_key = "sk_test_conformance";
    cfg.ca_file = certs + "/ca.pem";
    cfg.retry = {0, 10ms, 40ms};
    auto made = stripe::client::create(pool.get_executor(), cfg, logger(), nullptr);
    if (!made) return 1;
    auto& c = **made;
    std::size_t own_requests = 0;
    bool ok = true;

    test::run_async(
        io,
        [&]() -> asio::awaitable<void> {
            // The billing pipeline: a card charge, PaymentIntents (card, bank debit, declined, authentication
            // off and on session), a retried generation, a connected account's charge.
            auto card = co_await charge_event(c, event_of("c-card", "cus_ok"));
            auto pi = co_await charge_event(c, event_of("c-pi", "cus_ok", "pm_card_visa"));
            auto ach = co_await charge_event(c, event_of("c-ach", "cus_bank", "pm_usBankAccount_success"));
            co_await charge_event(c, event_of("c-declined", "cus_declined"));
            co_await charge_event(c, event_of("c-sca", "cus_sca", "pm_card_visa"));
            co_await charge_event(c, event_of("c-sca-on", "cus_sca", "pm_card_visa", false));
            co_await charge_event(c, event_of("c-card", "cus_ok"), 2);
            auto conn =
                co_await charge_event(c, event_of("c-conn", "cus_connected", {}, true, "acct_1Conformance"));
            auto debit = co_await charge_event(c, event_of("c-debit", "cus_ach"));
            // Recovery, the poll and reconcile: retrieves, and the search by billing key over the lists.
            co_await c.retrieve_charge(card.charge_id);
            co_await c.retrieve_payment_intent(pi.payment_intent_id);
            co_await c.retrieve_payment_intent(ach.payment_intent_id);
            co_await c.retrieve_charge_if_any("ch_1NoSuchCharge");
            co_await c.retrieve_charge(conn.charge_id, "acct_1Conformance");
            const auto base = billing::base_key("conformance", "c-card", "2026-11");
            co_await c.find_charge_by_billing_key("cus_ok", base, fake.now() - 3600, 1);
            co_await c.find_payment_intent_by_billing_key("cus_ok", base, fake.now() - 3600, 100);
            // Backfill: the account's whole list, page by page.
            stripe::list_charges_request all;
            all.limit = 2;
            all.created_gte = fake.now() - 86400;
            auto page = co_await c.list_charges(all);
            if (page && !page->data.empty()) {
                all.starting_after = page->data.back().id;
                co_await c.list_charges(all);
            }
            stripe::list_request intents;
            intents.customer = "cus_ok";
            co_await c.list_payment_intents(intents);
            // Corrections: a refund and the search of the charge's refunds.
            stripe::refund_request rr;
            rr.charge = card.charge_id;
            rr.amount = 1000;
            rr.metadata = {{"correction_key", "conformance-corr-1"}};
            rr.idempotency_key = "conformance-refund-1";
            auto refund = co_await stripe::create_refund(c, rr);
            co_await stripe::find_refund_by_metadata(c, card.charge_id, "correction_key",
                                                     "conformance-corr-1");
            own_requests = fake.request_log().size();

            // What else fake-stripe can say: the debit settles, disputes run their course, a refund fails,
            // the vault proxy's forwarded searches and reads.
            fake.settle_charge(debit.charge_id, "succeeded");
            fake.settle(ach.payment_intent_id, "succeeded");
            auto dp = fake.open_dispute(pi.charge_id);
            fake.update_dispute(dp, "under_review");
            fake.update_dispute(dp, "won");
            auto inquiry = co_await charge_event(c, event_of("c-inquiry", "cus_ok", "pm_card_visa"));
            auto dq = fake.open_dispute(inquiry.charge_id, "general", 0, true);
            fake.update_dispute(dq, "warning_under_review");
            fake.update_dispute(dq, "warning_closed");
            if (refund.refund) fake.end_refund(refund.refund->id, "failed");
            // A customer's card changes: payment_method.attached, then customer.updated naming the old
            // default in previous_attributes (what `webhooks --retry-declined-on-payment-method-change`
            // reads).
            auto pm = fake.attach_payment_method("cus_ok");
            fake.set_default_payment_method("cus_ok", pm);
            const auto reads = sample_reads(base, debit.charge_id, dp, dq);
            for (const auto& target : reads) {
                auto r = co_await c.call("GET", target, "", "");
                if (r.http.resp.status != 200) ok = false;
            }
        },
        60s);

    const auto& log = fake.request_log();
    for (std::size_t i = 0; i < log.size(); ++i) {
        const auto& r = log[i];
        std::cout << "{\"kind\":\"request\",\"origin\":" << js(i < own_requests ? "chargeguard" : "sample")
                  << ",\"method\":" << js(r.method) << ",\"path\":" << js(r.path)
                  << ",\"query\":" << js(r.query) << ",\"body\":" << js(r.body)
                  << ",\"stripe_version\":" << js(r.stripe_version) << ",\"account\":" << js(r.account)
                  << ",\"status\":" << r.status
                  << ",\"response\":" << (r.response.empty() ? std::string("null") : r.response) << "}\n";
    }
    for (const auto& e : fake.events()) std::cout << "{\"kind\":\"event\",\"body\":" << e.body << "}\n";
    fake.stop();
    return ok ? 0 : 1;
}
