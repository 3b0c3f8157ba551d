// `chargeguard dead-letters list|show ID|replay ID…|replay --reason R|dismiss ID…`: inspect the messages the
// pipeline could not process, re-drive them once their cause is fixed (the customer's card, the ledger row
// in conflict, the producer's data), or close them with a reason. A letter is open until it is replayed or
// dismissed.
//
// A replay first checks the ledger row the event would meet (by customer, period and account, as the
// pipeline's pre-flight does). A row holding another payload would dead-letter the event again as a
// conflict; a charged, processing or declined row would finish it as a duplicate: such a replay is refused
// and publishes nothing, so it creates no new letter and says why (a corrected event, `dismiss`, or
// `retry-declined` is the way on). A row that is `failed` (Stripe refused the request as sent),
// `cap_blocked` (the vault refused it) or `failed_after_processing` (the bank debit failed days later; the
// row goes straight to a new key generation, since Stripe said how the old payment ended) is reopened: back
// to pending, to be searched for (or, after a late failure, charged under the new key) by the redelivery. It
// then publishes the stored raw body — or the operator's corrected event (`--event FILE`, validated, kept
// beside the original) — to the letter's topic with the ordinary NSQ producer, and marks the letter replayed
// (who, when). Publish first, mark second: a crash in between leaves the letter unmarked and a second replay
// publishes it again, which the content-keyed charge makes harmless; the other order could lose the event.
// A letter already closed is skipped unless --force (idempotent by default).
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/dead_letter_replay.hpp"
#include "app/pg_flags.hpp"
#include "billing/machine/event.hpp"
#include "billing/machine/machine.hpp"
#include "billing/store/dead_letter_store.hpp"
#include "billing/store/ledger.hpp"
#include "billing/store/retry_store.hpp"
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

struct letters_dismiss_flags {
    pg_flags pg;
    std::vector<std::int64_t> ids;
    std::string reason;
    std::string by;
};

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
    std::printf("%-8s %-29s %-12s %-8s %-39s %-40s %s\n", "ID", "RECEIVED", "TOPIC", "ATTEMPTS", "CLOSED",
                "REASON", "BODY");
    for (const auto& l : *r) {
        std::string closed = l.dismissed_at  ? "dismissed " + timestamp_or_dash(l.dismissed_at)
                             : l.replayed_at ? "replayed " + timestamp_or_dash(l.replayed_at)
                                             : "-";
        std::printf("%-8lld %-29s %-12s %-8d %-39s %-40s %s\n", static_cast<long long>(l.id),
                    pg::format_timestamptz(l.received_at).c_str(), l.topic.c_str(), l.attempts,
                    closed.c_str(), preview(l.reason, 40).c_str(), preview(l.raw_body).c_str());
    }
    std::printf("%zu letter(s)%s\n", r->size(),
                f.all ? "" : " open: neither replayed nor dismissed (--all for every letter)");
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
        "replayed_at:    %s\nreplayed_by:    %s\nreplay_count:   %d\ndismissed_at:   %s\ndismissed_by:   %s\n"
        "dismiss_reason: %s\nbody (%zu bytes):\n%s\n",
        static_cast<long long>(l.id), pg::format_timestamptz(l.received_at).c_str(), l.topic.c_str(),
        l.channel.c_str(), l.nsq_message_id.c_str(), l.attempts, l.reason.c_str(),
        l.billing_key.value_or("-").c_str(), timestamp_or_dash(l.replayed_at).c_str(),
        l.replayed_by.value_or("-").c_str(), l.replay_count, timestamp_or_dash(l.dismissed_at).c_str(),
        l.dismissed_by.value_or("-").c_str(), l.dismiss_reason.value_or("-").c_str(), l.raw_body.size(),
        l.raw_body.c_str());
    if (l.corrected_body)
        std::printf("corrected event published by the replay (%zu bytes):\n%s\n", l.corrected_body->size(),
                    l.corrected_body->c_str());
    co_return 0;
}

net::awaitable<int> run_dismiss(letters_dismiss_flags f, std::shared_ptr<pg::pool> pool) {
    billing::dead_letter_store store(pool);
    int dismissed = 0, skipped = 0, failed = 0;
    for (auto id : f.ids) {
        auto ll = static_cast<long long>(id);
        auto r = co_await store.dismiss(id, f.by, f.reason);
        if (!r) {
            std::fprintf(stderr, "letter %lld: %s\n", ll, r.err().describe().c_str());
            ++failed;
            break;
        }
        if (*r) {
            std::printf("letter %lld: dismissed by %s: %s\n", ll, f.by.c_str(), f.reason.c_str());
            ++dismissed;
            continue;
        }
        auto l = co_await store.find(id);
        if (!l) {
            std::fprintf(stderr, "letter %lld: %s\n", ll, l.err().describe().c_str());
            ++failed;
            break;
        }
        if (!*l) {
            std::fprintf(stderr, "letter %lld: no such dead letter\n", ll);
            ++failed;
        } else {
            std::printf("letter %lld: not open (%s): left as it is\n", ll,
                        (*l)->dismissed_at ? ("dismissed by " + (*l)->dismissed_by.value_or("?")).c_str()
                                           : ("replayed by " + (*l)->replayed_by.value_or("?")).c_str());
            ++skipped;
        }
    }
    std::printf("%d dismissed, %d not open, %d failed\n", dismissed, skipped, failed);
    co_return failed > 0 ? exit_failure : 0;
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
    auto* dl = app.add_subcommand(
        "dead-letters", "inspect dead letters; replay them once their cause is fixed, or dismiss them");
    dl->require_subcommand(1);
    dl->footer(
        "Examples:\n"
        "  chargeguard dead-letters list --reason stripe\n"
        "  chargeguard dead-letters show 17\n"
        "  chargeguard dead-letters replay 17 --nsqd-tcp-address nsqd:4150\n"
        "  chargeguard dead-letters dismiss 17 --reason 'duplicate of an event already charged'\n");

    auto lf = std::make_shared<letters_list_flags>();
    auto* list =
        dl->add_subcommand("list", "list open dead letters: neither replayed nor dismissed (oldest first)");
    add_pg_flags(*list, lf->pg, false);
    list->footer(
        "Examples:\n"
        "  chargeguard dead-letters list\n"
        "  chargeguard dead-letters list --reason stripe --all --json\n");
    list->add_option("--reason", lf->reason, "only letters whose reason starts with this");
    list->add_flag("--all", lf->all, "include letters already replayed or dismissed");
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
    env(replay->add_option("--event", rf->event_file,
                           "a file holding the corrected billing event to publish instead of the stored body "
                           "(one letter; validated; kept with the letter)"),
        env_scope::never);
    replay->footer(
        "Examples:\n"
        "  chargeguard dead-letters replay 17 18 --nsqd-tcp-address nsqd:4150\n"
        "  chargeguard dead-letters replay --reason stripe_declined --nsqd-tcp-address nsqd:4150\n"
        "  chargeguard dead-letters replay 17 --event fixed.json --nsqd-tcp-address nsqd:4150\n"
        "Ids, --reason, --event and --topic come from the command line only, never from CHARGEGUARD_* "
        "variables.\n");
    replay->callback([&selected, rf] {
        if (rf->ids.empty() && rf->reason.empty()) throw usage_error("replay: give letter IDs or --reason R");
        if (!rf->event_file.empty()) {
            if (rf->ids.size() != 1 || !rf->reason.empty())
                throw usage_error("replay --event: give exactly one letter ID (and no --reason)");
            std::ifstream in(rf->event_file, std::ios::binary);
            if (!in) bad_value("--event", rf->event_file, "cannot be read");
            std::ostringstream text;
            text << in.rdbuf();
            rf->event = text.str();
            while (!rf->event.empty() && std::isspace(static_cast<unsigned char>(rf->event.back())))
                rf->event.pop_back();
            if (rf->event.empty()) bad_value("--event", rf->event_file, "is empty");
        }
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

    auto xf = std::make_shared<letters_dismiss_flags>();
    auto* dismiss =
        dl->add_subcommand("dismiss", "close open dead letters without a replay (who and why recorded)");
    add_pg_flags(*dismiss, xf->pg, false);
    env(dismiss->add_option("ID", xf->ids, "dead letter ids")->required(), env_scope::never);
    env(dismiss->add_option("--reason", xf->reason, "why the letter needs no replay (recorded)")->required(),
        env_scope::never);
    env(dismiss->add_option("--by", xf->by, "who dismisses (recorded; default user@host)"), env_scope::never);
    dismiss->footer(
        "Examples:\n"
        "  chargeguard dead-letters dismiss 17 --reason 'test event from staging'\n");
    dismiss->callback([&selected, xf] {
        if (xf->reason.empty()) throw usage_error("dismiss: --reason must not be empty");
        if (xf->by.empty()) xf->by = default_operator();
        select_one_shot(selected, xf, run_dismiss);
    });
}

}  // namespace cg::app
