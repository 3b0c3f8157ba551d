// `chargeguard retry-declined`: charge a declined key again once the customer's payment method is fixed.
//
//   chargeguard retry-declined --customer C --period P [--stripe-account A] --reason R --nsqd-tcp-address H:P
//   chargeguard retry-declined --key K --reason R …
//   chargeguard retry-declined --period P --all --reason R …
//
// Each row goes through retry_declined_row (app/declined_retry.hpp): an open PaymentIntent cancelled first,
// the row reopened under a new key generation with the retry recorded, its event published for `consume`.
// Exit 0 when every row asked for was retried (or found charged), 2 when some
// were not declined, 1 on a failure (PostgreSQL, Stripe, nsqd).
#include <asio/io_context.hpp>
#include <cstdio>
#include <memory>
#include <optional>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/declined_retry.hpp"
#include "app/pg_flags.hpp"
#include "app/stripe_flags.hpp"
#include "billing/machine/event.hpp"
#include "billing/store/retry_store.hpp"
#include "net/address.hpp"
#include "net/offload.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"
#include "stripe/client.hpp"

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
    declined_retry x{store,
                     *producer,
                     f.topic,
                     client,
                     std::move(stripe_unusable),
                     f.by,
                     f.reason,
                     false,
                     [](std::string_view line, bool) {
                         std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
                     },
                     {}};
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
        if (!co_await retry_declined_row(x, c)) break;
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
