#include "app/heal.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include "app/nsq_flags.hpp"
#include "billing/heal/backfill.hpp"
#include "billing/heal/sweeper.hpp"
#include "billing/machine/event.hpp"
#include "metrics/registry.hpp"
#include "net/stoppable_task.hpp"
#include "pg/replication.hpp"

namespace cg::app {

using std::chrono::milliseconds;

void add_heal_flags(CLI::App& cmd, heal_flags& f) {
    cmd.add_option("--sweep", f.sweep,
                   "resolve pending ledger rows nobody works on any more (their message lost, e.g. with a "
                   "PostgreSQL failover) through the same recovery a redelivery runs")
        ->capture_default_str();
    cmd.add_option(
           "--sweep-after", f.sweep_after,
           "how long a pending row must show no activity (and no live lease) before the sweeper takes "
           "it up; auto: 2 x --msg-timeout + the longest requeue delay + the lease-held jitter")
        ->capture_default_str();
    cmd.add_option("--sweep-interval", f.sweep_interval,
                   "time between sweeps; auto: a quarter of --sweep-after within 1s..60s")
        ->capture_default_str();
    cmd.add_option("--backfill-window", f.backfill_window,
                   "rebuild ledger rows lost entirely (a failover lost their insert) from the Stripe charges "
                   "created this long ago or later that carry this sidecar's keys; 0 = off")
        ->capture_default_str();
    cmd.add_option("--backfill-interval", f.backfill_interval,
                   "time between backfill runs (the first soon after start)")
        ->capture_default_str();
    cmd.add_option("--connect-accounts", f.connect_accounts,
                   "Stripe Connect accounts (acct_…, comma-separated) the backfill always searches, besides "
                   "those the ledger has rows for: an account whose every row a failover lost is found only "
                   "so");
    cmd.add_option("--connect-accounts-file", f.connect_accounts_file,
                   "a file of such accounts, one or more a line ('#' starts a comment); adds to "
                   "--connect-accounts");
}

std::vector<std::string> connect_accounts_of(const heal_flags& f) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    auto add_all = [&](const char* flag, const std::string& text) {
        std::string word;
        bool comment = false;
        auto flush = [&] {
            if (word.empty()) return;
            if (!billing::valid_stripe_account(word))
                throw CLI::ValidationError(flag, "'" + word + "' is not a Stripe account id (acct_…)");
            if (seen.insert(word).second) out.push_back(word);
            word.clear();
        };
        for (char c : text) {
            if (c == '\n') comment = false;
            if (comment) continue;
            if (c == '#') {
                flush();
                comment = true;
            } else if (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n') {
                flush();
            } else {
                word += c;
            }
        }
        flush();
    };
    add_all("--connect-accounts", f.connect_accounts);
    if (!f.connect_accounts_file.empty()) {
        std::ifstream in(f.connect_accounts_file);
        if (!in)
            throw CLI::ValidationError("--connect-accounts-file", "cannot read " + f.connect_accounts_file);
        std::stringstream ss;
        ss << in.rdbuf();
        add_all("--connect-accounts-file", ss.str());
    }
    return out;
}

namespace {

milliseconds auto_or_duration(const char* flag, const std::string& v) {
    if (v == "auto") return milliseconds(0);
    auto d = duration_flag(flag, v);
    if (d <= milliseconds(0)) throw CLI::ValidationError(flag, v + " must be positive (or auto)");
    return d;
}

// Until PostgreSQL answers (startup waits for it too), then once: the settings decide the warning and gauge.
struct replication_check {
    runtime* rt;
    std::shared_ptr<pg::pool> pool;
    metrics::Gauge* gauge;
    net::stoppable_task task;

    // One try: false (done) once the settings were read.
    net::awaitable<bool> pass() {
        auto s = co_await pg::read_replication_settings(pool);
        if (!s) {
            rt->log().debug("replication settings not read yet", {{"error", s.err().describe()}});
            co_return true;
        }
        auto a = pg::assess_replication(*s);
        gauge->Set(a.async_with_standbys ? 1 : 0);
        if (a.async_with_standbys)
            rt->log().warn(
                "PostgreSQL commits asynchronously with standbys attached: a failover can lose the last "
                "commits (a settled charge goes back to pending, or its row is lost). The sweeper resolves "
                "pending rows; set synchronous_standby_names and synchronous_commit=on or remote_apply to "
                "avoid the loss (docs/operating/ha-postgres.md)",
                {{"alert", true}, {"settings", a.why}});
        else
            rt->log().info("PostgreSQL replication settings", {{"settings", a.why}});
        co_return false;
    }
};

void start_replication_check(runtime& rt, std::shared_ptr<pg::pool> pool, metrics::Gauge* gauge) {
    auto c = std::make_shared<replication_check>();
    c->rt = &rt;
    c->pool = std::move(pool);
    c->gauge = gauge;
    net::job_spec job;
    job.name = "replication check";
    job.interval = std::chrono::seconds(5);
    job.first_after = milliseconds(0);
    c->task.start_job(
        rt.io().get_executor(), c, std::move(job), [raw = c.get()] { return raw->pass(); }, rt.log());
    rt.on_shutdown([c]() { return c->task.stop(); });
}

}  // namespace

void start_ledger_healing(runtime& rt, billing::charge_flow& p, std::shared_ptr<pg::pool> pool,
                          stripe::client& stripe, const heal_flags& f, const nsq::consumer_config& ncfg,
                          billing::pending_age_monitor* age) {
    auto window = duration_flag("--backfill-window", f.backfill_window);
    auto backfill_every = duration_flag("--backfill-interval", f.backfill_interval);
    if (window.count() < 0 || window > std::chrono::hours(24 * 30))
        throw CLI::ValidationError("--backfill-window", f.backfill_window + " is out of range: 0 .. 720h");
    if (window.count() > 0 && backfill_every < std::chrono::seconds(1))
        throw CLI::ValidationError("--backfill-interval", f.backfill_interval + " must be at least 1s");
    auto connect_accounts = connect_accounts_of(f);
    billing::sweeper_config sc;
    sc.topic = ncfg.topic;
    sc.channel = ncfg.channel;
    sc.after = auto_or_duration("--sweep-after", f.sweep_after);
    sc.interval = auto_or_duration("--sweep-interval", f.sweep_interval);
    auto* gauge =
        &rt.metrics()
             .gauge("chargeguard_pg_async_replication",
                    "1 when PostgreSQL commits asynchronously while standbys are attached (a failover "
                    "can lose the last commits), else 0; read at startup")
             .Add({});
    start_replication_check(rt, pool, gauge);
    if (window.count() > 0) {
        billing::backfill_config bc;
        bc.key_namespace = p.config().key_namespace;
        bc.window = std::chrono::duration_cast<std::chrono::seconds>(window);
        bc.interval = backfill_every;
        bc.topic = ncfg.topic;
        bc.channel = ncfg.channel;
        bc.connect_accounts = std::move(connect_accounts);
        auto b = std::make_shared<billing::backfill>(bc, pool, stripe, rt.log(), &rt.metrics());
        b->start(rt.io().get_executor());
        rt.on_shutdown([b]() { return b->stop(); });
    }
    if (!f.sweep) {
        rt.log().warn("--sweep=false: abandoned pending ledger rows are not resolved by this sidecar");
        return;
    }
    // --msg-timeout is always explicit (app/nsq_flags.cpp): the timeout nsqd applies.
    auto s = billing::start_sweeper(rt.io().get_executor(), p, std::move(pool), std::move(sc),
                                    ncfg.msg_timeout, rt.metrics(), rt.log(), age);
    rt.on_shutdown([s]() { return s->stop(); });
}

}  // namespace cg::app
