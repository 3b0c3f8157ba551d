// What `chargeguard explain` reads (app/cmd_explain.cpp runs it, app/explain_verdict.hpp judges it): each
// step fills its part of the explanation. Read-only. Internal to explain.
#pragma once

#include <memory>
#include <string>

#include "app/explain_render.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

namespace cg::app::explain_impl {

// The ledger row by key, or by customer and period (in `stripe_account`) when written under another key.
net::awaitable<result<void>> load_ledger(pg::pool& pool, explanation& x, const std::string& stripe_account);
// The key's dead letters, and the letters whose body names the customer and period in `account`.
net::awaitable<result<void>> load_letters(pg::pool& pool, explanation& x, const std::string& key,
                                          const std::string& customer, const std::string& period,
                                          const std::string& account);
// --stripe-customer: the ledger rows of `cus` in the period and, with `client`, its charges on Stripe.
net::awaitable<result<void>> load_by_stripe_customer(pg::pool& pool, stripe::client* client, explanation& x,
                                                     const std::string& cus, const std::string& account);
// The key's vault spend reservations, when the vault tables exist.
net::awaitable<result<void>> load_spend(pg::pool& pool, explanation& x, const std::string& key);
// The period's correction revisions, their money moves and the net moved, when the tables exist.
net::awaitable<result<void>> load_corrections(pg::pool& pool, explanation& x, const std::string& base);
// Each attempt at the key's charge (the first delivery and every retry of a decline), when retried.
net::awaitable<result<void>> load_attempts(std::shared_ptr<pg::pool> pool, explanation& x,
                                           const std::string& key);
// The recovery search (stripe::client): the charge and the PaymentIntent carrying the key.
net::awaitable<result<void>> load_stripe(stripe::client& client, explanation& x, const std::string& cus,
                                         const std::string& key, const std::string& account);

}  // namespace cg::app::explain_impl
