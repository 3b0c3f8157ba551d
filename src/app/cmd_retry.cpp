// `chargeguard retry-declined`: charge a declined key again once the customer's payment method is fixed.
//
//   chargeguard retry-declined --customer C --period P [--stripe-account A] --reason R --nsqd-tcp-address H:P
//   chargeguard retry-declined --key K --reason R …
//   chargeguard retry-declined --period P --all --reason R …
//
// For each declined row: a PaymentIntent the decline left open (requires_action, requires_payment_method,
// requires_confirmation) is cancelled at Stripe first, so it can never succeed beside the retry — and one
// that succeeded meanwhile (the customer authenticated it) makes the row charged instead, with nothing
// retried. Then the row is reopened under a new key generation with the retry recorded
// (billing/retry_store.hpp), and the event, rebuilt from the row, is published to the topic: `consume`
// charges it once under the new key. Reopen first, publish second: a crash in between leaves a pending row
// the sweeper charges (or a second run of the command publishes, see below); the other order would publish
// an event that meets the declined row and is finished as a duplicate. A row already reopened by a retry
// and still pending is published again (harmless: the ledger's lease decides who charges); any other state
// is reported and left alone. Exit 0 when every row asked for was retried (or found charged), 2 when some
// were not declined, 1 on a failure (PostgreSQL, Stripe, nsqd).
#include <asio/io_context.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/pg_flags.hpp"
#include "app/stripe_flags.hpp"
#include "billing/event.hpp"
#include "billing/retry_store.hpp"
#include "net/address.hpp"
#include "net/offload.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"
#include "stripe/client.hpp"
#include "stripe/fact.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
// A named namespace, not an anonymous one: the unity build joins the app's files into one unit.
namespace retry_impl {

struct retry_flags {
    pg_flags pg;
    stripe_flags stripe;
    std::string customer, period, key, stripe_account;
    bool all = false;
    std::string reason, by, nsqd_tcp_address, topic = "billing";
};

struct retry_counts {
    int retried = 0, charged = 0, not_declined = 0, failed = 0;
};

struct retry_ctx {
    const retry_flags& f;
    billing::retry_store& store;
    nsq::producer& producer;
    stripe::client* stripe;       // null when Stripe is not reachable from here
    std::string stripe_unusable;  // why, then
    retry_counts n;
};

std::string who(const billing::retry_candidate& c) {
    std::string s =
        "key " + c.key + " (customer " + c.event.customer_id + ", period " + c.event.billing_period;
    if (c.event.connected()) s += ", account " + c.event.stripe_account;
    return s + ")";
}

// What the open intent of a declined row allows. true: the row may be reopened (the intent is cancelled,
// or there is none); false: it may not, and the reason was printed.
net::awaitable<bool> settle_open_intent(retry_ctx& x, const billing::retry_candidate& c) {
    if (!c.payment_intent_id) co_return true;
    const std::string& id = *c.payment_intent_id;
    if (!x.stripe) {
        std::printf(
            "%s: declined payment intent %s may still be open, and Stripe is not reachable from here "
            "(%s): not retried\n",
            who(c).c_str(), id.c_str(), x.stripe_unusable.c_str());
        ++x.n.failed;
        co_return false;
    }
    for (int round = 0; round < 2; ++round) {
        auto pi = co_await x.stripe->retrieve_payment_intent(id, c.event.stripe_account);
        if (!pi) {
            std::printf("%s: retrieving payment intent %s failed: %s: not retried\n", who(c).c_str(),
                        id.c_str(), pi.err().describe().c_str());
            ++x.n.failed;
            co_return false;
        }
        if (stripe::intent_succeeded(pi->status)) {
            auto m = co_await x.store.charged_by_its_intent(c.key, id, pi->latest_charge);
            if (!m) {
                std::printf("%s: recording payment intent %s as charged failed: %s\n", who(c).c_str(),
                            id.c_str(), m.err().describe().c_str());
                ++x.n.failed;
                co_return false;
            }
            std::printf("%s: payment intent %s succeeded after all (%s): %s, not retried\n", who(c).c_str(),
                        id.c_str(), pi->latest_charge.c_str(),
                        *m ? "recorded charged" : "the row moved meanwhile");
            ++x.n.charged;
            co_return false;
        }
        if (stripe::intent_movement(pi->status) == stripe::movement::canceled) co_return true;
        if (stripe::intent_in_flight(pi->status)) {
            std::printf("%s: payment intent %s is %s (money may still move): not retried\n", who(c).c_str(),
                        id.c_str(), pi->status.c_str());
            ++x.n.failed;
            co_return false;
        }
        // Still open (requires_action, requires_payment_method, requires_confirmation): cancel it, so it can
        // never succeed beside the retry's payment. A refusal means it moved: look again.
        auto target = "/v1/payment_intents/" + id + "/cancel";
        auto cancelled =
            co_await x.stripe->call("POST", target, "", c.key + "-cancel-" + id, c.event.stripe_account);
        if (cancelled.cls == stripe::outcome_class::succeeded) {
            std::printf("%s: payment intent %s was %s: cancelled\n", who(c).c_str(), id.c_str(),
                        pi->status.c_str());
            co_return true;
        }
    }
    std::printf("%s: payment intent %s could not be cancelled: not retried\n", who(c).c_str(), id.c_str());
    ++x.n.failed;
    co_return false;
}

// The retry that reopened a pending row, if one did (the row's generation is that retry's): its event is
// published again, since a crash may have come between the reopen and the publish.
net::awaitable<result<std::optional<billing::retry_record>>> pending_by_retry(
    retry_ctx& x, const billing::retry_candidate& c) {
    auto retries = co_await x.store.retries_of(c.key);
    if (!retries) co_return retries.err();
    if (retries->empty() || retries->back().generation != c.key_generation)
        co_return std::optional<billing::retry_record>();
    co_return std::optional<billing::retry_record>(retries->back());
}

// One row. False: nsqd refused a publish (the caller stops).
net::awaitable<bool> retry_one(retry_ctx& x, const billing::retry_candidate& c) {
    bool publish = false;
    std::string done;
    if (c.status == billing::record_status::declined) {
        if (!co_await settle_open_intent(x, c)) co_return true;
        auto r = co_await x.store.reopen_declined(c.key, x.f.by, x.f.reason);
        if (!r) {
            std::printf("%s: reopening failed: %s\n", who(c).c_str(), r.err().describe().c_str());
            ++x.n.failed;
            co_return true;
        }
        if (!*r) {
            std::printf("%s: no longer declined (another retry reopened it first): nothing done\n",
                        who(c).c_str());
            ++x.n.retried;
            co_return true;
        }
        done = "retry #" + std::to_string((*r)->id) + " by " + x.f.by + ": reopened under generation " +
               std::to_string((*r)->generation) + " (was declined: " + c.last_error.value_or("-") + ")";
        publish = true;
    } else if (c.status == billing::record_status::pending) {
        auto p = co_await pending_by_retry(x, c);
        if (!p) {
            std::printf("%s: reading its retries failed: %s\n", who(c).c_str(), p.err().describe().c_str());
            ++x.n.failed;
            co_return true;
        }
        if (!*p) {
            std::printf("%s: pending: the pipeline is charging it; nothing to retry\n", who(c).c_str());
            ++x.n.not_declined;
            co_return true;
        }
        const auto& last = **p;
        done = "retry #" + std::to_string(last.id) + " by " + last.requested_by + " at " + last.requested_at +
               " is under way (generation " + std::to_string(last.generation) + "): published again";
        publish = true;
    } else if (c.status == billing::record_status::charged) {
        std::printf("%s: charged (%s): nothing to retry\n", who(c).c_str(),
                    c.charge_id.value_or("-").c_str());
        ++x.n.charged;
        co_return true;
    } else {
        std::printf("%s: %s, not declined (%s): not retried (see chargeguard explain, dead-letters)\n",
                    who(c).c_str(), std::string(billing::to_string(c.status)).c_str(),
                    c.last_error.value_or("-").c_str());
        ++x.n.not_declined;
        co_return true;
    }
    if (!publish) co_return true;
    auto pub = co_await x.producer.publish(x.f.topic, billing::to_json(c.event));
    if (!pub) {
        std::printf(
            "%s: %s, but publishing to %s failed: %s (the row is pending: the sweeper charges it, or "
            "run this command again)\n",
            who(c).c_str(), done.c_str(), x.f.topic.c_str(), pub.err().describe().c_str());
        ++x.n.failed;
        co_return false;
    }
    std::printf("%s: %s; event published to %s\n", who(c).c_str(), done.c_str(), x.f.topic.c_str());
    ++x.n.retried;
    co_return true;
}

net::awaitable<result<std::vector<billing::retry_candidate>>> candidates(const retry_flags& f,
                                                                         billing::retry_store& store) {
    std::vector<billing::retry_candidate> out;
    if (f.all) co_return co_await store.declined_in_period(f.period);
    // g++ 12 miscompiles co_await inside ?: (docs/contributing.md): if/else.
    result<std::optional<billing::retry_candidate>> one = std::optional<billing::retry_candidate>();
    if (f.key.empty())
        one = co_await store.by_customer(f.customer, f.period, f.stripe_account);
    else
        one = co_await store.by_key(f.key);
    if (!one) co_return one.err();
    if (*one) out.push_back(std::move(**one));
    co_return out;
}

net::awaitable<int> run_retry(const retry_flags* fp, std::shared_ptr<pg::pool> pool, nsq::producer* producer,
                              stripe::client* client, std::string stripe_unusable) {
    const auto& f = *fp;
    billing::retry_store store(pool);
    retry_ctx x{f, store, *producer, client, std::move(stripe_unusable), {}};
    auto rows = co_await candidates(f, store);
    if (!rows) {
        std::fprintf(stderr, "chargeguard retry-declined: reading the ledger: %s\n",
                     rows.err().describe().c_str());
        co_await producer->close();
        co_return exit_failure;
    }
    if (rows->empty()) {
        std::string what = f.all ? "no declined row in period " + f.period
                           : f.key.empty()
                               ? "no ledger row for customer " + f.customer + ", period " + f.period
                               : "no ledger row for key " + f.key;
        std::printf("%s\n", what.c_str());
        co_await producer->close();
        co_return f.all ? exit_ok : exit_problem;
    }
    for (const auto& c : *rows)
        if (!co_await retry_one(x, c)) break;
    co_await producer->close();
    std::printf("%d retried, %d charged already, %d not declined, %d failed\n", x.n.retried, x.n.charged,
                x.n.not_declined, x.n.failed);
    if (x.n.failed > 0) co_return exit_failure;
    co_return x.n.not_declined > 0 ? exit_problem : exit_ok;
}

int retry_main(const retry_flags& f, const global_flags& g) {
    auto log = make_stderr_logger(g.level());
    auto opts = to_pool_options(f.pg);
    opts.size = 1;
    asio::io_context io{1};
    net::offload_pool off{1};
    // Stripe is needed only for a decline that left a PaymentIntent open; without a usable key the other
    // rows are still retried, and such a row says why it was not.
    std::unique_ptr<stripe::client> client;
    std::string unusable;
    try {
        auto c = stripe::client::create(off.get_executor(), to_stripe_config(f.stripe), log);
        if (c)
            client = std::move(*c);
        else
            unusable = c.err().describe();
    } catch (const std::exception& e) {
        unusable = e.what();
    }
    auto pool = pg::pool::create(io.get_executor(), off.get_executor(), std::move(opts), log);
    auto producer =
        std::make_unique<nsq::producer>(io.get_executor(), f.nsqd_tcp_address, nsq::producer_config{}, log);
    int rc = run_then_close_pool(io, pool, run_retry(&f, pool, producer.get(), client.get(), unusable),
                                 "retry-declined");
    producer.reset();
    client.reset();
    off.drain();
    return rc;
}

}  // namespace retry_impl

void register_retry_declined(CLI::App& app, command_main& selected) {
    using namespace retry_impl;
    auto* cmd = app.add_subcommand(
        "retry-declined",
        "charge declined keys again once the payment method is fixed (once each, recorded)");
    cmd->footer(
        std::string(
            "Examples:\n"
            "  chargeguard retry-declined --customer acme-42 --period 2026-11 --reason 'card updated' "
            "--nsqd-tcp-address nsqd:4150\n"
            "  chargeguard retry-declined --period 2026-11 --all --reason 'dunning run' "
            "--nsqd-tcp-address nsqd:4150\n"
            "What is retried, --reason, --by and --topic come from the command line only, never from "
            "CHARGEGUARD_* variables.\n") +
        exit_code_table);
    auto f = std::make_shared<retry_flags>();
    env(cmd->add_option("--customer", f->customer, "the billing system's customer id (with --period)"),
        env_scope::never);
    env(cmd->add_option("--period", f->period, "the billing period (with --customer, or with --all)"),
        env_scope::never);
    env(cmd->add_option("--key", f->key, "a billing key (the ledger's key)"), env_scope::never);
    env(cmd->add_option("--stripe-account", f->stripe_account, "the connected account of a Connect event"),
        env_scope::never);
    env(cmd->add_flag("--all", f->all, "every declined row of --period"), env_scope::never);
    env(cmd->add_option("--reason", f->reason, "why (recorded with the retry)")->required(),
        env_scope::never);
    env(cmd->add_option("--by", f->by, "who retries (recorded; default user@host)"), env_scope::never);
    env(cmd->add_option("--nsqd-tcp-address", f->nsqd_tcp_address, "nsqd TCP address host:port")
            ->required()
            ->group(group_nsq),
        env_scope::connection);
    // Where the event goes: the command line only, as every replay's --topic.
    env(cmd->add_option("--topic", f->topic, "the topic consume reads")
            ->capture_default_str()
            ->group(group_nsq),
        env_scope::never);
    add_pg_flags(*cmd, f->pg, false);
    add_stripe_flags(*cmd, f->stripe);
    cmd->callback([&selected, f] {
        const bool by_customer = !f->customer.empty();
        const int ways = (by_customer ? 1 : 0) + (f->key.empty() ? 0 : 1) + (f->all ? 1 : 0);
        if (ways != 1) throw usage_error("give one of --customer C --period P, --key K, --period P --all");
        if ((by_customer || f->all) && f->period.empty()) throw usage_error("--period is required here");
        if (!f->key.empty() && !f->period.empty()) throw usage_error("--key takes no --period");
        if (!f->key.empty() &&
            (f->key.size() != 32 || f->key.find_first_not_of("0123456789abcdef") != std::string::npos))
            bad_value("--key", f->key, "not a billing key (32 lower-case hex digits)");
        if (!f->stripe_account.empty() && !billing::valid_stripe_account(f->stripe_account))
            bad_value("--stripe-account", f->stripe_account, "not acct_ followed by letters and digits");
        if (f->reason.empty()) throw usage_error("--reason must not be empty");
        if (auto hp = net::parse_host_port(f->nsqd_tcp_address); !hp)
            bad_value("--nsqd-tcp-address", f->nsqd_tcp_address, hp.err().code.message());
        if (!nsq::proto::valid_topic_name(f->topic)) bad_value("--topic", f->topic, "not a valid topic name");
        if (f->by.empty()) f->by = default_operator();
        (void)to_pg_config(f->pg);  // validates before anything connects
        selected = [f](const global_flags& g) { return retry_main(*f, g); };
    });
}

}  // namespace cg::app
