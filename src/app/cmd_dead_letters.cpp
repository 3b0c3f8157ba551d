// `chargeguard dead-letters list|show ID|replay ID…|replay --reason R`: inspect the messages the pipeline
// could not process and re-drive them once their cause is fixed (the customer's card, the ledger row in
// conflict, the producer's data).
//
// A replay first reopens the letter's ledger row when it is `failed` (Stripe refused the request as sent),
// `cap_blocked` (the vault refused it) or `failed_after_processing` (the bank debit failed days later; the
// row goes straight to a new key generation, since Stripe said how the old payment ended): back to pending,
// to be searched for (or, after a late failure, charged under the new key) by the redelivery —
// without that the replayed message would meet a final row and be finished as a duplicate, uncharged. It
// then publishes the stored raw body to the letter's topic with the ordinary NSQ producer, and marks the
// letter replayed (who, when). Publish first, mark second: a crash in between leaves the letter unmarked and
// a second replay publishes it again, which the content-keyed charge makes harmless; the other order could
// lose the event. A letter already replayed is skipped unless --force (idempotent by default).
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <memory>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/pg_flags.hpp"
#include "billing/dead_letter_store.hpp"
#include "billing/event.hpp"
#include "billing/ledger.hpp"
#include "net/address.hpp"
#include "net/offload.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
namespace {

struct letters_list_flags {
    pg_flags pg;
    std::string reason;
    bool all = false;
    std::int64_t limit = 100;
    bool json = false;
};

struct letters_show_flags {
    pg_flags pg;
    std::int64_t id = 0;
    bool json = false;
};

struct letters_replay_flags {
    pg_flags pg;
    std::vector<std::int64_t> ids;
    std::string reason;
    std::string nsqd_tcp_address;
    std::string topic;  // empty: each letter's own topic
    std::string by;
    bool force = false;
    bool no_validate = false;
};

std::string default_operator() {
    const char* u = std::getenv("USER");
    if (!u || !*u) u = std::getenv("LOGNAME");
    std::string who = u && *u ? u : "unknown";
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0 && host[0]) who += std::string("@") + host;
    return who;
}

// A short, printable preview of a body for the table.
std::string preview(const std::string& body, std::size_t max = 60) {
    std::string out;
    for (char c : body) {
        if (out.size() >= max) {
            out += "…";
            break;
        }
        out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '.' : c;
    }
    return out;
}

// A pool of one connection on `io` for a one-shot command (no readiness, no metrics).
std::shared_ptr<pg::pool> one_shot_pool(asio::io_context& io, net::offload_pool& off, const pg_flags& f,
                                        const logger& log) {
    auto o = to_pool_options(f);
    o.size = 1;
    return pg::pool::create(io.get_executor(), off.get_executor(), std::move(o), log);
}

// Runs `task` (returning the exit code) on a fresh loop, then closes the pool.
// With `nsqd`, also a producer for it, created and destroyed outside the coroutine (as `publish` does).
template <typename Make>
int run_one_shot(const pg_flags& f, const global_flags& g, Make make, const std::string& nsqd = {}) {
    auto log = make_stderr_logger(g.level());
    (void)to_pg_config(f);  // validates before anything connects
    asio::io_context io{1};
    net::offload_pool off{1};
    auto pool = one_shot_pool(io, off, f, log);
    std::unique_ptr<nsq::producer> producer;
    if (!nsqd.empty())
        producer = std::make_unique<nsq::producer>(io.get_executor(), nsqd, nsq::producer_config{}, log);
    int rc = run_then_close_pool(io, pool, make(pool, producer.get()), "dead-letters");
    off.drain();
    return rc;
}

net::awaitable<int> run_list(letters_list_flags f, std::shared_ptr<pg::pool> pool) {
    billing::dead_letter_store store(pool);
    billing::letter_filter flt;
    if (!f.reason.empty()) flt.reason_prefix = f.reason;
    flt.include_replayed = f.all;
    flt.limit = f.limit;
    auto r = co_await store.list(flt);
    if (!r) {
        std::fprintf(stderr, "chargeguard dead-letters list: %s\n", r.err().describe().c_str());
        co_return exit_failure;
    }
    if (f.json) {
        for (const auto& l : *r) std::printf("%s\n", billing::to_json(l, false).c_str());
        co_return 0;
    }
    std::printf("%-8s %-29s %-12s %-8s %-29s %-40s %s\n", "ID", "RECEIVED", "TOPIC", "ATTEMPTS", "REPLAYED",
                "REASON", "BODY");
    for (const auto& l : *r)
        std::printf("%-8lld %-29s %-12s %-8d %-29s %-40s %s\n", static_cast<long long>(l.id),
                    pg::format_timestamptz(l.received_at).c_str(), l.topic.c_str(), l.attempts,
                    timestamp_or_dash(l.replayed_at).c_str(), preview(l.reason, 40).c_str(),
                    preview(l.raw_body).c_str());
    std::printf("%zu letter(s)%s\n", r->size(), f.all ? "" : " not replayed yet (--all for every letter)");
    co_return 0;
}

net::awaitable<int> run_show(letters_show_flags f, std::shared_ptr<pg::pool> pool) {
    billing::dead_letter_store store(pool);
    auto r = co_await store.find(f.id);
    if (!r) {
        std::fprintf(stderr, "chargeguard dead-letters show: %s\n", r.err().describe().c_str());
        co_return exit_failure;
    }
    if (!*r) {
        std::fprintf(stderr, "chargeguard dead-letters show: no dead letter %lld\n",
                     static_cast<long long>(f.id));
        co_return exit_problem;
    }
    const auto& l = **r;
    if (f.json) {
        std::printf("%s\n", billing::to_json(l, true).c_str());
        co_return 0;
    }
    std::printf(
        "id:             %lld\nreceived_at:    %s\ntopic:          %s\nchannel:        %s\n"
        "nsq_message_id: %s\nattempts:       %d\nreason:         %s\nbilling_key:    %s\n"
        "replayed_at:    %s\nreplayed_by:    %s\nreplay_count:   %d\nbody (%zu bytes):\n%s\n",
        static_cast<long long>(l.id), pg::format_timestamptz(l.received_at).c_str(), l.topic.c_str(),
        l.channel.c_str(), l.nsq_message_id.c_str(), l.attempts, l.reason.c_str(),
        l.billing_key.value_or("-").c_str(), timestamp_or_dash(l.replayed_at).c_str(),
        l.replayed_by.value_or("-").c_str(), l.replay_count, l.raw_body.size(), l.raw_body.c_str());
    co_return 0;
}

struct replay_counts {
    int replayed = 0, skipped = 0, failed = 0;
};

// One letter: skip if replayed (unless --force), refuse a body `consume` would dead-letter again (unless
// --no-validate), publish, mark. Returns false when publishing failed (the caller stops: nsqd is unwell).
// The letter's ledger row, reopened when a replay can charge it only that way; says what it found. False
// when PostgreSQL failed (the letter is not published).
net::awaitable<bool> reopen_row(const letters_replay_flags& f, billing::ledger& led,
                                const billing::stored_letter& l) {
    if (!l.billing_key) co_return true;
    auto id = static_cast<long long>(l.id);
    auto why = "reopened by the replay of dead letter " + std::to_string(l.id) + " by " + f.by;
    auto reopened = co_await led.reopen_for_replay(*l.billing_key, why);
    if (!reopened) {
        std::fprintf(stderr, "letter %lld: cannot reopen ledger row %s: %s (not published)\n", id,
                     l.billing_key->c_str(), reopened.err().describe().c_str());
        co_return false;
    }
    if (*reopened) {
        const bool late = **reopened == billing::record_status::failed_after_processing;
        std::printf("letter %lld: ledger row %s reopened (was %s): the replay %s\n", id,
                    l.billing_key->c_str(), std::string(billing::to_string(**reopened)).c_str(),
                    late ? "charges again under a new key generation" : "searches Stripe, then charges");
        co_return true;
    }
    auto row = co_await led.find(*l.billing_key);
    if (row && *row && billing::is_final((*row)->status))
        std::printf(
            "letter %lld: ledger row %s is %s: the replayed message will be finished as a duplicate "
            "(a conflict is resolved by hand, see README \"Dead letters\")\n",
            id, l.billing_key->c_str(), std::string(billing::to_string((*row)->status)).c_str());
    co_return true;
}

net::awaitable<bool> replay_one(const letters_replay_flags& f, billing::dead_letter_store& store,
                                billing::ledger& led, nsq::producer& prod, const billing::stored_letter& l,
                                replay_counts& n) {
    if (l.replayed_at && !f.force) {
        std::printf("letter %lld: already replayed by %s at %s; skipped (--force publishes it again)\n",
                    static_cast<long long>(l.id), l.replayed_by.value_or("?").c_str(),
                    timestamp_or_dash(l.replayed_at).c_str());
        ++n.skipped;
        co_return true;
    }
    if (!f.no_validate) {
        if (auto ev = billing::parse_event(l.raw_body); !ev) {
            std::printf(
                "letter %lld: body is still not a valid billing event (%s); fix the data first, or "
                "--no-validate\n",
                static_cast<long long>(l.id), ev.err().describe().c_str());
            ++n.failed;
            co_return true;
        }
    }
    if (!co_await reopen_row(f, led, l)) {
        ++n.failed;
        co_return true;
    }
    const std::string& topic = f.topic.empty() ? l.topic : f.topic;
    auto pub = co_await prod.publish(topic, l.raw_body);
    if (!pub) {
        std::fprintf(stderr, "letter %lld: publish to %s failed: %s (the letter stays unmarked)\n",
                     static_cast<long long>(l.id), topic.c_str(), pub.err().describe().c_str());
        ++n.failed;
        co_return false;
    }
    auto marked = co_await store.mark_replayed(l.id, f.by, f.force);
    if (!marked) {
        // Published but not marked: a second replay publishes again, which the content key makes harmless.
        std::fprintf(stderr, "letter %lld: published to %s, but marking it replayed failed: %s\n",
                     static_cast<long long>(l.id), topic.c_str(), marked.err().describe().c_str());
        ++n.failed;
        co_return true;
    }
    std::printf("letter %lld: replayed to topic %s by %s%s\n", static_cast<long long>(l.id), topic.c_str(),
                f.by.c_str(), *marked ? "" : " (another replay marked it first)");
    ++n.replayed;
    co_return true;
}

net::awaitable<int> run_replay(letters_replay_flags f, std::shared_ptr<pg::pool> pool,
                               nsq::producer* producer) {
    billing::dead_letter_store store(pool);
    billing::ledger led(pool);
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
        go_on = co_await replay_one(f, store, led, prod, **r, n);
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
                go_on = co_await replay_one(f, store, led, prod, l, n);
                if (!go_on) break;
            }
            if (page->size() < static_cast<std::size_t>(flt.limit)) break;
            flt.after_id = page->back().id;
        }
    }
    co_await prod.close();
    std::printf("%d replayed, %d skipped (already replayed), %d failed\n", n.replayed, n.skipped, n.failed);
    co_return n.failed > 0 ? 1 : 0;
}

// Selects `run(flags, pool)` (a subcommand without a producer) to run on a one-shot loop.
template <typename Flags, typename Run>
void select_one_shot(command_main& selected, std::shared_ptr<Flags> f, Run run) {
    selected = [f, run](const global_flags& g) {
        return run_one_shot(f->pg, g, [f, run](std::shared_ptr<pg::pool> p, nsq::producer*) {
            return run(*f, std::move(p));
        });
    };
}

}  // namespace

void register_dead_letters(CLI::App& app, command_main& selected) {
    auto* dl =
        app.add_subcommand("dead-letters", "inspect dead letters and replay them once their cause is fixed");
    dl->require_subcommand(1);
    dl->footer(
        "Examples:\n"
        "  chargeguard dead-letters list --reason stripe\n"
        "  chargeguard dead-letters show 17\n"
        "  chargeguard dead-letters replay 17 --nsqd-tcp-address nsqd:4150\n");

    auto lf = std::make_shared<letters_list_flags>();
    auto* list = dl->add_subcommand("list", "list dead letters not replayed yet (oldest first)");
    add_pg_flags(*list, lf->pg, false);
    list->footer(
        "Examples:\n"
        "  chargeguard dead-letters list\n"
        "  chargeguard dead-letters list --reason stripe --all --json\n");
    list->add_option("--reason", lf->reason, "only letters whose reason starts with this");
    list->add_flag("--all", lf->all, "include letters already replayed");
    list->add_option("--limit", lf->limit, "at most this many")
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    list->add_flag("--json", lf->json, "one JSON object per line");
    list->callback([&selected, lf] { select_one_shot(selected, lf, run_list); });

    auto sf = std::make_shared<letters_show_flags>();
    auto* show = dl->add_subcommand("show", "print one dead letter with its body");
    add_pg_flags(*show, sf->pg, false);
    show->footer(
        "Examples:\n"
        "  chargeguard dead-letters show 17\n"
        "  chargeguard dead-letters show 17 --json\n");
    show->add_option("ID", sf->id, "dead letter id")->required();
    show->add_flag("--json", sf->json, "as one JSON object");
    show->callback([&selected, sf] { select_one_shot(selected, sf, run_show); });

    auto rf = std::make_shared<letters_replay_flags>();
    auto* replay =
        dl->add_subcommand("replay", "re-publish dead letters' raw bodies to their topic, once each");
    add_pg_flags(*replay, rf->pg, false);
    // What is replayed and where to: the command line only, whatever the environment says.
    env(replay->add_option("ID", rf->ids, "dead letter ids"), env_scope::never);
    env(replay->add_option("--reason", rf->reason,
                           "every letter not replayed yet whose reason starts with this"),
        env_scope::never);
    env(replay->add_option("--nsqd-tcp-address", rf->nsqd_tcp_address, "nsqd TCP address host:port")
            ->required()
            ->group(group_nsq),
        env_scope::connection);
    env(replay->add_option("--topic", rf->topic, "publish here instead of each letter's own topic"),
        env_scope::never);
    env(replay->add_option("--by", rf->by, "who replays (recorded with the letter; default user@host)"),
        env_scope::never);
    env(replay->add_flag("--force", rf->force, "publish letters already replayed again"), env_scope::never);
    env(replay->add_flag("--no-validate", rf->no_validate,
                         "publish bodies that are not valid billing events"),
        env_scope::never);
    replay->footer(
        "Examples:\n"
        "  chargeguard dead-letters replay 17 18 --nsqd-tcp-address nsqd:4150\n"
        "  chargeguard dead-letters replay --reason stripe_declined --nsqd-tcp-address nsqd:4150\n"
        "Ids, --reason and --topic come from the command line only, never from CHARGEGUARD_* variables.\n");
    replay->callback([&selected, rf] {
        if (rf->ids.empty() && rf->reason.empty()) throw usage_error("replay: give letter IDs or --reason R");
        if (auto hp = net::parse_host_port(rf->nsqd_tcp_address); !hp)
            bad_value("--nsqd-tcp-address", rf->nsqd_tcp_address, hp.err().code.message());
        if (!rf->topic.empty() && !nsq::proto::valid_topic_name(rf->topic))
            bad_value("--topic", rf->topic, "not a valid topic name");
        if (rf->by.empty()) rf->by = default_operator();
        selected = [rf](const global_flags& g) {
            return run_one_shot(
                rf->pg, g,
                [rf](std::shared_ptr<pg::pool> p, nsq::producer* prod) {
                    return run_replay(*rf, std::move(p), prod);
                },
                rf->nsqd_tcp_address);
        };
    });
}

}  // namespace cg::app
