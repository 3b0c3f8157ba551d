#include "app/dead_letter_replay.hpp"

#include <cstdio>
#include <string>

#include "app/cli.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/machine.hpp"
#include "billing/store/dead_letter_store.hpp"
#include "billing/store/ledger.hpp"
#include "billing/store/retry_store.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
namespace {

struct replay_counts {
    int replayed = 0, skipped = 0, refused = 0, failed = 0;
};

// The ledger row a replayed event would meet, reopened when a replay can charge it only that way; says what
// it found. Returns whether to publish; false also when PostgreSQL failed (counted) or the replay was refused
// (counted): a replay that can only be dead-lettered again, or finished as a duplicate, publishes nothing
// and so creates no new letter.
net::awaitable<bool> check_row(const letters_replay_flags& f, billing::ledger& led,
                               billing::retry_store& rows, const billing::stored_letter& l,
                               const billing::billing_event& ev, replay_counts& n) {
    auto id = static_cast<long long>(l.id);
    auto found = co_await rows.by_customer(ev.customer_id, ev.billing_period, ev.stripe_account);
    if (!found) {
        std::fprintf(stderr, "letter %lld: reading the ledger failed: %s (not published)\n", id,
                     found.err().describe().c_str());
        ++n.failed;
        co_return false;
    }
    if (!*found) co_return true;  // a first delivery: charged as any event
    const auto& row = **found;
    const auto& had = row.event;
    auto refuse = [&](const std::string& why) {
        std::printf("letter %lld: refused, nothing published: %s\n", id, why.c_str());
        ++n.refused;
        return false;
    };
    if (had.amount_cents != ev.amount_cents || had.currency != ev.currency ||
        had.stripe_customer_id != ev.stripe_customer_id)
        co_return refuse(
            "ledger row " + row.key + " holds " + std::to_string(had.amount_cents) + " " + had.currency +
            " for " + had.stripe_customer_id + ", this event says " + std::to_string(ev.amount_cents) + " " +
            ev.currency + " for " + ev.stripe_customer_id +
            ": it would be dead-lettered again as a conflict (give a corrected event with --event "
            "FILE, or close the letter: dead-letters dismiss " +
            std::to_string(l.id) + " --reason R)");
    auto status = std::string(billing::to_string(row.status));
    switch (billing::machine::on_replay(row.status)) {
        case billing::machine::replay_command::refuse_superseded:
            co_return refuse("superseded: ledger row " + row.key + " is " + status + " (" +
                             row.charge_id.value_or(row.payment_intent_id.value_or("-")) +
                             "): the event would be finished as a duplicate (close the letter: dead-letters "
                             "dismiss " +
                             std::to_string(l.id) + " --reason R)");
        case billing::machine::replay_command::refuse_declined:
            co_return refuse("ledger row " + row.key +
                             " is declined: the event would be finished as a duplicate (once the payment "
                             "method is fixed: chargeguard retry-declined --key " +
                             row.key + " --reason R)");
        case billing::machine::replay_command::refuse_conflict:
            co_return refuse("ledger row " + row.key + " is in conflict (" + row.last_error.value_or("-") +
                             "): resolved by hand, see docs/operating/dead-letters.md");
        case billing::machine::replay_command::publish:
            co_return true;  // the pipeline is on it: one more delivery is harmless
        case billing::machine::replay_command::reopen_then_publish:
            break;
    }
    auto why = "reopened by the replay of dead letter " + std::to_string(l.id) + " by " + f.by;
    auto reopened = co_await led.reopen_for_replay(row.key, why);
    if (!reopened) {
        std::fprintf(stderr, "letter %lld: cannot reopen ledger row %s: %s (not published)\n", id,
                     row.key.c_str(), reopened.err().describe().c_str());
        ++n.failed;
        co_return false;
    }
    if (*reopened) {
        const bool late = **reopened == billing::record_status::failed_after_processing;
        std::printf("letter %lld: ledger row %s reopened (was %s): the replay %s\n", id, row.key.c_str(),
                    std::string(billing::to_string(**reopened)).c_str(),
                    late ? "charges again under a new key generation" : "searches Stripe, then charges");
    }
    co_return true;
}

// One letter: skip if closed (unless --force), refuse a body `consume` would dead-letter again (unless
// --no-validate) or one the ledger would only finish as a duplicate or a conflict, publish, mark. Returns
// false when publishing failed (the caller stops: nsqd is unwell).
net::awaitable<bool> replay_one(const letters_replay_flags& f, billing::dead_letter_store& store,
                                billing::ledger& led, billing::retry_store& rows, nsq::producer& prod,
                                const billing::stored_letter& l, replay_counts& n) {
    auto id = static_cast<long long>(l.id);
    if (!l.open() && !f.force) {
        if (l.dismissed_at)
            std::printf("letter %lld: dismissed by %s at %s (%s); skipped (--force publishes it)\n", id,
                        l.dismissed_by.value_or("?").c_str(), timestamp_or_dash(l.dismissed_at).c_str(),
                        l.dismiss_reason.value_or("-").c_str());
        else
            std::printf("letter %lld: already replayed by %s at %s; skipped (--force publishes it again)\n",
                        id, l.replayed_by.value_or("?").c_str(), timestamp_or_dash(l.replayed_at).c_str());
        ++n.skipped;
        co_return true;
    }
    const bool corrected = !f.event.empty();
    const std::string& body = corrected ? f.event : l.raw_body;
    if (corrected || !f.no_validate) {
        auto ev = billing::parse_event(body);
        if (!ev) {
            std::printf(
                "letter %lld: refused, nothing published: %s is not a valid billing event (%s); %s\n", id,
                corrected ? "the corrected event" : "the body", ev.err().describe().c_str(),
                corrected ? "fix the file" : "give a corrected event with --event FILE, or --no-validate");
            ++n.refused;
            co_return true;
        }
        if (!co_await check_row(f, led, rows, l, *ev, n)) co_return true;
    }
    const std::string& topic = f.topic.empty() ? l.topic : f.topic;
    auto pub = co_await prod.publish(topic, body);
    if (!pub) {
        std::fprintf(stderr, "letter %lld: publish to %s failed: %s (the letter stays open)\n", id,
                     topic.c_str(), pub.err().describe().c_str());
        ++n.failed;
        co_return false;
    }
    std::optional<std::string> fixed;
    if (corrected) fixed = body;
    auto marked = co_await store.mark_replayed(l.id, f.by, f.force, std::move(fixed));
    if (!marked) {
        // Published but not marked: a second replay publishes again, which the content key makes harmless.
        std::fprintf(stderr, "letter %lld: published to %s, but marking it replayed failed: %s\n", id,
                     topic.c_str(), marked.err().describe().c_str());
        ++n.failed;
        co_return true;
    }
    std::printf("letter %lld: replayed%s to topic %s by %s%s\n", id,
                corrected ? " with the corrected event" : "", topic.c_str(), f.by.c_str(),
                *marked ? "" : " (another replay marked it first)");
    ++n.replayed;
    co_return true;
}

}  // namespace

net::awaitable<int> run_replay(letters_replay_flags f, std::shared_ptr<pg::pool> pool,
                               nsq::producer* producer) {
    billing::dead_letter_store store(pool);
    billing::ledger led(pool);
    billing::retry_store rows(pool);
    nsq::producer& prod = *producer;
    replay_counts n;
    bool go_on = true;
    for (auto id : f.ids) {
        if (!go_on) break;
        auto r = co_await store.find(id);
        if (!r) {
            std::fprintf(stderr, "letter %lld: %s\n", static_cast<long long>(id), r.err().describe().c_str());
            ++n.failed;
            break;
        }
        if (!*r) {
            std::fprintf(stderr, "letter %lld: no such dead letter\n", static_cast<long long>(id));
            ++n.failed;
            continue;
        }
        go_on = co_await replay_one(f, store, led, rows, prod, **r, n);
    }
    if (!f.reason.empty()) {
        billing::letter_filter flt;
        flt.reason_prefix = f.reason;
        flt.include_replayed = false;
        flt.limit = 500;
        while (go_on) {
            auto page = co_await store.list(flt);
            if (!page) {
                std::fprintf(stderr, "listing letters: %s\n", page.err().describe().c_str());
                ++n.failed;
                break;
            }
            for (const auto& l : *page) {
                go_on = co_await replay_one(f, store, led, rows, prod, l, n);
                if (!go_on) break;
            }
            if (page->size() < static_cast<std::size_t>(flt.limit)) break;
            flt.after_id = page->back().id;
        }
    }
    co_await prod.close();
    std::printf("%d replayed, %d skipped (closed already), %d refused, %d failed\n", n.replayed, n.skipped,
                n.refused, n.failed);
    co_return n.failed > 0 || n.refused > 0 ? 1 : 0;
}

}  // namespace cg::app
