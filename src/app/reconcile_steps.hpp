// `chargeguard reconcile`'s run state and the steps that read the ledger and Stripe (app/cmd_reconcile.cpp
// drives them): the ledger rows and dead letters of the period, the charges of the period in the platform and
// in every connected account the run or the ledger names, the recovery of pending rows and the check of each
// charged row's charge. Internal to reconcile.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "app/pg_flags.hpp"
#include "app/stripe_flags.hpp"
#include "billing/report/reconcile.hpp"
#include "billing/store/ledger.hpp"
#include "net/timeout.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

namespace cg::app::reconcile_detail {

struct reconcile_flags {
    pg_flags pg;
    stripe_flags stripe;
    std::string expected_file;
    std::string period;
    std::string customer;  // empty: every customer
    std::string key_namespace = "chargeguard";
    bool json = false;
    bool show_ok = false;
    bool publish = false;
    std::string nsqd_tcp_address;
    std::string topic;
    double stripe_rate = 20;
    std::int64_t created_since = -1;  // unix seconds; -1: derived from the ledger
};

// One entry of the run: the ledger's (customer_id, billing_period, stripe_account); account empty for the
// platform's own.
struct ident {
    std::string customer, period, account;
    auto operator<=>(const ident&) const = default;
};

struct item {
    billing::recon_facts facts;
    ident who;
    bool lease_expired = true;
    bool payment_intent = false;  // the row's event charges through a PaymentIntent
    billing::recon_verdict verdict;
    std::string action;  // "settled charged from ch_…", "re-published", …
};

struct reconcile_run {
    const reconcile_flags& f;
    pg::pool& pool;
    stripe::client& stripe;
    logger log;
    billing::request_pacer pacer;
    std::map<ident, item> items;
    std::map<std::string, ident> by_key;
    // The connected accounts the expected run or the ledger names: each one's charges are listed too.
    std::set<std::string> accounts;
    std::int64_t stripe_requests = 0;
    std::string failure;

    item& at(const ident& who, const std::string& key) {
        auto& it = items[who];
        it.who = who;
        if (it.facts.key.empty()) it.facts.key = key;
        by_key.emplace(key, who);
        return it;
    }

    net::awaitable<void> pace() {
        auto d = pacer.delay(std::chrono::steady_clock::now());
        ++stripe_requests;
        if (d > std::chrono::steady_clock::duration::zero()) co_await net::sleep_for(d);
    }

    net::awaitable<result<pg::rows>> query(const std::string& sql, pg::params p) {
        auto c = co_await pool.acquire();
        if (!c) co_return c.err();
        co_return co_await (*c)->query_with(sql, std::move(p), std::chrono::seconds(60));
    }
};

// The ledger rows and open dead letters of the period; `earliest` becomes the first row's creation (unix
// seconds). False (run.failure set) when PostgreSQL fails.
net::awaitable<bool> load_ledger(reconcile_run& run, std::int64_t& earliest);
// Every charge created since `since` in the platform and in each of run.accounts (with its Stripe-Account),
// newest first, 100 per page; keeps those of this period (or carrying a key we know).
net::awaitable<bool> scan_stripe(reconcile_run& run, std::int64_t since);
// The pipeline's recovery search for a pending row (billing/flow/recovery.hpp): a payment found settled or
// declined settles the row (mark_* apply only to a still-pending row, so a worker settling it meanwhile
// wins).
net::awaitable<void> resolve_pending(reconcile_run& run, billing::ledger& ledger, item& it);
// The charge a charged row names: from the scan, else retrieved (Stripe's 404: it does not exist).
net::awaitable<void> check_recorded(reconcile_run& run, item& it);

}  // namespace cg::app::reconcile_detail
