// `chargeguard explain`: was this customer charged for this period, and if not, why?
//
//   chargeguard explain --customer C --period P [--key-namespace N] [--stripe] [--json]
//   chargeguard explain --key K
//   echo '<billing event JSON>' | chargeguard explain
//
// Computes the idempotency key as consume does (billing/machine/key.hpp), then shows the ledger row (looked
// up by key, and by customer and period, which are unique: a row written under another key namespace is found
// too), the key's dead letters, its vault spend reservations when the vault tables exist, and with --stripe
// the live Stripe objects carrying metadata[billing_key] — the same list-and-metadata search recovery uses
// (stripe::client::find_charge_by_billing_key / find_payment_intent_by_billing_key). Read-only: it changes
// nothing anywhere. Corrections (docs/design.md §4a): every revision of the period with its total and state,
// and each of its money moves with its Stripe object (charge, refund, PaymentIntent); a correction's key
// (base-rN…) given to --key shows its period. Ends with a one-line verdict; exit 0 when the event is charged
// once, 2 otherwise, 1 when PostgreSQL or Stripe could not be asked.
//
// This file holds the flags, the subject (flags or stdin) and the run; the reads are app/explain_load.*, the
// verdict app/explain_verdict.*, the two renderings app/explain_render.*.
#include <unistd.h>

#include <asio/io_context.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/explain_load.hpp"
#include "app/explain_render.hpp"
#include "app/explain_verdict.hpp"
#include "app/pg_flags.hpp"
#include "app/stripe_flags.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/key.hpp"
#include "net/offload.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
// A named namespace, not an anonymous one: the unity build joins the app's files into one unit.
namespace explain_impl {

struct explain_flags {
    pg_flags pg;
    stripe_flags stripe;
    std::string customer, period, key;
    std::string stripe_account;  // a Connect event's account (part of its key; searched in it)
    std::string key_namespace = "chargeguard";
    bool with_stripe = false;
    bool json = false;
    std::string stripe_customer;     // from a stdin event
    std::string by_stripe_customer;  // --stripe-customer cus_…: every key and charge of it in --period
};

net::awaitable<int> run_explain(const explain_flags* fp, std::shared_ptr<pg::pool> pool,
                                stripe::client* client, explanation x) {
    const auto& f = *fp;
    auto fail = [](const char* what, const error& e) {
        std::fprintf(stderr, "chargeguard explain: %s: %s\n", what, e.describe().c_str());
        return exit_failure;
    };
    if (!f.by_stripe_customer.empty()) {
        if (auto r =
                co_await load_by_stripe_customer(*pool, client, x, f.by_stripe_customer, f.stripe_account);
            !r)
            co_return fail("reading the Stripe customer's rows and charges", r.err());
        decide_stripe_customer(x);
        if (f.json)
            print_json(x);
        else
            print_text(x);
        co_return x.state == "charged" ? exit_ok : exit_problem;
    }
    if (auto r = co_await load_ledger(*pool, x, f.stripe_account); !r)
        co_return fail("reading the ledger", r.err());
    // A row found by customer and period under another key: its dead letters and spend carry that key.
    std::string key = x.row ? x.row->str("key") : x.key;
    // The row's own customer and period when found by key.
    std::string customer = x.row ? x.row->str("customer_id") : x.customer;
    std::string period = x.row ? x.row->str("billing_period") : x.period;
    std::string letter_account = x.row ? x.row->str("stripe_account") : f.stripe_account;
    if (auto r = co_await load_letters(*pool, x, key, customer, period, letter_account); !r)
        co_return fail("reading dead letters", r.err());
    if (auto r = co_await load_spend(*pool, x, key); !r)
        co_return fail("reading vault reservations", r.err());
    if (auto r = co_await load_corrections(*pool, x, key); !r) co_return fail("reading corrections", r.err());
    if (auto r = co_await load_attempts(pool, x, key); !r) co_return fail("reading retries", r.err());
    if (!client) {
        x.stripe.skipped = "not asked (--stripe searches it)";
    } else {
        std::string cus = x.row ? x.row->str("stripe_customer_id") : f.stripe_customer;
        // Named first: g++ 12 mishandles a conditional's temporary in a co_await's arguments.
        std::string account = x.row ? x.row->str("stripe_account") : f.stripe_account;
        if (cus.empty())
            x.stripe.skipped = "not searched: no ledger row and no event gives the Stripe customer";
        else if (auto r = co_await load_stripe(*client, x, cus, key, account); !r)
            co_return fail("searching Stripe", r.err());
    }
    decide(x);
    if (f.json)
        print_json(x);
    else
        print_text(x);
    co_return x.state == "charged" ? exit_ok : exit_problem;
}

// Fills customer/period/key from the flags or an event line on stdin; throws usage_error.
void resolve_subject(explain_flags& f) {
    if (!f.by_stripe_customer.empty()) {
        if (!f.customer.empty() || !f.key.empty())
            throw usage_error("--stripe-customer goes with --period only (it finds every customer id)");
        if (f.period.empty()) throw usage_error("--stripe-customer needs --period");
        if (f.by_stripe_customer.rfind("cus_", 0) != 0)
            bad_value("--stripe-customer", f.by_stripe_customer, "not a Stripe customer id (cus_…)");
        return;
    }
    bool by_customer = !f.customer.empty() || !f.period.empty();
    if (by_customer && !f.key.empty()) throw usage_error("give --key or --customer with --period, not both");
    if (!f.key.empty()) {
        // A key as logs and Stripe's metadata show it may carry a correction's or a generation's suffix
        // (base-r2, base-r2-p2, base-g2): the period is the base key's.
        auto base = f.key.substr(0, 32);
        auto suffix = f.key.size() > 32 ? f.key.substr(32) : std::string();
        bool hex = base.size() == 32 && base.find_first_not_of("0123456789abcdef") == std::string::npos;
        bool suffix_ok = suffix.empty() || (suffix.size() >= 3 && suffix[0] == '-' &&
                                            suffix.find_first_not_of("-rpg0123456789") == std::string::npos);
        if (!hex || !suffix_ok)
            bad_value("--key", f.key,
                      "not a billing key (32 lower-case hex digits, maybe -r<N>, -p<N>, -g<N>)");
        f.key = base;
        return;
    }
    if (by_customer) {
        if (f.customer.empty() || f.period.empty()) throw usage_error("--customer and --period go together");
        return;
    }
    if (::isatty(STDIN_FILENO))
        throw usage_error("give --customer C --period P, --key K, or a billing event line on stdin");
    std::string line;
    while (line.find_first_not_of(" \t\r") == std::string::npos && std::getline(std::cin, line)) {
    }
    auto ev = billing::parse_event(line);
    if (!ev) throw usage_error("stdin: not a billing event: " + ev.err().message);
    f.customer = ev->customer_id;
    f.period = ev->billing_period;
    f.stripe_customer = ev->stripe_customer_id;
    f.stripe_account = ev->stripe_account;
}

int explain_main(explain_flags f, const global_flags& g) {
    if (!billing::valid_key_namespace(f.key_namespace))
        bad_value("--key-namespace", f.key_namespace, "not 1-64 characters of [A-Za-z0-9_.-]");
    resolve_subject(f);
    explanation x;
    x.key_namespace = f.key_namespace;
    x.customer = f.customer;
    x.period = f.period;
    if (!f.stripe_account.empty() && !billing::valid_stripe_account(f.stripe_account))
        bad_value("--stripe-account", f.stripe_account, "not acct_ followed by letters and digits");
    if (f.by_stripe_customer.empty())
        x.key = f.key.empty() ? billing::base_key(f.key_namespace, f.customer, f.period, f.stripe_account)
                              : f.key;
    std::optional<stripe::client_config> scfg;
    if (f.with_stripe) scfg = to_stripe_config(f.stripe);
    auto opts = to_pool_options(f.pg);
    opts.size = 1;
    auto log = make_stderr_logger(g.level());
    asio::io_context io{1};
    net::offload_pool off{1};
    std::unique_ptr<stripe::client> client;
    if (scfg) {
        auto c = stripe::client::create(off.get_executor(), std::move(*scfg), log);
        if (!c) {
            std::fprintf(stderr, "chargeguard explain: %s\n", c.err().describe().c_str());
            return exit_failure;
        }
        client = std::move(*c);
    }
    auto pool = pg::pool::create(io.get_executor(), off.get_executor(), std::move(opts), log);
    int rc = run_then_close_pool(io, pool, run_explain(&f, pool, client.get(), std::move(x)), "explain");
    client.reset();
    off.drain();
    return rc;
}

}  // namespace explain_impl

void register_explain(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("explain",
                                   "was this customer charged for this period, and if not, why? (read-only)");
    cmd->footer(std::string("Examples:\n"
                            "  chargeguard explain --customer acme-42 --period 2026-11\n"
                            "  chargeguard explain --key 0f3c9a7e5b1d2c4f6a8b0c1d2e3f4a5b --stripe --json\n"
                            "  chargeguard explain --stripe-customer cus_N3x --period 2026-11 --stripe\n"
                            "  echo '{\"customer_id\":\"acme-42\",\"billing_period\":\"2026-11\",…}' | "
                            "chargeguard explain\n") +
                exit_code_table);
    using namespace explain_impl;
    auto f = std::make_shared<explain_flags>();
    cmd->add_option("--customer", f->customer, "the billing system's customer id (with --period)");
    cmd->add_option("--period", f->period, "the billing period, as in the events (e.g. 2026-11)");
    cmd->add_option(
        "--key", f->key,
        "a billing key (the ledger's key, logs' billing_key; a correction's base-rN shows its period)");
    cmd->add_option(
        "--stripe-account", f->stripe_account,
        "the connected account (acct_…) of a Stripe Connect event (with --customer and --period)");
    env(cmd->add_option("--key-namespace", f->key_namespace, "the key namespace consume uses")
            ->capture_default_str()
            ->group(group_pipeline),
        env_scope::connection);
    cmd->add_option(
        "--stripe-customer", f->by_stripe_customer,
        "a Stripe customer (cus_…): every ledger key and, with --stripe, every Stripe charge of it "
        "in --period, whatever customer ids its events came under");
    cmd->add_flag("--stripe", f->with_stripe,
                  "also search Stripe for charges and PaymentIntents carrying the key (as recovery does)")
        ->group(group_stripe);
    cmd->add_flag("--json", f->json, "one JSON object instead of the text");
    add_pg_flags(*cmd, f->pg, false);
    add_stripe_flags(*cmd, f->stripe);
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return explain_main(*f, g); }; });
}

}  // namespace cg::app
