// Stripe API client: form-encoded requests with auth, Stripe-Version and Idempotency-Key; JSON answers
// parsed into typed results and classified into one outcome; bounded jittered retries for
// `retry_same_key` answers only (reads also retry `indeterminate`, being safe to repeat).
//
// Stripe Connect: every call takes the connected account it is made for (`stripe_account`, a field of the
// request or the last parameter; empty: the platform's own account) and sends it as `Stripe-Account` on
// every attempt. It is per request, never client state: one client serves the platform and every account.
// With rate control on, each account has its own (Stripe limits each account separately), so a 429 storm on
// one account slows no other.
//
// Executors: everything runs on the strand of its http::client, which sits on the executor given to
// create() (the offload pool, or the event loop with `connect_on` set to the offload pool: then only new
// connections' connect and TLS handshake leave the loop). Every public coroutine may be awaited from any
// executor (the main loop) and completes on the caller's executor. Cancelling the caller does not stop a
// call: each attempt is bounded by request_timeout and the retries by the policy. The client must outlive
// every call.
#pragma once

#include <asio/any_io_executor.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "http/client.hpp"
#include "net/admission.hpp"
#include "net/tokens.hpp"
#include "stripe/config.hpp"
#include "stripe/types.hpp"

namespace cg::metrics {
class registry;
}

namespace cg::stripe {

// A raw API call and its classification, for callers that forward bodies as they are (vault proxy).
struct call_result {
    outcome_class cls = outcome_class::indeterminate;
    http::client_result http;        // the last attempt (response or transport failure)
    std::optional<api_error> error;  // parsed `error` of a non-2xx body
    unsigned attempts = 0;
    std::string request_id;
    bool replayed = false;
    std::string message;  // one line describing the outcome; never a secret
};

class client {
  public:
    // Builds the TLS context (cfg.ca_file or the system store) and the HTTP pool. Fails on a missing
    // key, a bad URL or an unreadable CA file. With `metrics`, the client exports chargeguard_stripe_*
    // series there (see stripe/client_metrics.hpp); the registry must outlive the client.
    static result<std::unique_ptr<client>> create(asio::any_io_executor offload, client_config cfg,
                                                  logger log, metrics::registry* metrics = nullptr,
                                                  asio::any_io_executor connect_on = {});
    ~client();
    client(const client&) = delete;
    client& operator=(const client&) = delete;

    // A place among the client's calls under way (client_config::max_calls), for a caller that waits for
    // its turn before it builds its request: the create call given it takes no place of its own, so a
    // caller past the bound holds nothing of the call meanwhile. Not held when the client has no bound.
    // Completes on the caller's executor; not cancellable (a place frees when a call ends).
    using call_turn = net::admission::ticket;
    net::awaitable<call_turn> turn();

    // POST /v1/charges. Returns the classified outcome (never throws for API or network failures). Without
    // a held `turn`, the call waits for its own first.
    net::awaitable<charge_outcome> create_charge(charge_request req, call_turn turn = {});
    // POST /v1/payment_intents with confirm / off_session / payment_method. The outcome's charge_id is the
    // intent's latest_charge; an intent left processing or requires_capture is `succeeded` with
    // in_flight_status set (not charged yet); any other status but succeeded (requires_action,
    // requires_payment_method) is `declined` with the status and error code in `message`.
    net::awaitable<charge_outcome> create_payment_intent(payment_intent_request req, call_turn turn = {});

    // GET /v1/charges/{id}, GET /v1/payment_intents/{id}. Errors carry stripe::errc.
    net::awaitable<result<charge>> retrieve_charge(std::string id, std::string stripe_account = {});
    net::awaitable<result<payment_intent>> retrieve_payment_intent(std::string id,
                                                                   std::string stripe_account = {});
    // GET /v1/charges/{id}, with Stripe's 404 read as "no such charge" (nullopt) rather than an error: for a
    // reader that reports a charge id as absent (reconcile). Other errors as retrieve_charge's.
    net::awaitable<result<std::optional<charge>>> retrieve_charge_if_any(std::string id,
                                                                         std::string stripe_account = {});
    // GET /v1/charges?customer=…&created[gte]=…&limit=…&starting_after=… (one page, newest first; without a
    // customer, the account's charges).
    net::awaitable<result<charge_page>> list_charges(list_charges_request req);
    // GET /v1/payment_intents?customer=…&created[gte]=…&limit=…&starting_after=… (one page, newest first).
    net::awaitable<result<payment_intent_page>> list_payment_intents(list_request req);
    // Pages through the customer's charges (created ≥ created_gte, newest first) and returns the first whose
    // metadata[name] equals `value`, or nullopt when there is none. Reads its own writes.
    net::awaitable<result<std::optional<charge>>> find_charge_by_metadata(
        std::string customer, std::string name, std::string value, std::optional<std::int64_t> created_gte,
        unsigned page_size = 100, std::string stripe_account = {});
    // The same search over the customer's PaymentIntents: an intent that never made a charge (requires_action
    // after an on-session confirm) is only found this way.
    net::awaitable<result<std::optional<payment_intent>>> find_payment_intent_by_metadata(
        std::string customer, std::string name, std::string value, std::optional<std::int64_t> created_gte,
        unsigned page_size = 100, std::string stripe_account = {});
    // The two searches by the ledger's metadata[billing_key].
    net::awaitable<result<std::optional<charge>>> find_charge_by_billing_key(
        std::string customer, std::string billing_key, std::optional<std::int64_t> created_gte,
        unsigned page_size = 100, std::string stripe_account = {}) {
        return find_charge_by_metadata(std::move(customer), "billing_key", std::move(billing_key),
                                       created_gte, page_size, std::move(stripe_account));
    }
    net::awaitable<result<std::optional<payment_intent>>> find_payment_intent_by_billing_key(
        std::string customer, std::string billing_key, std::optional<std::int64_t> created_gte,
        unsigned page_size = 100, std::string stripe_account = {}) {
        return find_payment_intent_by_metadata(std::move(customer), "billing_key", std::move(billing_key),
                                               created_gte, page_size, std::move(stripe_account));
    }

    // Any call: `target` is origin-form ("/v1/charges?x=1"); `body` form-encoded; an idempotency key
    // is required for POST. Auth and Stripe-Version are added. Retries as described above.
    net::awaitable<call_result> call(std::string method, std::string target, std::string body,
                                     std::string idempotency_key, std::string stripe_account = {});

    // Shared pacing between sidecars (billing/flow/pace_peers.hpp): one report per pacer (the platform's,
    // account
    // ""; each connected account's), and one exchange's view of each account's peers (an account missing
    // from `views`, or with no peers, paces alone). Empty without rate control. From any executor.
    struct pace_report {
        std::string account;
        pacer_report report;
    };
    struct pace_view {
        std::string account;
        std::vector<peer_view> peers;  // by peer id, this process among them
        std::size_t self = 0;
    };
    net::awaitable<std::vector<pace_report>> pace_reports();
    net::awaitable<void> apply_pace(std::vector<pace_view> views);

    const client_config& config() const noexcept;
    // Callers waiting for their turn (client_config::max_calls) now; 0 without a bound. Any thread.
    std::size_t calls_waiting() const;
    http::client_stats http_stats() const;

    struct state;

  private:
    explicit client(std::shared_ptr<state> st);
    std::shared_ptr<state> st_;
};

}  // namespace cg::stripe
