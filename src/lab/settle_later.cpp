// The lab's settle-later row: a bank debit (Stripe's pm_usBankAccount_* test methods at fake-stripe) answers
// `processing` and fails days later — here, a few hundred milliseconds later.
//
//   unsafe: the real NSQ consumer and Stripe client, a content key, and one mistake: a PaymentIntent that
//           answered 2xx counts as charged, `processing` included. The message is FINed, nobody listens for
//           Stripe's webhooks: when the bank says no, the customer has paid nothing and no one knows (no
//           dead letter, no alert).
//   safe:   the pipeline as `consume` runs it leaves the row `processing`; Stripe's signed webhook reaches
//           the receiver `chargeguard webhooks` runs (app::webhook_receiver behind an http::server on
//           loopback), which turns the row `failed_after_processing` with a dead letter and counts it in
//           chargeguard_billing_failed_after_processing_total (the alert's metric). The customer tops up the
//           account; the operator replays the letter as `chargeguard dead-letters replay` does (reopen the
//           row, publish the stored body, mark the letter); the pipeline charges once under a new key
//           generation.
//
// Two customers: the first's debit fails, the second's succeeds. The run drives its own fake-nsqd and
// consumer (it shares only fake-stripe, the database and the Stripe client with the rest of the lab) and
// throws when the safe run does not end as described, so a row in the table means it did.

#include <asio/co_spawn.hpp>
#include <csignal>
#include <cstdio>
#include <map>
#include <set>

#include "app/webhook_receiver.hpp"
#include "billing/flow/charge_flow.hpp"
#include "billing/flow/nsq_delivery.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/dead_letter_store.hpp"
#include "billing/store/ledger.hpp"
#include "http/server.hpp"
#include "lab/lab.hpp"
#include "lab/run_state.hpp"
#include "metrics/registry.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "nsq/consumer.hpp"
#include "nsq/producer.hpp"
#include "stripe/client.hpp"

namespace cg::lab {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

namespace {

const std::string ns = "lab";
const std::string period = "2026-11";
const std::string channel = "lab";
const std::string secret = "whsec_lab_settle_later";

std::string customer_id(int i) {
    return "cust-settle-" + std::to_string(i);
}
std::string stripe_customer_of(int i) {
    return "cus_lab_settle_" + std::to_string(i);
}
// The first customer's bank has no funds; the others' debits go through.
std::string method_of(int i) {
    return i == 1 ? "pm_usBankAccount_insufficientFunds" : "pm_usBankAccount_success";
}
std::string body_of(int i) {
    return R"({"customer_id":")" + customer_id(i) + R"(","billing_period":")" + period +
           R"(","amount_cents":)" + std::to_string(1000 + i) + R"(,"currency":"usd","stripe_customer_id":")" +
           stripe_customer_of(i) + R"(","description":"settle later","payment_method":")" + method_of(i) +
           R"("})";
}

// need(), naming the row.
template <typename R>
auto must(R r, const std::string& what) {
    return need(std::move(r), "settle-later: " + what);
}
void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error("settle-later safe: " + what);
}

// The value of an unlabelled counter in a Prometheus text rendering (0 when absent).
double counter_value(const std::string& text, const std::string& name) {
    auto at = text.find("\n" + name + " ");
    if (at == std::string::npos) return 0;
    return std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

}  // namespace

// Declared a friend in lab.hpp: it uses the lab's fake-stripe, database and Stripe client.
net::awaitable<row> run_settle_later(lab& L, const scenario& s, variant which) {
    const bool safe = which == variant::safe;
    const int n = s.events;
    const std::string topic = std::string("lab-settle-later-") + (safe ? "safe" : "unsafe");
    auto& log = L.log_;
    auto ex = L.io_.get_executor();

    must(co_await L.admin("POST", "/_admin/reset", ""), "fake-stripe reset");
    must(co_await L.admin("POST", "/_admin/async", "settle_after_ms=300"), "fake-stripe async");
    co_await L.sql("TRUNCATE billing_records, dead_letters, stripe_webhook_events");

    // The safe run's webhook endpoint; the unsafe one registered none.
    metrics::registry reg;
    std::unique_ptr<app::webhook_receiver> receiver;
    std::unique_ptr<http::server> server;
    if (safe) {
        app::webhook_receiver_config rc;
        rc.secrets = {secret};
        receiver = std::make_unique<app::webhook_receiver>(rc, L.pool_, log, reg);
        server = std::make_unique<http::server>(ex, receiver->routes(), http::server_options{}, log);
        auto ep = must(server->listen({"127.0.0.1", 0}), "webhook listener");
        server->start();
        must(co_await L.admin(
                 "POST", "/_admin/webhooks",
                 "url=" +
                     http::url_encode("http://127.0.0.1:" + std::to_string(ep.port()) + "/stripe/webhooks") +
                     "&secrets=" + secret + "&retry_base_ms=100&retry_max_ms=500"),
             "fake-stripe webhooks");
    }

    std::string line;
    std::vector<std::string> argv{L.opts_.fake_nsqd_bin, "--msg-timeout-ms",
                                  std::to_string(L.opts_.msg_timeout.count())};
    auto proc =
        co_await net::offload(L.offload_.get_executor(),
                              spawn_and_wait_line(argv, L.opts_.work_dir + "/fake-nsqd-settle.log", &line));
    if (!proc) throw std::runtime_error("settle-later: fake-nsqd did not start");
    unsigned tcp = 0, hp = 0;
    if (std::sscanf(line.c_str(), "tcp=%u http=%u", &tcp, &hp) != 2)
        throw std::runtime_error("settle-later: fake-nsqd said: " + line);
    const std::string nsqd = "127.0.0.1:" + std::to_string(tcp);

    nsq::producer producer(ex, nsqd, {}, log);
    // Coroutine lambdas here capture nothing: their state comes as parameters (docs/contributing.md).
    auto publish_to = [](nsq::producer& p, std::string t, std::string body) -> net::awaitable<void> {
        must(co_await p.publish(t, std::move(body)), "publish");
    };

    std::set<std::string> keys;
    std::unique_ptr<billing::charge_flow> pipeline;
    if (safe) {
        pipeline =
            std::make_unique<billing::charge_flow>(lab_pipeline_config(ns), *L.ledger_, *L.stripe_, log);
    }
    int running = 0;  // handlers not yet returned: the run ends only once none refers to it
    struct running_guard {
        int& n;
        explicit running_guard(int& x) : n(x) { ++n; }
        ~running_guard() { --n; }
    };
    struct handler_state {
        bool safe;
        std::string topic;
        billing::charge_flow* pipeline;
        int* running;
        std::set<std::string>* keys;
        lab* L;
    };
    auto handle_one = [](handler_state hs, nsq::message& m) -> net::awaitable<nsq::disposition> {
        running_guard g(*hs.running);
        if (hs.safe)  // as `consume` runs a delivery
            co_return billing::to_disposition(
                co_await billing::run_delivery(*hs.pipeline, m, hs.topic, channel, false));
        // The mistake: any 2xx PaymentIntent is a charge, `processing` included.
        auto ev = billing::parse_event(m.body());
        if (!ev) co_return nsq::disposition::finish();
        stripe::payment_intent_request r;
        r.amount = ev->amount_cents;
        r.currency = ev->currency;
        r.customer = ev->stripe_customer_id;
        r.payment_method = ev->payment_method;
        r.metadata = {{"billing_key", billing::base_key(ns, ev->customer_id, ev->billing_period)}};
        r.idempotency_key = billing::base_key(ns, ev->customer_id, ev->billing_period);
        hs.keys->insert(r.idempotency_key);
        nsq::keepalive alive(m);
        auto out = co_await hs.L->stripe_->create_payment_intent(std::move(r));
        if (out.intent) co_return nsq::disposition::finish();  // "charged"
        co_return nsq::disposition::requeue(300ms);
    };
    auto handle = [hs = handler_state{safe, topic, pipeline.get(), &running, &keys, &L},
                   handle_one](nsq::message& m) { return handle_one(hs, m); };
    nsq::consumer_config cc;
    cc.topic = topic;
    cc.channel = channel;
    cc.nsqd_tcp_addresses = {nsqd};
    cc.max_in_flight = 4;
    cc.msg_timeout = L.opts_.msg_timeout;
    lab_consumer_delays(cc);
    // The consumer's connection tasks may still report to its registry after the consumer is gone (until
    // their connections have closed): the registry lives as long as the lab.
    static std::vector<std::unique_ptr<metrics::registry>> consumer_registries;
    auto& creg = *consumer_registries.emplace_back(std::make_unique<metrics::registry>());
    auto consumer = std::make_unique<nsq::consumer>(ex, cc, handle, log, creg);
    must(consumer->start(), "consumer");

    // Until every delivery so far is answered and Stripe has settled every debit and delivered its events.
    auto settle_all = [](lab& L, nsq::consumer& consumer, std::uint64_t deliveries) -> net::awaitable<void> {
        for (auto until = std::chrono::steady_clock::now() + 30s;;) {
            const auto& st = consumer.stats();
            if (st.finished >= deliveries && st.received == st.finished + st.requeued) break;
            if (std::chrono::steady_clock::now() > until)
                throw std::runtime_error("settle-later: deliveries not finished within 30 s");
            co_await net::sleep_for(50ms);
        }
        must(co_await L.admin("GET", "/_admin/webhooks/wait?idle=1&timeout_ms=20000", ""), "webhooks idle");
    };
    auto statuses_of = [](lab& L) -> net::awaitable<std::map<std::string, std::string>> {
        std::map<std::string, std::string> out;
        auto rows = co_await L.sql("SELECT key, status FROM billing_records");
        for (std::size_t i = 0; i < rows.size(); ++i) out[std::string(rows.text(i, 0))] = rows.text(i, 1);
        co_return out;
    };

    for (int i = 1; i <= n; ++i) co_await publish_to(producer, topic, body_of(i));
    co_await settle_all(L, *consumer, static_cast<std::uint64_t>(n));

    const auto failed_key = billing::base_key(ns, customer_id(1), period);
    if (safe) {
        auto st = co_await statuses_of(L);
        expect(st[failed_key] == "failed_after_processing",
               "the failed debit's row is " + st[failed_key] + ", not failed_after_processing");
        billing::dead_letter_store letters(L.pool_);
        auto open = must(co_await letters.list({}), "dead letters");
        expect(open.size() == 1 && open[0].billing_key == failed_key,
               "want one dead letter for the failed debit");
        auto alerts = counter_value(reg.render(), "chargeguard_billing_failed_after_processing_total");
        expect(alerts == 1, "chargeguard_billing_failed_after_processing_total is " + std::to_string(alerts));
        log.info("settle-later: failed after processing, dead-lettered and alerted", {{"key", failed_key}});

        // The customer tops up; the operator replays the letter (`chargeguard dead-letters replay`).
        must(co_await L.admin("POST", "/_admin/bank",
                              "customer=" + stripe_customer_of(1) + "&outcome=succeeded"),
             "fake-stripe bank");
        auto reopened = must(co_await L.ledger_->reopen_for_replay(failed_key, "lab replay"), "reopen");
        expect(reopened.has_value(), "the failed row could not be reopened for the replay");
        co_await publish_to(producer, topic, open[0].raw_body);
        must(co_await letters.mark_replayed(open[0].id, "lab", false), "mark replayed");
        co_await settle_all(L, *consumer, static_cast<std::uint64_t>(n) + 1);
        st = co_await statuses_of(L);
        for (int i = 1; i <= n; ++i) {
            auto k = billing::base_key(ns, customer_id(i), period);
            expect(st[k] == "charged", customer_id(i) + " ends " + st[k] + ", not charged");
        }
    } else {
        // Nobody knows: no ledger, no dead letter, no webhook endpoint, no alert.
        auto dl = co_await L.sql("SELECT count(*) FROM dead_letters");
        std::fprintf(stderr,
                     "settle-later unsafe: every message FINed as charged; %s dead letters, no alert\n",
                     std::string(dl.text(0, 0)).c_str());
    }

    auto cs = consumer->stats();
    co_await consumer->stop();
    consumer.reset();
    co_await producer.close();
    for (auto until = std::chrono::steady_clock::now() + 30s;
         running > 0 && std::chrono::steady_clock::now() < until;)
        co_await net::sleep_for(20ms);
    if (running > 0) throw std::runtime_error("settle-later: handlers still running after the run ended");
    if (server) server->stop();
    co_await net::offload(L.offload_.get_executor(), stop_child(std::move(*proc), SIGTERM));

    row out;
    out.scenario = s.name;
    out.variant = safe ? "safe" : "unsafe";
    out.deliveries = cs.received;
    out.fin_failed = cs.fin_failed;
    out.disconnects = cs.disconnects;
    std::vector<std::string> customers;
    for (int i = 1; i <= n; ++i) {
        customers.push_back(stripe_customer_of(i));
        if (safe)
            for (int g = 1; g <= 5; ++g)
                keys.insert(
                    billing::stripe_idempotency_key(billing::base_key(ns, customer_id(i), period), g));
    }
    co_await L.count_charges(out, std::move(customers));
    co_await L.count_posts(out, std::move(keys));
    co_return out;
}

}  // namespace cg::lab
