// fake-stripe: a stateful HTTPS double of the Stripe API surface chargeguard uses (specs/stripe.md):
// charges and PaymentIntents with metadata, list/retrieve, idempotency (24 h window on a movable clock,
// replay with Idempotent-Replayed, 400 idempotency_error on a parameter mismatch, 409 while the same key
// executes; 429 and validation 400s not saved; 500s saved), declines per customer, and fault injection.
// PaymentIntents confirmed off-session fail with 402 (the intent back to requires_payment_method, its failed
// charge, last_payment_error); confirmed on-session against an authentication_required rule they stop at
// 200 requires_action without a charge, as Stripe's 3-D Secure cards do. POST /v1/payment_intents/{id}/cancel
// cancels an intent in any status but succeeded or canceled (400 payment_intent_unexpected_state).
//
// Payments that settle later: a PaymentIntent confirmed with one of Stripe's US bank account test payment
// methods (`pm_usBankAccount_success`, `_accountClosed`, `_noAccount`, `_insufficientFunds`,
// `_debitNotAuthorized`, `_invalidCurrency`, `_dispute`, `_processing`) answers 200 `processing` with a
// `pending` charge, then after `settle_after` (or POST /_admin/settle) moves to `succeeded` or back to
// `requires_payment_method` with a failed charge (`_processing` stays until cancelled or settled by hand;
// `_dispute` succeeds, then its charge is disputed). Refunds: POST /v1/refunds (charge or payment_intent,
// partial or full, idempotent like every POST; amount_too_large, charge_already_refunded, charge_disputed,
// charge_not_refundable as Stripe answers them; listed by GET /v1/refunds?charge=…|payment_intent=…, newest
// first, with their metadata; charge.refunded and refund.created on creation; end_refund
// fails or cancels one: refund.updated, refund.failed, charge.refund.updated). Disputes: opened and closed
// through /_admin/disputes. Every state change makes a Stripe event (GET /v1/events) that the webhook sender
// (webhooks.hpp) delivers, signed, to the configured endpoint.
//
// Stripe Connect: a request with `Stripe-Account: acct_…` acts in that connected account, as Stripe scopes
// it. Objects created there are visible (listed, retrieved, refunded, cancelled) only with the same header,
// and the platform's only without one; idempotency keys are per account; a connected account knows only the
// customers registered in it (add_account, POST /_admin/accounts): another is Stripe's 400 resource_missing
// "No such customer" (param customer, not saved). A header naming no account the platform reaches (unknown
// or malformed) is 403 `account_invalid`, before anything else runs. Events about a connected account's
// objects carry `"account": "acct_…"` (Connect webhooks); the platform's carry none. The platform keeps
// accepting any cus_… as before.
//
// Everything runs on the executor given to the constructor; the accessors below must be called there
// too (tests run the fake on their own io_context thread and read state between co_awaits).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "http/server.hpp"
#include "net/address.hpp"
#include "tests/doubles/stripe/limiter.hpp"
#include "tests/doubles/stripe/webhooks.hpp"

namespace cg::fake {

// Fault injection; counters apply to the next N matching requests and count down.
struct faults {
    int latency_ms = 0;         // added to every /v1 request
    int latency_jitter_ms = 0;  // plus uniform random [0, jitter]
    int stall_ms = 0;           // with stall_count: the next N /v1 requests wait this long first
    int stall_count = 0;
    int fail_after_create = 0;  // next N creating POSTs: object created, then 500 (saved, replayed)
    int drop_after_create = 0;  // next N creating POSTs: object created and 200 saved, connection dropped
    int rate_limit = 0;         // next N POSTs: 429 rate_limit with Stripe-Should-Retry: true (not saved)
    int in_use = 0;             // next N POSTs: 409 idempotency_key_in_use (not saved)
    // Non-empty ("/v1/payment_intents"): the four counted faults above hit only POSTs to that path and wait
    // for one; empty: any creating POST.
    std::string fault_path;
    bool targets(std::string_view path) const { return fault_path.empty() || fault_path == path; }
};

struct decline_rule {
    std::string code = "card_declined";  // or authentication_required, expired_card, …
    std::string decline_code = "generic_decline";
};

struct charge_rec {
    std::string id;
    std::int64_t amount = 0;
    std::string currency, customer, description, status, failure_code, payment_intent;
    std::string payment_method, failure_message;
    std::string settles_to, settle_failure_code;  // a pending Charges-API bank debit
    std::int64_t amount_refunded = 0;
    bool disputed = false;
    std::int64_t created = 0;
    std::vector<std::pair<std::string, std::string>> metadata;
    std::uint64_t seq = 0;  // creation order (newest first in lists)
    std::string account;    // the connected account it lives in; empty: the platform
};

struct intent_rec {
    std::string id;
    std::int64_t amount = 0;
    std::string currency, customer, description, status, payment_method, latest_charge;
    std::string last_error_code;  // last_payment_error.code after a failed confirm
    std::string last_error_type = "card_error", last_error_message;
    std::string settles_to;           // asynchronous methods: succeeded | failed | dispute | (empty: never)
    std::string settle_failure_code;  // when settles_to is failed
    std::string cancellation_reason;  // after POST /v1/payment_intents/{id}/cancel
    bool automatic = false;           // automatic_payment_methods[enabled]
    std::string allow_redirects;      // automatic_payment_methods[allow_redirects] (empty: null)
    std::vector<std::string> payment_method_types;  // as Stripe reports them
    std::int64_t created = 0;
    std::vector<std::pair<std::string, std::string>> metadata;
    std::string account;  // the connected account it lives in; empty: the platform
};

struct refund_rec {
    std::string id, charge, payment_intent, currency, reason, status = "succeeded";
    std::int64_t amount = 0, created = 0;
    std::vector<std::pair<std::string, std::string>> metadata;
    std::string account;
};

// A dispute: an inquiry (warning_needs_response → warning_under_review → warning_closed, or escalated to a
// chargeback) withdraws nothing; a chargeback (needs_response → under_review → won | lost) withdraws the
// amount when opened and reinstates it when won.
struct dispute_rec {
    std::string id, charge, payment_intent, currency, reason = "fraudulent", status = "needs_response";
    std::int64_t amount = 0, created = 0;
    std::string account;
    bool inquiry() const { return status.starts_with("warning_"); }
    bool closed() const { return status == "won" || status == "lost" || status == "warning_closed"; }
};

// One /v1 request and its answer (record_requests): what the conformance check validates against Stripe's
// published API description.
struct request_rec {
    std::string method, path, query, body, stripe_version, account;
    int status = 0;
    std::string response;
};

struct event_rec {
    std::string id, type, object_id;
    std::string account;  // "account" of a connected account's event; empty: the platform's
    std::int64_t created = 0;
    std::string body;  // as delivered (pretty-printed)
};

class fake_stripe {
  public:
    fake_stripe(asio::any_io_executor ex, std::shared_ptr<asio::ssl::context> tls, logger log,
                std::size_t max_connections = 2048);
    ~fake_stripe();

    result<net::tcp::endpoint> listen(const net::host_port& where);
    void start();
    void stop();

    // Test hooks (same as the /_admin endpoints). Call on the fake's executor.
    struct faults& faults() noexcept {
        return faults_;
    }
    void decline(std::string customer, decline_rule rule = {});
    // The customer fixed the payment method: its charges succeed again. Same as POST /_admin/declines with
    // customer=… and clear=true.
    void clear_decline(const std::string& customer) { declines_.erase(customer); }
    // The customer attached a new card (a Dashboard, Checkout or SetupIntent step chargeguard never makes):
    // its decline rule is cleared (its charges succeed again) and `payment_method.attached` is sent, the
    // PaymentMethod rendered as Stripe renders it. `account`: a connected account's customer. Returns the
    // new pm_…. POST /_admin/payment_methods/attach (customer=…, account=…).
    std::string attach_payment_method(const std::string& customer, const std::string& account = {});
    // The customer's invoice_settings.default_payment_method becomes `payment_method` (attach one first):
    // `customer.updated` with data.previous_attributes naming the old default. POST /_admin/customers/default
    // (customer=…, payment_method=…, account=…).
    void set_default_payment_method(const std::string& customer, const std::string& payment_method,
                                    const std::string& account = {});
    // Connects an account (acct_…) to the platform with these customers (more on a later call). Same as
    // POST /_admin/accounts (account=…, customers=cus_a,cus_b).
    void add_account(const std::string& account, const std::vector<std::string>& customers);
    // Stripe's rate and concurrency limits (off by default): refused requests get 429 rate_limit with
    // Stripe-Should-Retry: true, before idempotency (nothing saved). Same as POST /_admin/limits.
    void set_limits(const limits& l);
    const fake::limiter& limiter() const noexcept { return limiter_; }
    // A connected account's own limiter (Stripe limits each account separately); null before its first
    // request.
    const fake::limiter* account_limiter(const std::string& account) const {
        auto it = account_limiters_.find(account);
        return it == account_limiters_.end() ? nullptr : &it->second;
    }
    // The API version of requests that send no Stripe-Version (an account's default version).
    void set_default_api_version(std::string v) { default_api_version_ = std::move(v); }
    void advance_clock(std::chrono::seconds by) noexcept { clock_offset_ += by; }
    std::int64_t now() const;  // unix seconds on the fake clock
    const std::vector<charge_rec>& charges() const noexcept { return charges_; }
    const std::vector<intent_rec>& intents() const noexcept { return intents_; }
    const std::vector<refund_rec>& refunds() const noexcept { return refunds_; }
    const std::vector<dispute_rec>& disputes() const noexcept { return disputes_; }
    const std::vector<event_rec>& events() const noexcept { return events_; }
    fake::webhook_sender& webhooks() noexcept { return *webhooks_; }
    // How long an asynchronous payment stays processing before it settles (POST /_admin/async).
    void settle_after(std::chrono::milliseconds d) noexcept { settle_after_ = d; }
    // Settles a processing PaymentIntent now: "succeeded", or "failed" with a bank failure code (Stripe's:
    // insufficient_funds, account_closed, …). False when no such intent is processing.
    bool settle(const std::string& intent_id, const std::string& outcome,
                const std::string& failure_code = {});
    // Opens a dispute on a succeeded charge (the whole amount when 0): a chargeback (needs_response, events
    // charge.dispute.created and charge.dispute.funds_withdrawn) or an inquiry (warning_needs_response,
    // charge.dispute.created only). Empty when the charge cannot be disputed. POST /_admin/disputes.
    std::string open_dispute(const std::string& charge_id, const std::string& reason = "fraudulent",
                             std::int64_t amount = 0, bool inquiry = false);
    // Moves a dispute along Stripe's lifecycle: warning_needs_response → warning_under_review →
    // warning_closed, an inquiry escalated to needs_response (charge.dispute.updated, funds_withdrawn);
    // needs_response → under_review (charge.dispute.updated) → won (charge.dispute.closed, then
    // charge.dispute.funds_reinstated) or lost (charge.dispute.closed). False for any other step or a closed
    // dispute. POST /_admin/disputes/update.
    bool update_dispute(const std::string& dispute_id, const std::string& status);
    // update_dispute to "won", "lost" or "warning_closed" only. POST /_admin/disputes/close.
    bool close_dispute(const std::string& dispute_id, const std::string& status);
    // Ends a refund that has not ended: "failed" (the bank returned it) or "canceled". Its amount goes back
    // to the charge (amount_refunded drops); events refund.updated and charge.refund.updated, as Stripe
    // sends them on the pinned API version (which has no refund.failed). False when there is no such refund
    // still standing.
    bool end_refund(const std::string& refund_id, const std::string& status);
    // Settles a pending Charges-API bank debit now ("succeeded", or "failed" with a bank failure code).
    // POST /_admin/settle with charge=…. False when no such charge is pending.
    bool settle_charge(const std::string& charge_id, const std::string& outcome,
                       const std::string& failure_code = {});
    // The customer's default source (a `ba_…` bank account: their Charges-API charges are ACH debits that
    // answer `pending` and settle after `settle_after`). POST /_admin/customers.
    void default_source(std::string customer, std::string source) {
        default_sources_[std::move(customer)] = std::move(source);
    }
    int pending_settlements() const noexcept { return pending_settle_; }
    // From now on, the customer's bank debits settle this way ("succeeded", or "failed" with `failure_code`),
    // whatever the test payment method says: the customer topped up the account, or closed it.
    // POST /_admin/bank.
    void bank_outcome(std::string customer, std::string outcome, std::string failure_code = {});
    // Keeps every /v1 request and its answer from now on (off by default).
    void record_requests(bool on) noexcept { record_requests_ = on; }
    const std::vector<request_rec>& request_log() const noexcept { return request_log_; }
    int posts_for(const std::string& key) const;
    int max_concurrent() const noexcept { return max_active_; }
    std::uint64_t requests() const noexcept { return requests_; }
    // Injected faults that hit a request, by "fault path" (e.g. "fail_after_create /v1/payment_intents").
    const std::map<std::string, int>& fault_hits() const noexcept { return fault_hits_; }
    // Forgets every object, event, fault and delivery record; keeps the limits, the webhook endpoint and the
    // settle delay as configured.
    void reset();

    // Internals used by the request handlers.
    struct idem_rec {
        std::string fingerprint;
        bool executing = true;
        int status = 0;
        std::string body;
        std::string request_id;
        std::int64_t created = 0;
    };
    struct call;

  private:
    friend struct call;
    asio::awaitable<http::response> api(http::request& req);
    asio::awaitable<http::response> admin(http::request& req);
    asio::awaitable<void> delay(bool stall_ok, const std::string& path);
    asio::awaitable<http::response> post(http::request& req, std::string request_id);
    http::response get(const http::request& req);
    // Creating endpoints: fill status + body; `created` tells whether an object came to exist.
    void create_charge(const std::map<std::string, std::string>& p, int& status, std::string& body,
                       bool& created);
    void create_intent(const std::map<std::string, std::string>& p, int& status, std::string& body,
                       bool& created);
    void cancel_intent(const std::string& id, const std::map<std::string, std::string>& p, int& status,
                       std::string& body);
    void create_refund(const std::map<std::string, std::string>& p, int& status, std::string& body,
                       bool& created);
    charge_rec& new_charge(const std::map<std::string, std::string>& p, const decline_rule* declined);
    charge_rec* find_charge(const std::string& id);
    intent_rec* find_intent(const std::string& id);
    // An object rendered in an API version (the shape differs between versions).
    using render_fn = std::function<std::string(std::string_view version)>;
    render_fn intent_view(const intent_rec& pi) const;
    // Records an event about the object and hands it to the webhook sender.
    void emit(const std::string& type, const std::string& object_json, const std::string& object_id,
              const std::string& group);
    void emit(const std::string& type, const render_fn& object, const std::string& object_id,
              const std::string& group, const std::string& previous_attributes = {});
    // After settle_after_, `step` on the object, unless the double was reset (settle_gen_) or destroyed.
    using settle_step = void (*)(fake_stripe&, const std::string& id);
    void settle_later(const std::string& id, settle_step step);
    void schedule_settlement(const std::string& intent_id);
    void schedule_charge_settlement(const std::string& charge_id);
    std::string new_id(const char* prefix);

    asio::any_io_executor ex_;
    std::unique_ptr<http::server> server_;
    logger log_;
    struct faults faults_;
    fake::limiter limiter_;
    std::map<std::string, fake::limiter> account_limiters_;
    std::map<std::string, decline_rule> declines_;
    std::vector<charge_rec> charges_;
    std::vector<intent_rec> intents_;
    std::vector<refund_rec> refunds_;
    std::vector<dispute_rec> disputes_;
    std::vector<event_rec> events_;
    std::unique_ptr<fake::webhook_sender> webhooks_;
    std::chrono::milliseconds settle_after_{2000};
    int pending_settle_ = 0;
    std::uint64_t settle_gen_ = 0;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    std::map<std::string, std::pair<std::string, std::string>> bank_outcomes_;  // customer → outcome, code
    std::map<std::string, std::string> default_sources_;                        // customer → ba_…
    std::map<std::string, std::string>
        default_methods_;                        // customer → invoice_settings.default_payment_method
    std::string cur_request_id_, cur_idem_key_;  // the POST being executed (an event's `request`)
    // The account the request (or admin step) being executed acts in: objects made now live there, events
    // emitted now carry it. Set and cleared without a suspension in between.
    std::string cur_account_;
    std::string default_api_version_ = "2024-06-20";
    std::string cur_version_ = "2024-06-20";  // the API version the request being executed is rendered in
    std::map<std::string, std::vector<std::string>> accounts_;  // connected account → its customers
    std::map<std::string, idem_rec> idem_;
    std::map<std::string, int> posts_;
    std::map<std::string, int> fault_hits_;
    bool record_requests_ = false;
    std::vector<request_rec> request_log_;
    std::chrono::seconds clock_offset_{0};
    std::mt19937_64 rng_{20240601};
    std::uint64_t seq_ = 0, requests_ = 0, next_req_ = 0;
    int active_ = 0, max_active_ = 0;
};

}  // namespace cg::fake
