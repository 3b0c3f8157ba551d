// Leases of a key's cap (docs/design.md §5, "Cap leases"; migration 0025). A proxy that sees a steady
// stream of creates for a key takes a slice of the key's free room in one statement and spends it in
// memory: a create the slice covers is forwarded at once, and its reservation row is written just after,
// batched with the other spends of the key (cg_vault_lease_record). What a lease holds counts against the
// cap in PostgreSQL from the moment it is granted (vault_keys.leased_cents), so the proxy never needs the
// database to know that a create fits; the row only says which request the cents went to, and lets the
// resolver and the settlements work as for any reservation. A retry the row shows to be one (existing, or
// another amount) gets its cents back into the lease: counted once.
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <climits>
#include <cstdio>
#include <random>

#include "vault/proxy_state.hpp"

namespace cg::vault {

void show_lease(proxy::state& st, const std::string& key, proxy::state::key_lease& kl) {
    if (!st.lease_cents) return;
    if (!kl.gauge) {
        if (kl.id == 0 && kl.remaining == 0) return;  // a key never leased here has no series
        kl.gauge = &st.lease_cents->Add({{"key", key}});
    }
    kl.gauge->Set(static_cast<double>(kl.id == 0 ? 0 : kl.remaining));
}

namespace {

using clock = std::chrono::steady_clock;
using key_lease = proxy::state::key_lease;
using lease_spend = proxy::state::lease_spend;

const std::string& holder(proxy::state& st) {
    if (st.lease_holder.empty()) {
        char host[256] = {};
        if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
        std::random_device rd;
        char tail[17];
        std::snprintf(tail, sizeof tail, "%08x%08x", rd(), rd());
        st.lease_holder = std::string(host) + ":" + std::to_string(getpid()) + ":" + tail;
    }
    return st.lease_holder;
}

void count_take(proxy::state& st, const char* result) {
    if (st.lease_takes) st.lease_takes->Add({{"result", result}}).Increment();
}

// Counts a create in the key's pace (both paths).
void note_pace(proxy::state& st, key_lease& kl, std::int64_t amount, clock::time_point now) {
    const auto w = st.cfg.lease_pace_window;
    if (now - kl.window_start >= w) {
        kl.last_creates = kl.window_creates;
        kl.last_cents = kl.window_cents;
        kl.last_end = kl.window_start + w;
        kl.window_creates = kl.window_cents = 0;
        kl.window_start = now;
    }
    ++kl.window_creates;
    kl.window_cents += amount;
    kl.max_amount = std::max(kl.max_amount, amount);
}

// A whole window with enough creates, ended less than half a lease's life ago (a stream that pauses for a
// few seconds is still one).
bool steady(const proxy::state& st, const key_lease& kl, clock::time_point now) {
    return kl.last_creates >= st.cfg.lease_min_creates && now - kl.last_end < st.cfg.lease_ttl / 2;
}

// The lease worth holding: `cap_lease` of the last window's pace, at least two of the largest create seen.
std::int64_t wanted(const proxy::state& st, const key_lease& kl) {
    auto w = std::max<std::int64_t>(1, st.cfg.lease_pace_window.count());
    auto pace =
        static_cast<__int128>(std::max(kl.last_cents, kl.window_cents)) * st.cfg.cap_lease.count() / w;
    std::int64_t want = pace > INT64_MAX / 4 ? INT64_MAX / 4 : static_cast<std::int64_t>(pace);
    return std::max(want, 2 * kl.max_amount);
}

net::awaitable<void> take_task(state_ptr st, std::string key) {
    auto* kl = &st->leases[key];
    std::optional<std::int64_t> id;
    if (kl->id != 0) id = kl->id;
    const std::int64_t want = wanted(*st, *kl);
    // A new lease must cover two of the largest creates seen; a top-up, one more. Not a share of what is
    // wanted: a busy proxy wants more than the eighth of the free room a grant may take, and would then never
    // lease beside another proxy that leased first (the room's eighth still keeps near the cap lease-free).
    const std::int64_t min = id ? kl->max_amount : 2 * kl->max_amount;
    const auto sent = clock::now();
    result<store::lease_grant> g = error(core_errc::io_error, "not run");
    try {
        g = co_await st->store.lease_take(key, id, holder(*st), want, min, st->cfg.lease_ttl);
    } catch (const std::exception& e) {
        g = error(core_errc::io_error, e.what());
    }
    kl = &st->leases[key];
    kl->taking = false;
    if (!g) {
        count_take(*st, "failed");
        st->log.warn("vault proxy: cannot take or renew a cap lease; creates reserve one by one",
                     {{"key_id", key}, {"error", g.err().describe()}});
        co_return;
    }
    if (!g->usable) {  // revoked or expired: nothing more is spent from it
        count_take(*st, "key_unusable");
        kl->remaining = 0;
        kl->spend_until = {};
        show_lease(*st, key, *kl);
        co_return;
    }
    if (!g->lease_id) {
        if (kl->id != 0) {  // forfeited by an operator: never spent from again
            count_take(*st, "forfeited");
            kl->id = 0;
            kl->remaining = 0;
            show_lease(*st, key, *kl);
        } else {
            count_take(*st, "none");
        }
        co_return;
    }
    count_take(*st, kl->id == 0 ? "new" : g->granted_cents > 0 ? "topped_up" : "renewed");
    if (kl->id == 0) kl->last_spend = clock::now();  // a new lease is not idle yet
    kl->id = *g->lease_id;
    kl->remaining += g->granted_cents;
    show_lease(*st, key, *kl);
    // Measured from before the statement was sent, less a tenth: this proxy stops spending before the
    // database's expiry.
    kl->spend_until = sent + st->cfg.lease_ttl - st->cfg.lease_ttl / 10;
    st->log.debug("vault proxy: cap lease", {{"key_id", key},
                                             {"want_cents", want},
                                             {"lease", kl->id},
                                             {"granted_cents", g->granted_cents},
                                             {"remaining_cents", kl->remaining}});
}

// Takes, tops up or renews the key's lease in the background, unless one is on its way.
void start_take(const state_ptr& st, const std::string& key, key_lease& kl) {
    if (kl.taking || kl.returning || kl.stranded || st->stopping || st->cfg.cap_lease.count() <= 0) return;
    kl.taking = true;
    // Posted, not dispatched: the create that asked for it is forwarded first.
    asio::post(st->main, [st, key] {
        asio::co_spawn(st->main, take_task(st, key), [log = st->log](std::exception_ptr e) {
            if (e) log.error("vault proxy: cap lease take failed", {{"error", describe_exception(e)}});
        });
    });
}

// What happens next to a lease after a create: a new one once the pace is steady; a top-up when half is
// spent; a renewal when half of its time is gone.
void maybe_take(const state_ptr& st, const std::string& key, key_lease& kl, clock::time_point now) {
    if (kl.id == 0) {
        if (steady(*st, kl, now)) start_take(st, key, kl);
        return;
    }
    if (kl.remaining < wanted(*st, kl) / 2 || kl.spend_until - now < st->cfg.lease_ttl / 2)
        start_take(st, key, kl);
}

// The spend, if the key's lease covers `rq` now.
std::shared_ptr<lease_spend> spend_from_lease(const state_ptr& st, reserve_request& rq,
                                              clock::time_point now) {
    auto it = st->leases.find(rq.key_id);
    if (it == st->leases.end()) return nullptr;
    auto& kl = it->second;
    if (kl.id == 0 || kl.returning || kl.stranded || now >= kl.spend_until || kl.remaining < rq.amount_cents)
        return nullptr;
    kl.remaining -= rq.amount_cents;
    kl.last_spend = now;
    const std::string key = rq.key_id;
    show_lease(*st, key, kl);
    auto sp = std::make_shared<lease_spend>();
    sp->req = std::move(rq);
    kl.unrecorded.push_back(sp);
    ++st->lease_records_pending;
    start_record(st, key);
    maybe_take(st, key, kl, now);
    return sp;
}

// Gives back what the key's lease holds and closes it, once nothing under it is unwritten. False when it
// stays (spends unwritten, a take in flight, or PostgreSQL refused).
net::awaitable<bool> give_back(state_ptr st, std::string key) {
    auto* kl = &st->leases[key];
    if (kl->id == 0 || kl->stranded || kl->taking || kl->recording || !kl->unrecorded.empty() ||
        kl->returning)
        co_return false;
    kl->returning = true;
    const std::int64_t id = kl->id;
    kl->remaining = 0;
    show_lease(*st, key, *kl);
    result<std::int64_t> r = error(core_errc::io_error, "not run");
    try {
        // Nothing unwritten: all the lease still holds in PostgreSQL is unspent.
        r = co_await st->store.lease_return(key, id, holder(*st), INT64_MAX, true);
    } catch (const std::exception& e) {
        r = error(core_errc::io_error, e.what());
    }
    kl = &st->leases[key];
    kl->returning = false;
    if (!r) {
        st->log.warn("vault proxy: cannot give a cap lease back; it stays counted until given back",
                     {{"key_id", key}, {"lease", id}, {"error", r.err().describe()}});
        co_return false;
    }
    kl->id = 0;
    kl->spend_until = {};
    if (st->lease_returned_cents && *r > 0) st->lease_returned_cents->Increment(static_cast<double>(*r));
    st->log.debug("vault proxy: cap lease given back", {{"key_id", key}, {"lease", id}, {"cents", *r}});
    co_return true;
}

}  // namespace

net::awaitable<create_reservation> reserve_create(state_ptr st, reserve_request rq, ledger_line& l) {
    create_reservation out;
    const auto now = clock::now();
    const bool leasing = st->cfg.cap_lease.count() > 0;
    if (leasing) {
        auto& kl = st->leases[rq.key_id];
        note_pace(*st, kl, rq.amount_cents, now);
        if (auto sp = spend_from_lease(st, rq, now)) {
            l.queued = l.stmt_sent = l.stmt_done = now;
            reserve_result res;
            res.outcome = reserve_outcome::reserved;
            res.state = "reserved";
            out.res = res;
            out.spend = std::move(sp);
            co_return out;
        }
        maybe_take(st, rq.key_id, kl, now);
    }
    std::optional<reserve_request> again;
    if (leasing) again = rq;  // for a second try after this proxy's lease gave its cents back
    out.res = co_await reserve_batched(st, std::move(rq), l);
    if (!leasing || !out.res || out.res->outcome != reserve_outcome::cap_exceeded) co_return out;
    // Refused while this proxy's lease may hold cents: a lease granted meanwhile may cover it; else what the
    // lease holds (too little for this create) goes back, and the reservation is tried once more.
    if (auto sp = spend_from_lease(st, *again, clock::now())) {
        out.res = reserve_result{reserve_outcome::reserved, "reserved", 0, 0};
        out.spend = std::move(sp);
        co_return out;
    }
    auto it = st->leases.find(again->key_id);
    if (it == st->leases.end() || it->second.id == 0 || it->second.stranded || it->second.remaining <= 0)
        co_return out;
    const std::int64_t cents = it->second.remaining, id = it->second.id;
    it->second.remaining = 0;
    show_lease(*st, again->key_id, it->second);
    result<std::int64_t> back = error(core_errc::io_error, "not run");
    try {
        back = co_await st->store.lease_return(again->key_id, id, holder(*st), cents, false);
    } catch (const std::exception& e) {
        back = error(core_errc::io_error, e.what());
    }
    if (!back || *back == 0) co_return out;
    if (st->lease_returned_cents) st->lease_returned_cents->Increment(static_cast<double>(*back));
    out.res = co_await reserve_batched(st, std::move(*again), l);
    co_return out;
}

std::string account_create(const state_ptr& st, const create_reservation& c, const std::string& key_id,
                           const std::string& idem, const http::client_result& r) {
    if (!c.spend) return account(st, *c.res, key_id, idem, r);
    auto& sp = *c.spend;
    if (sp.recorded) {
        if (sp.recorded->outcome == reserve_outcome::key_expired) return "retry_forwarded";
        return account(st, *sp.recorded, key_id, idem, r);
    }
    // The row is not written yet: the answer waits with the spend and is accounted once it is. The audit
    // says what it means for the owner (which the spend almost always is).
    sp.answer = r;
    int status = r.ok() ? r.resp.status : 0;
    switch (owner_settlement(status, r.request_sent)) {
        case settlement::settle:
            return "settled";
        case settlement::release:
            return r.ok() ? "released" : "upstream_unreachable";
        case settlement::uncertain:
            break;
    }
    return "uncertain";
}

net::awaitable<void> lease_loop(state_ptr st) {
    const auto tick = std::max<clock::duration>(st->cfg.lease_ttl / 8, std::chrono::milliseconds(10));
    while (!st->stopping) {
        if (!co_await nap(st, tick)) break;
        const auto now = clock::now();
        std::vector<std::string> idle;
        for (auto& [key, kl] : st->leases) {
            if (kl.id == 0) continue;
            if (now - kl.last_spend >= st->cfg.lease_ttl / 2)
                idle.push_back(key);
            else if (kl.spend_until - now < st->cfg.lease_ttl / 2)
                start_take(st, key, kl);  // renewed while spent
        }
        for (auto& key : idle) (void)co_await give_back(st, key);
    }
}

net::awaitable<void> return_leases(state_ptr st) {
    // Every record and take ends first (at stop a record that keeps failing is given up after
    // settle_attempts and strands its lease), so no lease task outlives stop() holding the state.
    for (int i = 0; i < 4000; ++i) {
        bool busy = false;
        for (auto& [key, kl] : st->leases) busy = busy || kl.recording || kl.taking || kl.returning;
        if (!busy) break;
        net::steady_timer t(st->main, std::chrono::milliseconds(5));
        co_await t.async_wait();
    }
    std::vector<std::string> keys;
    for (auto& [key, kl] : st->leases)
        if (kl.id != 0) keys.push_back(key);
    for (auto& key : keys) (void)co_await give_back(st, key);
}

}  // namespace cg::vault
