// The proxy's resolver (vault/proxy_state.hpp): reservations left uncertain or abandoned are replayed under
// their Idempotency-Key while Stripe still keeps it, else looked for on Stripe by the vault tag, and settled,
// released or deferred; payments answered while still in flight are followed until Stripe says how they
// ended. Runs on the main executor.
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "net/backoff.hpp"
#include "stripe/fact.hpp"
#include "stripe/outcome.hpp"
#include "stripe/types.hpp"
#include "vault/policy.hpp"
#include "vault/proxy_state.hpp"

namespace cg::vault {
namespace {

using ms = std::chrono::milliseconds;

// A payment settled while money may still move without having moved (processing, pending, requires_capture,
// requires_action, requires_confirmation, a status the pinned API version does not define): followed by
// check_in_flight until Stripe says how it ended, so the cap room comes back if it never moves money — an
// intent the customer never authenticates and someone cancels, one back to requires_payment_method, a
// debit that fails. Charged: settled for good, nothing to follow.
bool followed(stripe::movement m) {
    return stripe::money_may_move(m) && m != stripe::movement::charged;
}

// The status a 2xx's body (a PaymentIntent or a charge, as Stripe answered the create) is followed by, or
// empty when it is not followed: note_in_flight's reading, for any settle of a create's answer.
std::string status_to_follow(std::string_view body) {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(body.data(), body.size()).get(doc) != simdjson::SUCCESS) return {};
    std::string_view kind, status;
    if (doc["object"].get(kind) != simdjson::SUCCESS || doc["status"].get(status) != simdjson::SUCCESS)
        return {};
    stripe::movement moved = stripe::movement::charged;  // any other object: nothing to follow
    if (kind == "payment_intent") moved = stripe::intent_movement(status);
    if (kind == "charge") moved = stripe::charge_movement(status);
    return followed(moved) ? std::string(status) : std::string();
}

ms backoff_for(const proxy::state& st, std::int32_t attempts) {
    return net::exponential_delay(st.cfg.first_resolve_delay,
                                  static_cast<std::uint64_t>(std::max(attempts, 0)),
                                  st.cfg.max_resolve_backoff);
}

void resolved(proxy::state& st, const spend_row& row, std::string_view how, std::string_view detail) {
    st.resolutions->Add({{"result", std::string(how)}}).Increment();
    st.log.info("vault reservation resolved", {{"key_id", row.key_id},
                                               {"idempotency_key", row.idempotency_key},
                                               {"amount_cents", row.amount_cents},
                                               {"result", how},
                                               {"detail", detail}});
}

net::awaitable<void> defer(state_ptr st, const spend_row& row, std::string why) {
    st->resolutions->Add({{"result", "deferred"}}).Increment();
    st->log.warn("vault reservation still unresolved",
                 {{"key_id", row.key_id}, {"idempotency_key", row.idempotency_key}, {"reason", why}});
    auto r = co_await st->store.defer(row.key_id, row.idempotency_key, why,
                                      backoff_for(*st, row.resolve_attempts));
    if (!r) st->log.warn("vault resolver: cannot defer", {{"error", r.err().describe()}});
}

// A list search on Stripe either resolved the row (settled, released, or deferred after a failed list) or
// found nothing carrying the tag.
enum class looked { resolved, none };

// The customer's PaymentIntents (a /v1/payment_intents row): the intent carrying the tag, read through the
// fact (stripe/fact.hpp). Money that moved or may still move without a new request keeps counting: settled
// with the intent (succeeded, processing, requires_capture, requires_action, requires_confirmation). Nothing
// moved and nothing will under this request → released: canceled, and requires_payment_method (the attempt
// was declined: the same state a 402 leaves, which the replay releases, and the state a failed debit
// returns to, which check_in_flight releases; only a new confirm with a new payment method, a request the
// cap does not govern, could move money).
net::awaitable<looked> search_intents(state_ptr st, const spend_row& row) {
    auto found = co_await st->stripe->find_payment_intent_by_metadata(
        row.customer, std::string(vault_tag_key), row.idempotency_key, row.reserved_at_unix - 300, 100,
        row.stripe_account);  // created[gte]: clock skew with Stripe
    if (!found) {
        co_await defer(st, row, "PaymentIntent search failed: " + found.err().describe());
        co_return looked::resolved;
    }
    if (!*found) co_return looked::none;
    const auto& pi = **found;
    if (!stripe::money_may_move(stripe::read(pi).moved)) {
        auto r = co_await st->store.release(row.key_id, row.idempotency_key,
                                            "search: PaymentIntent " + pi.id + " " + pi.status);
        if (r) resolved(*st, row, "released", "search found " + pi.status + " PaymentIntent " + pi.id);
        co_return looked::resolved;
    }
    // Named, not a ?: inside the co_await (docs/contributing.md: g++ 12 miscompiles that).
    std::string follow;
    if (followed(stripe::read(pi).moved)) follow = pi.status;
    auto r = co_await st->store.settle(row.key_id, row.idempotency_key, pi.id, std::move(follow));
    if (r) resolved(*st, row, "settled", "search found PaymentIntent " + pi.id + " (" + pi.status + ")");
    co_return looked::resolved;
}

// The customer's charges: the charge carrying the tag. Succeeded or pending → settled (with its
// PaymentIntent's id for a /v1/payment_intents row); failed → released.
net::awaitable<looked> search_charges(state_ptr st, const spend_row& row) {
    auto found = co_await st->stripe->find_charge_by_metadata(row.customer, std::string(vault_tag_key),
                                                              row.idempotency_key,
                                                              row.reserved_at_unix - 300,  // clock skew
                                                              100, row.stripe_account);
    if (!found) {
        co_await defer(st, row, "charge search failed: " + found.err().describe());
        co_return looked::resolved;
    }
    if (!*found) co_return looked::none;
    const auto& c = **found;
    if (stripe::read(c).moved == stripe::movement::failed) {
        auto r =
            co_await st->store.release(row.key_id, row.idempotency_key, "search: charge " + c.id + " failed");
        if (r) resolved(*st, row, "released", "search found failed charge " + c.id);
        co_return looked::resolved;
    }
    std::string id = row.path == "/v1/payment_intents" && !c.payment_intent.empty() ? c.payment_intent : c.id;
    std::string follow;
    if (followed(stripe::read(c).moved)) follow = c.status;
    auto r = co_await st->store.settle(row.key_id, row.idempotency_key, id, std::move(follow));
    if (r) resolved(*st, row, "settled", "search found " + id);
    co_return looked::resolved;
}

// Searches Stripe for the proxy's metadata tag: a /v1/payment_intents row in the customer's PaymentIntents
// first (an intent that made no charge is only found there), then every row in the customer's charges.
// Nothing found → released (both lists read Stripe's own writes at once).
net::awaitable<void> search(state_ptr st, spend_row row) {
    // Decoded, as Stripe reads the body: the tag's spelling inside another parameter's value is no tag.
    bool tagged = carries_vault_tag(row.body, row.idempotency_key);
    if (row.customer.empty() || !tagged) {
        std::string why = row.customer.empty() ? "cannot search Stripe: the request named no customer"
                                               : "cannot search Stripe: the request carried no vault tag";
        co_await defer(st, row, std::move(why));
        co_return;
    }
    if (row.path == "/v1/payment_intents") {
        auto found = co_await search_intents(st, row);
        if (found == looked::resolved) co_return;
    }
    auto found = co_await search_charges(st, row);
    if (found == looked::resolved) co_return;
    auto r = co_await st->store.release(row.key_id, row.idempotency_key,
                                        "search: nothing on Stripe carries the vault tag");
    if (r) resolved(*st, row, "released", "search found nothing tagged");
}

// Re-sends the stored request under its Idempotency-Key: Stripe replays what it saved, or executes it once.
// What the answer means: replay_settlement (policy.hpp).
net::awaitable<void> replay(state_ptr st, spend_row row) {
    auto r = co_await st->stripe->call("POST", row.path, row.body, row.idempotency_key, row.stripe_account);
    replay_answer a;
    if (r.http.ok()) {
        a.status = r.http.resp.status;
        a.replayed = r.replayed;
        a.should_retry = stripe::parse_should_retry(r.http.resp.headers.get("Stripe-Should-Retry"));
        if (r.error) a.error_type = r.error->type;
    }
    switch (replay_settlement(a)) {
        case replay_action::settle: {
            auto id = object_id(r.http.resp.body).value_or("unknown");
            // A payment the replay shows still in flight is followed, as the owner's answer is.
            auto follow = status_to_follow(r.http.resp.body);
            auto s = co_await st->store.settle(row.key_id, row.idempotency_key, id, follow);
            if (s) resolved(*st, row, "settled", "replay: HTTP " + std::to_string(a.status) + " " + id);
            co_return;
        }
        case replay_action::release: {
            auto s = co_await st->store.release(row.key_id, row.idempotency_key, "replay: " + r.message);
            if (s) resolved(*st, row, "released", "replay: " + r.message);
            co_return;
        }
        case replay_action::search:
            co_await search(st, std::move(row));
            co_return;
        case replay_action::defer:
            break;
    }
    co_await defer(st, row, "replay: " + r.message);
}

net::awaitable<void> resolve_row(state_ptr st, spend_row row) {
    // A `reserved` row left behind by a proxy that died may never have reached Stripe: look before replaying
    // it (a replay would execute a request its client may have given up on).
    bool searchable = !row.customer.empty() && carries_vault_tag(row.body, row.idempotency_key);
    if (row.state == "reserved" && searchable) {
        co_await search(st, std::move(row));
        co_return;
    }
    // The row's age now, not when the pass read it: the rows before it in this pass (each with its retries)
    // may have taken long, and a replay past the replay window (proxy_config::replay_window: the client may
    // have moved on to a new key) or Stripe's 24 h would execute the request again.
    bool in_window = !row.path.empty() && !row.body.empty() &&
                     replay_in_window(std::chrono::seconds(row.age_seconds),
                                      std::chrono::steady_clock::now() - row.read_at,
                                      std::min(st->cfg.replay_window, st->cfg.same_key_window));
    if (!in_window) {
        co_await search(st, std::move(row));
        co_return;
    }
    co_await replay(st, std::move(row));
}

net::awaitable<std::size_t> run_resolve_once(state_ptr st) {
    auto rows = co_await st->store.due(st->cfg.stale_reserved, st->cfg.resolve_batch);
    if (!rows) {
        st->log.warn("vault resolver: cannot read reservations", {{"error", rows.err().describe()}});
        co_return 0;
    }
    for (auto& row : *rows) co_await resolve_row(st, std::move(row));
    co_return rows->size();
}

// A reservation settled with its payment still in flight (store::mark_in_flight): retrieved by id until
// Stripe says how it ended. Failed (the intent back to requires_payment_method, canceled, the charge failed)
// → released, so the cap room comes back: nothing was charged. Succeeded → settled for good. Anything else
// (still processing, a retrieve that failed) → checked again after a resolver interval.
net::awaitable<void> check_in_flight(state_ptr st, store::in_flight_row row) {
    using end = store::in_flight_end;
    end how = end::still;
    std::string why;
    if (row.object_id.starts_with("pi_")) {
        auto pi = co_await st->stripe->retrieve_payment_intent(row.object_id, row.stripe_account);
        if (!pi) {
            why = pi.err().describe();
        } else if (auto f = stripe::read(*pi); f.moved == stripe::movement::charged) {
            how = end::succeeded;
        } else if (f.moved == stripe::movement::failed || f.moved == stripe::movement::canceled) {
            how = end::failed;
            why = "PaymentIntent " + pi->id + " " + pi->status + " after " + row.settled_status;
            if (!pi->last_error_code.empty()) why += ": " + pi->last_error_code;
        }
    } else {
        auto ch = co_await st->stripe->retrieve_charge(row.object_id, row.stripe_account);
        if (!ch) {
            why = ch.err().describe();
        } else if (auto f = stripe::read(*ch); f.moved == stripe::movement::charged) {
            how = end::succeeded;
        } else if (f.moved == stripe::movement::failed) {
            how = end::failed;
            why = "charge " + ch->id + " failed after " + row.settled_status + ": " + ch->failure_code;
        }
    }
    auto r = co_await st->store.end_in_flight(row.key_id, row.idempotency_key, how, why);
    if (!r) {
        st->log.warn("vault resolver: cannot record an in-flight payment", {{"error", r.err().describe()}});
        co_return;
    }
    if (how == end::failed && *r) {
        st->resolutions->Add({{"result", "released_after_processing"}}).Increment();
        st->log.warn("vault reservation released: the payment failed after processing",
                     {{"key_id", row.key_id}, {"idempotency_key", row.idempotency_key}, {"reason", why}});
    } else if (how == end::still && !why.empty()) {
        st->log.warn("vault resolver: cannot retrieve an in-flight payment",
                     {{"key_id", row.key_id}, {"object", row.object_id}, {"error", why}});
    }
}

net::awaitable<std::size_t> run_in_flight_once(state_ptr st) {
    auto rows = co_await st->store.in_flight_due(st->cfg.resolve_interval, st->cfg.resolve_batch);
    if (!rows) {
        st->log.warn("vault resolver: cannot read in-flight payments", {{"error", rows.err().describe()}});
        co_return 0;
    }
    for (auto& row : *rows) co_await check_in_flight(st, std::move(row));
    co_return rows->size();
}

}  // namespace

net::awaitable<void> resolver_loop(state_ptr st) {
    while (!st->stopping) {
        std::size_t looked = co_await run_resolve_once(st);
        looked += co_await run_in_flight_once(st);
        (void)looked;
        bool more = co_await nap(st, st->cfg.resolve_interval);
        if (!more) break;
    }
}

net::awaitable<std::size_t> proxy::resolve_once() {
    auto n = co_await run_resolve_once(st_);
    co_return n + co_await run_in_flight_once(st_);
}

namespace {

net::awaitable<void> mark_in_flight_task(state_ptr st, std::string key_id, std::string idem,
                                         std::string status) {
    auto r = co_await st->store.mark_in_flight(key_id, idem, status);
    if (!r)
        st->log.warn("vault: cannot mark a payment in flight; it counts as settled",
                     {{"key_id", key_id}, {"idempotency_key", idem}, {"error", r.err().describe()}});
}

}  // namespace

void note_in_flight(std::shared_ptr<proxy::state> st, const std::string& key_id, const std::string& idem,
                    std::string_view body) {
    auto status = status_to_follow(body);
    if (status.empty()) return;
    spawn_logged(st, mark_in_flight_task(st, key_id, idem, std::move(status)), "mark_in_flight");
}

}  // namespace cg::vault
