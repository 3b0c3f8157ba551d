// `chargeguard reconcile --expected FILE --period P`: compares a billing run with the ledger and with Stripe.
//
//  1. reads the expected events (JSONL or CSV) of period P;
//  2. reads the ledger rows and the open dead letters of P;
//  3. lists the charges created since the period's first ledger row (less a day), page by page, in the
//     platform and in every connected account the expected run or the ledger names (with its Stripe-Account),
//     keeping those whose metadata carries billing_period P; each entry is a (customer, period, account), so
//     a charge made in another account than the run's is reported under that account, and the run's entry
//     as missing;
//  4. resolves every `pending` row with the pipeline's own recovery search (billing/flow/recovery.hpp: the
//     customer's charges, then for a PaymentIntent event its intents, matched on metadata[billing_key]): a
//     payment found settled or declined settles the row (charged / declined); one still moving, or none,
//     leaves it to the pipeline;
//  5. checks each charged row's charge id against Stripe (a retrieve when the scan did not see it);
//  6. classifies every (customer, period, account) (billing/report/reconcile.hpp) and, with --publish,
//  re-publishes
//     the events whose message was lost (missing, or pending with no charge and an expired lease): the
//     content key makes that safe even if the original was only delayed.
// Every Stripe request waits for the pacer (--stripe-rate), so a reconcile never starves `consume` of the
// account's rate limit. With --customer C only C's items are classified and reported (the rest of the
// account is not flagged). Exit status (cli.hpp): 0 when nothing is unexplained, 2 when something is — or
// when the expected set is empty or holds no event of the period (nothing was checked) — 1 on failure.
#include <simdjson.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/pg_flags.hpp"
#include "app/reconcile_steps.hpp"
#include "app/stripe_flags.hpp"
#include "billing/machine/key.hpp"
#include "billing/report/reconcile.hpp"
#include "billing/store/ledger.hpp"
#include "http/proto/message.hpp"
#include "net/address.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"
#include "pg/rows.hpp"
#include "stripe/client.hpp"
#include "stripe/json.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
namespace {

using namespace std::chrono;

using namespace reconcile_detail;

result<std::vector<billing::expected_event>> read_expected(const std::string& path) {
    std::ifstream in(path);
    if (!in) return error(core_errc::io_error, "cannot read --expected '" + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    auto r = billing::parse_expected(ss.str());
    if (!r) return error(r.err().code, path + ": " + r.err().message);
    return r;
}

std::string json_item(const item& it) {
    std::string o = "{\"customer_id\":";
    append_json_string(o, it.who.customer);
    o += ",\"billing_period\":";
    append_json_string(o, it.who.period);
    o += ",\"stripe_account\":";
    if (it.who.account.empty())
        o += "null";
    else
        append_json_string(o, it.who.account);
    o += ",\"key\":";
    append_json_string(o, it.facts.key);
    o += ",\"class\":";
    append_json_string(o, billing::to_string(it.verdict.cls));
    o += ",\"explained\":";
    o += billing::is_explained(it.verdict.cls) ? "true" : "false";
    o += ",\"detail\":";
    append_json_string(o, it.verdict.detail);
    o += ",\"status\":";
    if (it.facts.record)
        append_json_string(o, billing::to_string(it.facts.record->status));
    else
        o += "null";
    o += ",\"charge_id\":";
    if (it.facts.record && it.facts.record->charge_id)
        append_json_string(o, *it.facts.record->charge_id);
    else
        o += "null";
    o += ",\"action\":";
    append_json_string(o, it.action);
    return o + "}";
}

void print_report(const reconcile_run& run, std::size_t expected, std::size_t republished) {
    std::array<std::size_t, billing::recon_class_count> counts{};
    std::size_t unexplained = 0;
    for (const auto& [who, it] : run.items) {
        ++counts[static_cast<std::size_t>(it.verdict.cls)];
        unexplained += !billing::is_explained(it.verdict.cls);
    }
    if (run.f.json) {
        std::string o = "{\"period\":";
        append_json_string(o, run.f.period);
        o += ",\"expected\":" + std::to_string(expected) + ",\"unexplained\":" + std::to_string(unexplained) +
             ",\"republished\":" + std::to_string(republished) +
             ",\"stripe_requests\":" + std::to_string(run.stripe_requests) + ",\"classes\":{";
        for (std::size_t i = 0; i < counts.size(); ++i) {
            if (i) o += ",";
            append_json_string(o, billing::to_string(static_cast<billing::recon_class>(i)));
            o += ":" + std::to_string(counts[i]);
        }
        o += "},\"items\":[";
        bool first = true;
        for (const auto& [who, it] : run.items) {
            if (it.verdict.cls == billing::recon_class::ok && !run.f.show_ok) continue;
            o += (first ? "" : ",") + json_item(it);
            first = false;
        }
        std::printf("%s]}\n", o.c_str());
        return;
    }
    std::printf("reconcile period %s: %zu expected, %lld Stripe request(s)\n\n%-26s %8s\n",
                run.f.period.c_str(), expected, static_cast<long long>(run.stripe_requests), "CLASS",
                "COUNT");
    for (std::size_t i = 0; i < counts.size(); ++i) {
        auto c = static_cast<billing::recon_class>(i);
        std::printf("%-26s %8zu%s\n", std::string(billing::to_string(c)).c_str(), counts[i],
                    billing::is_explained(c) || counts[i] == 0 ? "" : "  (unexplained)");
    }
    std::printf("\n%-24s %-12s %-22s %-26s %-40s %s\n", "CUSTOMER", "PERIOD", "ACCOUNT", "CLASS", "DETAIL",
                "ACTION");
    for (const auto& [who, it] : run.items) {
        if (it.verdict.cls == billing::recon_class::ok && !run.f.show_ok) continue;
        std::printf("%-24s %-12s %-22s %-26s %-40s %s\n", who.customer.c_str(), who.period.c_str(),
                    who.account.empty() ? "-" : who.account.c_str(),
                    std::string(billing::to_string(it.verdict.cls)).c_str(), it.verdict.detail.c_str(),
                    it.action.c_str());
    }
    std::printf("\n%zu unexplained, %zu re-published\n", unexplained, republished);
}

net::awaitable<std::size_t> republish(reconcile_run& run, nsq::producer& prod, std::vector<item*> lost) {
    if (lost.empty()) co_return 0;
    std::size_t done = 0;
    for (std::size_t i = 0; i < lost.size(); i += 200) {
        std::vector<std::string> bodies;
        for (std::size_t j = i; j < std::min(lost.size(), i + 200); ++j)
            bodies.push_back(lost[j]->facts.expected->body);
        auto n = bodies.size();
        auto r = co_await prod.multi_publish(run.f.topic, std::move(bodies));
        if (!r) {
            run.failure = "publishing to " + run.f.topic + ": " + r.err().describe();
            break;
        }
        for (std::size_t j = i; j < i + n; ++j) lost[j]->action = "re-published to " + run.f.topic;
        done += n;
    }
    co_return done;
}

net::awaitable<int> run_reconcile(const reconcile_flags* fp, std::shared_ptr<pg::pool> pool,
                                  stripe::client* stripe, nsq::producer* producer,
                                  std::vector<billing::expected_event> expected, logger log) {
    const auto& f = *fp;
    reconcile_run run{f, *pool, *stripe, log, billing::request_pacer(f.stripe_rate, 5), {}, {}, {}, 0, {}};
    for (auto& e : expected) {
        ident who{e.event.customer_id, e.event.billing_period, e.event.stripe_account};
        auto key = billing::base_key(f.key_namespace, who.customer, who.period, who.account);
        if (!who.account.empty()) run.accounts.insert(who.account);
        run.at(who, key).facts.expected = std::move(e);
    }
    std::int64_t earliest = -1;
    if (!co_await load_ledger(run, earliest)) {
        std::fprintf(stderr, "chargeguard reconcile: %s\n", run.failure.c_str());
        co_return exit_failure;
    }
    std::int64_t since =
        f.created_since >= 0 ? f.created_since
        : earliest >= 0
            ? earliest - 24 * 3600
            : duration_cast<seconds>(system_clock::now().time_since_epoch()).count() - 45 * 24 * 3600;
    if (!co_await scan_stripe(run, since)) {
        std::fprintf(stderr, "chargeguard reconcile: %s\n", run.failure.c_str());
        co_return exit_failure;
    }
    // --customer: the rest of the account is neither resolved nor reported.
    if (!f.customer.empty())
        std::erase_if(run.items, [&](const auto& kv) { return kv.first.customer != f.customer; });
    billing::ledger ledger(pool);
    for (auto& [who, it] : run.items) {
        if (!it.facts.record) continue;
        if (it.facts.record->status == billing::record_status::pending)
            co_await resolve_pending(run, ledger, it);
        if (it.facts.record->status == billing::record_status::charged && it.facts.record->charge_id)
            co_await check_recorded(run, it);
    }
    std::vector<item*> lost;
    for (auto& [who, it] : run.items) {
        it.verdict = billing::classify(it.facts);
        bool stranded = it.verdict.cls == billing::recon_class::pending && it.lease_expired &&
                        it.action == "no charge carries the key";
        if (it.facts.expected && (it.verdict.cls == billing::recon_class::missing || stranded))
            lost.push_back(&it);
    }
    std::size_t republished = 0;
    if (producer) {
        republished = co_await republish(run, *producer, lost);
        co_await producer->close();
    }
    print_report(run, expected.size(), republished);
    if (!run.failure.empty()) {
        std::fprintf(stderr, "chargeguard reconcile: %s\n", run.failure.c_str());
        co_return exit_failure;
    }
    for (const auto& [who, it] : run.items)
        if (!billing::is_explained(it.verdict.cls)) co_return exit_problem;
    co_return exit_ok;
}

// The events' own rule for billing_period (billing/machine/event.cpp): 1..64 of [A-Za-z0-9_.-].
bool period_chars_ok(const std::string& p) {
    if (p.empty() || p.size() > 64) return false;
    for (char c : p)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') return false;
    return true;
}

// "2026-11" → "9999-99": the shape of a period, to tell "--period November" from the events' "2026-11".
std::string period_shape(const std::string& p) {
    std::string out;
    for (char c : p)
        out += std::isdigit(static_cast<unsigned char>(c))   ? '9'
               : std::isalpha(static_cast<unsigned char>(c)) ? 'a'
                                                             : c;
    return out;
}

// The expected events of --period (and --customer); refuses, with exit_problem, a set that checks nothing.
std::optional<std::vector<billing::expected_event>> select_expected(
    const reconcile_flags& f, std::vector<billing::expected_event> all) {
    if (all.empty()) {
        std::fprintf(stderr,
                     "chargeguard reconcile: --expected %s holds no events: nothing to reconcile (an empty "
                     "billing run is not an all-clear)\n",
                     f.expected_file.c_str());
        return std::nullopt;
    }
    std::map<std::string, std::size_t> periods;
    for (const auto& e : all) ++periods[e.event.billing_period];
    std::string seen;
    bool shape_known = false;
    for (const auto& [p, n] : periods) {
        if (seen.size() < 200) seen += (seen.empty() ? "" : ", ") + p;
        shape_known = shape_known || period_shape(p) == period_shape(f.period);
    }
    if (!shape_known) {
        std::fprintf(
            stderr, "chargeguard reconcile: --period %s does not have the form of the events' periods (%s)\n",
            f.period.c_str(), seen.c_str());
        return std::nullopt;
    }
    std::vector<billing::expected_event> mine;
    for (auto& e : all)
        if (e.event.billing_period == f.period && (f.customer.empty() || e.event.customer_id == f.customer))
            mine.push_back(std::move(e));
    if (mine.empty()) {
        if (f.customer.empty())
            std::fprintf(stderr,
                         "chargeguard reconcile: --expected %s has no event of period %s (its periods: %s)\n",
                         f.expected_file.c_str(), f.period.c_str(), seen.c_str());
        else
            std::fprintf(stderr,
                         "chargeguard reconcile: --expected %s has no event of customer %s in period %s\n",
                         f.expected_file.c_str(), f.customer.c_str(), f.period.c_str());
        return std::nullopt;
    }
    return mine;
}

int reconcile_main(const reconcile_flags& f, const global_flags& g) {
    if (!billing::valid_key_namespace(f.key_namespace))
        bad_value("--key-namespace", f.key_namespace, "not 1-64 characters of [A-Za-z0-9_.-]");
    if (!period_chars_ok(f.period)) bad_value("--period", f.period, "not 1-64 characters of [A-Za-z0-9_.-]");
    if (f.publish) {
        if (!net::parse_host_port(f.nsqd_tcp_address))
            throw usage_error("--publish needs --nsqd-tcp-address host:port");
        if (!nsq::proto::valid_topic_name(f.topic))
            throw usage_error("--publish needs --topic, a valid topic name");
    }
    auto scfg = to_stripe_config(f.stripe);
    auto opts = to_pool_options(f.pg);
    opts.size = 1;
    auto expected = read_expected(f.expected_file);
    if (!expected) {
        std::fprintf(stderr, "chargeguard reconcile: %s\n", expected.err().message.c_str());
        return exit_failure;
    }
    std::size_t total = expected->size();
    auto selected_events = select_expected(f, std::move(*expected));
    if (!selected_events) return exit_problem;
    auto mine = std::move(*selected_events);
    std::size_t other = total - mine.size();
    auto log = make_stderr_logger(g.level());
    if (other)
        log.warn("expected events of other periods or customers ignored",
                 {{"count", other}, {"period", f.period}, {"customer", f.customer}});

    asio::io_context io{1};
    net::offload_pool off{2};
    auto stripe = stripe::client::create(off.get_executor(), std::move(scfg), log);
    if (!stripe) {
        std::fprintf(stderr, "chargeguard reconcile: %s\n", stripe.err().describe().c_str());
        return exit_failure;
    }
    auto pool = pg::pool::create(io.get_executor(), off.get_executor(), std::move(opts), log);
    std::unique_ptr<nsq::producer> producer;
    if (f.publish)
        producer = std::make_unique<nsq::producer>(io.get_executor(), f.nsqd_tcp_address,
                                                   nsq::producer_config{}, log);
    int rc = run_then_close_pool(
        io, pool, run_reconcile(&f, pool, stripe->get(), producer.get(), std::move(mine), log), "reconcile");
    stripe->reset();
    off.drain();
    return rc;
}

}  // namespace

void register_reconcile(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("reconcile",
                                   "compare a billing run with the ledger and Stripe; resolve pending rows; "
                                   "re-publish lost events");
    auto f = std::make_shared<reconcile_flags>();
    cmd->add_option("--expected", f->expected_file, "the billing run: JSONL events, or CSV with a header")
        ->required();
    cmd->footer(
        std::string(
            "Examples:\n"
            "  chargeguard reconcile --expected run-2026-11.jsonl --period 2026-11\n"
            "  chargeguard reconcile --expected run-2026-11.jsonl --period 2026-11 --customer acme-42\n"
            "  chargeguard reconcile --expected run.jsonl --period 2026-11 --publish "
            "--nsqd-tcp-address nsqd:4150 --topic billing\n") +
        exit_code_table);
    cmd->add_option("--period", f->period,
                    "billing period to reconcile, in the events' own form (e.g. 2026-11)")
        ->required();
    cmd->add_option("--customer", f->customer,
                    "check this one customer only (the account's other charges are not flagged)");
    env(cmd->add_option("--key-namespace", f->key_namespace, "the key namespace consume uses")
            ->capture_default_str()
            ->group(group_pipeline),
        env_scope::connection);
    add_pg_flags(*cmd, f->pg, false);
    add_stripe_flags(*cmd, f->stripe);
    cmd->add_option("--stripe-rate", f->stripe_rate, "Stripe requests per second at most (bursts of 5)")
        ->check(CLI::Range(0.1, 1000.0))
        ->capture_default_str();
    cmd->add_option(
        "--stripe-created-since", f->created_since,
        "unix seconds: scan charges created since (default: a day before the period's first ledger row)");
    cmd->add_flag("--json", f->json, "one JSON object instead of the table");
    cmd->add_flag("--show-ok", f->show_ok, "list the reconciled items too");
    // What is re-published and where to: the command line only.
    env(cmd->add_flag("--publish", f->publish,
                      "re-publish the events whose message was lost (needs --nsqd-tcp-address, --topic)"),
        env_scope::never);
    env(cmd->add_option("--nsqd-tcp-address", f->nsqd_tcp_address, "nsqd TCP address host:port for --publish")
            ->group(group_nsq),
        env_scope::connection);
    env(cmd->add_option("--topic", f->topic, "NSQ topic for --publish")->group(group_nsq), env_scope::never);
    cmd->callback(
        [&selected, f] { selected = [f](const global_flags& g) { return reconcile_main(*f, g); }; });
}

}  // namespace cg::app
