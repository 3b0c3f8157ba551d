// `chargeguard consume`: the sidecar. NSQ consumer → billing pipeline (docs/design.md §4) → Stripe (directly
// or through the vault proxy), serving /healthz, /readyz (nsq + postgres) and /metrics.
//
// Executors (docs/design.md §2): the consumer, the PostgreSQL pool, the pipeline coroutines and the health
// server run on the runtime's main io_context; the Stripe client's HTTPS work runs on the offload pool and
// its results come back to the main loop. SIGTERM: the consumer drains first (RDY 0, in-flight pipelines
// finish, CLS), then the pool closes, then the process exits 0.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/consume_validate.hpp"
#include "app/heal.hpp"
#include "app/nsq_flags.hpp"
#include "app/pg_flags.hpp"
#include "app/pipeline_flags.hpp"
#include "app/runtime.hpp"
#include "app/schema_gate.hpp"
#include "app/stripe_flags.hpp"
#include "billing/flow/charge_flow.hpp"
#include "billing/flow/nsq_delivery.hpp"
#include "billing/flow/pace_peers.hpp"
#include "billing/heal/pending_age.hpp"
#include "billing/heal/settlement_poller.hpp"
#include "billing/machine/key.hpp"
#include "billing/store/ledger.hpp"
#include "net/address.hpp"
#include "nsq/channel_depth.hpp"
#include "nsq/consumer.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

namespace cg::app {
namespace {

using std::chrono::milliseconds;

struct consume_flags {
    nsq_consumer_flags nsq;
    pg_flags pg;
    stripe_flags stripe;
    pipeline_flags billing;
    heal_flags heal;
    runtime_flags rt;
    std::string stripe_io = "offload";
    bool pace_peers = false;  // opt-in: see docs/operating/configuration.md "Sidecars sharing a ledger"
    unsigned pace_peers_interval_ms = 100;
    std::string processing_poll_after = "1h";
    double processing_poll_rate = 5;
    bool validate = false;  // --validate: check the configuration and the dependencies once, then exit
    std::vector<std::string> nsqd_http_addresses;  // for chargeguard_nsq_channel_depth
    std::string channel_depth_interval = "30s";
};

// Rows left processing are retrieved from Stripe by id once they have waited --processing-poll-after, at
// most --processing-poll-rate per second (billing/heal/settlement_poller.hpp); a pass runs every quarter of
// the bound, at most every minute and at least every second.
billing::poller_config to_poller_config(const consume_flags& f) {
    billing::poller_config c;
    c.poll_after = duration_flag("--processing-poll-after", f.processing_poll_after);
    if (c.poll_after < std::chrono::seconds(1) || c.poll_after > std::chrono::hours(24 * 7))
        bad_value("--processing-poll-after", f.processing_poll_after, "must be between 1s and 168h");
    if (!(f.processing_poll_rate > 0 && f.processing_poll_rate <= 100))
        bad_value("--processing-poll-rate", std::to_string(f.processing_poll_rate), "must be in (0, 100]");
    c.rate_per_second = f.processing_poll_rate;
    c.interval = std::clamp<milliseconds>(c.poll_after / 4, std::chrono::seconds(1), std::chrono::minutes(1));
    c.deferred_after = std::min<milliseconds>(c.interval, std::chrono::minutes(1));
    return c;
}

net::awaitable<void> stop_channel_depth(std::shared_ptr<nsq::channel_depth_monitor> m) {
    m->stop();
    co_return;
}

// chargeguard_nsq_channel_depth (nsq/channel_depth.hpp): the nsqds nsqlookupd lists, and those given with
// --nsqd-tcp-address whose HTTP address --nsqd-http-address names. Stopped on shutdown.
void start_channel_depth(runtime& rt, const consume_flags& f, const nsq::consumer_config& ncfg) {
    nsq::channel_depth_config c;
    c.topic = ncfg.topic;
    c.channel = ncfg.channel;
    c.lookupd_http_addresses = ncfg.lookupd_http_addresses;
    c.nsqd_http_addresses = f.nsqd_http_addresses;
    c.interval = duration_flag("--channel-depth-interval", f.channel_depth_interval);
    if (!ncfg.nsqd_tcp_addresses.empty() && f.nsqd_http_addresses.empty())
        rt.log().info(
            "chargeguard_nsq_channel_depth is not read for the nsqds given with --nsqd-tcp-address: give "
            "their HTTP addresses with --nsqd-http-address",
            {{"nsqd_tcp_addresses", static_cast<std::int64_t>(ncfg.nsqd_tcp_addresses.size())}});
    if (c.lookupd_http_addresses.empty() && c.nsqd_http_addresses.empty()) return;
    rt.log().info("channel depth read from nsqd's /stats",
                  {{"interval_ms", static_cast<std::int64_t>(c.interval.count())},
                   {"nsqd_http_addresses", static_cast<std::int64_t>(c.nsqd_http_addresses.size())},
                   {"lookupd_http_addresses", static_cast<std::int64_t>(c.lookupd_http_addresses.size())}});
    auto m = std::make_shared<nsq::channel_depth_monitor>(rt.io().get_executor(), std::move(c), rt.metrics(),
                                                          rt.log());
    m->start();
    rt.on_shutdown([m]() { return stop_channel_depth(m); });
}

// The message handler and the give-up handler (attempts > --max-attempts), as billing/flow/nsq_delivery.hpp
// runs a delivery (its coroutine, not one of their own). The consumer keeps `m` and the pipeline alive until
// each completes.
net::awaitable<nsq::disposition> handle_message(billing::charge_flow* p, const nsq::consumer_config* cfg,
                                                nsq::message& m) {
    return billing::run_delivery_disposition(*p, m, cfg->topic, cfg->channel, false);
}

net::awaitable<nsq::disposition> give_up_message(billing::charge_flow* p, const nsq::consumer_config* cfg,
                                                 nsq::message& m) {
    return billing::run_delivery_disposition(*p, m, cfg->topic, cfg->channel, true);
}

// Once the database is ready (start_when_ready), the consumer starts; a consumer that cannot start stops the
// process with 1.
void start_consumer(runtime* rt, nsq::consumer* consumer) {
    if (auto r = consumer->start(); !r) {
        rt->log().error("cannot start the consumer", {{"error", r.err().describe()}});
        rt->request_stop("consumer failed to start", 1);
    }
}

// Consumer drain first (its in-flight pipelines still need PostgreSQL), then the pool.
net::awaitable<void> drain(nsq::consumer* consumer, std::shared_ptr<pg::pool> pool) {
    co_await consumer->stop();
    co_await pool->close();
}

// The effective configuration: the startup line, --validate's first line and GET /config.
effective_config consume_config(const consume_flags& f, const nsq::consumer_config& n, const pg::config& pgc,
                                const stripe::client_config& s, const billing::charge_flow_config& b,
                                const billing::poller_config& poll, const runtime_options& o) {
    effective_config c("consume");
    c.add("topic", n.topic)
        .add("channel", n.channel)
        .add_address("nsqd_tcp_addresses", n.nsqd_tcp_addresses)
        .add_address("lookupd_http_addresses", n.lookupd_http_addresses)
        .add("max_in_flight", n.max_in_flight)
        .add("msg_timeout_ms", static_cast<std::int64_t>(n.msg_timeout.count()))
        .add("heartbeat_interval_ms", static_cast<std::int64_t>(n.heartbeat_interval.count()))
        .add("max_attempts", n.max_attempts)
        .add("nsq_tls", n.security.tls)
        .add_address("pg", pgc.describe())
        .add("migrate", f.pg.migrate)
        .add("pg_pool_size", f.pg.pool_size)
        .add_address("stripe_api_base", s.api_base)
        .add("stripe_io", f.stripe_io)
        .add("stripe_max_connections", s.max_connections)
        .add("stripe_eager_connections", s.eager_connections)
        .add("stripe_ca_file", s.ca_file.empty() ? std::string("(system store)") : s.ca_file)
        .add("stripe_key_from", cg::app::stripe_key_source(f.stripe.key_file, std::getenv("STRIPE_API_KEY")))
        .add("stripe_pace_peers", f.pace_peers)
        .add("key_namespace", b.key_namespace)
        .add("lease_ms", static_cast<std::int64_t>(b.lease.count()))
        .add("lease_renew_interval_ms", static_cast<std::int64_t>(b.lease_renew_interval.count()))
        .add("lease_held_delay_ms", static_cast<std::int64_t>(b.lease_held_delay.count()))
        .add("retry_same_key_delay_ms", static_cast<std::int64_t>(b.retry_same_key_delay.count()))
        .add("indeterminate_delay_ms", static_cast<std::int64_t>(b.indeterminate_delay.count()))
        .add("correction_wait_delay_ms", static_cast<std::int64_t>(b.correction_wait_delay.count()))
        .add("search_failed_delay_ms", static_cast<std::int64_t>(b.stripe_unavailable_delay.count()))
        .add("new_key_quiet_ms", static_cast<std::int64_t>(b.new_key_quiet.count()))
        .add("group_commit_linger_max_us", static_cast<std::int64_t>(b.group_commit_linger_max.count()))
        .add("processing_poll_after_ms", static_cast<std::int64_t>(poll.poll_after.count()))
        .add("processing_poll_rate", poll.rate_per_second)
        .add("test_step_pause_ms", static_cast<std::int64_t>(b.test_step_pause.count()));
    add_runtime_settings(c, f.rt, o);
    return c;
}

int run_consume(const consume_flags& f, const global_flags& g) {
    // One malloc arena for every thread: the offload threads' own arenas each kept their freed TLS and HTTP
    // memory apart from the main heap's, adding to the peak with many deliveries in flight
    // (docs/benchmarks/footprint.md); small blocks still come from each thread's cache without a lock.
    mallopt(M_ARENA_MAX, 1);
    // Every validation (and reading the key) happens before anything connects.
    auto ncfg = to_consumer_config(f.nsq);
    auto pgc = to_pg_config(f.pg);
    auto scfg = to_stripe_config(f.stripe);
    // By default the pool follows --max-in-flight up to what Stripe's rate limit can use
    // (consume_stripe_connections, stripe_flags.hpp; past --stripe-eager-connections only while Stripe keeps
    // its pace); --stripe-connection-cap bounds it whatever is asked. Deliveries past the pool wait for
    // their call at the client's entry (max_calls), before their request and its coroutines exist. A call's
    // place (net::admission::ticket) may be dropped after the client is gone (a frame destroyed with the main
    // loop at exit): it shares the admission's state, so that is harmless.
    if (f.stripe.max_connections == 0)
        scfg.max_connections =
            std::min<std::size_t>({f.stripe.connection_cap, consume_stripe_connections,
                                   std::max<std::size_t>(16, static_cast<std::size_t>(ncfg.max_in_flight))});
    scfg.max_calls = scfg.max_connections;
    // Pipelines at once while deliveries wait for their turn at Stripe (or, as the last deliveries did,
    // will): one and a half times the Stripe calls, at least 128. A call takes hundreds of milliseconds and a
    // pre-flight or settle statement a few, so a pipeline waiting its turn for every other call keeps every
    // call busy: a call's answer is settled while the next delivery takes its place. The other deliveries in
    // flight wait in the consumer's queue with only their message (~4 KiB each with 4 KiB bodies, where a
    // pipeline's state and coroutine frames are ~12 KiB more), TOUCHed from receipt. When deliveries do not
    // call Stripe (a replay's duplicates) every delivery in flight runs, so they share group-commit
    // statements as large as the in-flight limit allows. held_up is set once the pipeline exists.
    ncfg.max_handlers = static_cast<unsigned>(std::min<std::size_t>(
        ncfg.max_in_flight, std::max<std::size_t>(128, scfg.max_calls + scfg.max_calls / 2)));
    auto bcfg = to_pipeline_config(f.billing);
    auto pollcfg = to_poller_config(f);
    auto opts = to_runtime_options(f.rt);
    // Leave a fifth of the shutdown budget for CLS, the last FINs and closing the pool.
    ncfg.drain_timeout = std::chrono::duration_cast<milliseconds>(opts.shutdown_timeout * 4 / 5);
    auto ms = load_migrations(f.pg);
    if (!ms)
        throw config_error(value_origin("--migrations-dir", f.pg.migrations_dir) + ": " + ms.err().message);
    auto log = make_stderr_logger(g.level());
    auto settings = consume_config(f, ncfg, pgc, scfg, bcfg, pollcfg, opts);
    settings.log(log, "consume starting");
    log.info("stripe I/O", {{"stripe_io", f.stripe_io}});
    // Everything above parsed every setting and read the key; the line above is the effective configuration.
    if (f.validate) {
        std::printf("config %s", settings.json().c_str());
        std::fflush(stdout);
        return validate_consume(f.pg, ncfg, std::move(scfg), log);
    }
    if (bcfg.test_step_pause.count() > 0)
        log.warn(
            "test failpoint active: pausing between billing steps (CHARGEGUARD_TEST_STEP_PAUSE_MS); "
            "never set this in production",
            {{"max_pause_ms", bcfg.test_step_pause.count()}});

    runtime rt(opts, log);
    rt.set_effective_config(settings);
    // --stripe-io loop: requests on kept-alive connections run on the event loop (async TLS I/O, no thread
    // hand-off per call) and only a new connection's connect + TLS handshake runs on the offload pool, so no
    // handshake ever computes on the loop. offload: all of it on the offload pool (two hand-offs per call).
    auto stripe = f.stripe_io == "loop" ? stripe::client::create(rt.io().get_executor(), std::move(scfg), log,
                                                                 &rt.metrics(), rt.offload().get_executor())
                                        : stripe::client::create(rt.offload().get_executor(), std::move(scfg),
                                                                 log, &rt.metrics());
    if (!stripe) {
        log.error("cannot create the Stripe client", {{"error", stripe.err().describe()}});
        return 1;
    }
    // Every in-flight delivery waits for at most one connection at a time (plus the pending-age probe): with
    // --max-in-flight above the pool's default waiter bound, a busy pool would otherwise fail deliveries
    // (requeued_postgres) instead of queueing them. Each new connection checks for a failover, which the
    // sweeper answers at once (billing/heal/sweeper.hpp); the server last seen is recorded under the key
    // namespace, so a sidecar started only after a failover sees it too.
    auto pool = start_pool(rt, f.pg, false, static_cast<std::size_t>(ncfg.max_in_flight) + 16, true,
                           bcfg.key_namespace);
    // Group-commit statements by size: how many deliveries shared each pre-flight insert and settle (1 when
    // the database keeps up; large when deliveries queue for a slot).
    auto& batch_rows = rt.metrics().histogram("chargeguard_ledger_batch_rows",
                                              "Rows per group-commit ledger statement, by statement");
    prometheus::Histogram::BucketBoundaries rows_buckets{1, 2, 4, 8, 16, 32, 64, 128, 256};
    auto& preflight_rows = batch_rows.Add({{"statement", "preflight"}}, rows_buckets);
    auto& settle_rows = batch_rows.Add({{"statement", "settle"}}, rows_buckets);
    billing::ledger_options lopts;
    lopts.on_batch = [&preflight_rows, &settle_rows](std::string_view statement, std::size_t rows) {
        (statement == "preflight" ? preflight_rows : settle_rows).Observe(static_cast<double>(rows));
    };
    billing::ledger ledger(pool, std::move(lopts));
    billing::charge_flow pipeline(std::move(bcfg), ledger, **stripe, log, &rt.metrics());
    // Held up while deliveries wait for their turn at Stripe, and while the last deliveries called Stripe:
    // a wave of deliveries arriving at once then starts only max_handlers pipelines, not one per delivery
    // until the first of them reach Stripe's turn (they all wait in their pre-flight statement first).
    ncfg.held_up = [s = stripe->get(), &pipeline] {
        return s->calls_waiting() > 0 || pipeline.deliveries_call_stripe();
    };
    nsq::consumer consumer(
        rt.io().get_executor(), ncfg,
        [&pipeline, &ncfg](nsq::message& m) { return handle_message(&pipeline, &ncfg, m); }, log,
        rt.metrics());
    consumer.set_give_up_handler(
        [&pipeline, &ncfg](nsq::message& m) { return give_up_message(&pipeline, &ncfg, m); });
    consumer.add_readiness(rt.health());
    // /startupz: PostgreSQL answered once, the schema gate passed, and NSQ was reached once: an nsqd
    // connection subscribed, or an nsqlookupd answered. With lookupd discovery a topic nobody has published
    // to yet has no nsqd to subscribe to; a native sidecar whose startup waited for one would keep the
    // billing app, which is what creates the topic, from ever starting.
    rt.startup().require("postgres", "PostgreSQL (first connection)");
    schema_gate gate(rt, pool, *ms);
    rt.startup().require("nsq", "NSQ (an nsqd subscription or an nsqlookupd answer)", [&consumer] {
        const auto& st = consumer.stats();
        return st.connects > 0 || st.lookups_answered > 0;
    });
    rt.on_shutdown([&consumer, pool]() { return drain(&consumer, pool); });
    // chargeguard_billing_oldest_pending_age_seconds: a cheap periodic query, stopped on shutdown.
    auto pending_age = billing::start_pending_age_monitor(rt.io().get_executor(), pool, rt.metrics(), log);
    rt.on_shutdown([pending_age]() { return pending_age->stop(); });
    start_ledger_healing(rt, pipeline, pool, **stripe, f.heal, ncfg, pending_age.get());
    // Shared pacing between the sidecars of this ledger (billing/flow/pace_peers.hpp); charging never waits
    // on it.
    const auto& rate = (*stripe)->config().rate;
    if (f.pace_peers && rate.adaptive) {
        auto every = std::chrono::milliseconds(f.pace_peers_interval_ms);
        auto peers = billing::pace_peers_loop::start(
            rt.io().get_executor(), pool, **stripe, log, every,
            std::max<std::chrono::milliseconds>(8 * every, std::chrono::seconds(2)));
        rt.on_shutdown([peers]() { return peers->stop(); });
    }
    log.info("processing poll", {{"after_ms", static_cast<std::int64_t>(pollcfg.poll_after.count())},
                                 {"rate_per_second", pollcfg.rate_per_second},
                                 {"interval_ms", static_cast<std::int64_t>(pollcfg.interval.count())}});
    auto poller = std::make_shared<billing::settlement_poller>(pollcfg, pool, **stripe, log, &rt.metrics());
    poller->start(rt.io().get_executor(), poller);
    rt.on_shutdown([poller]() { return poller->stop(); });
    start_channel_depth(rt, f, ncfg);
    return rt.start_and_run(start_when_ready(&rt, pool.get(), &f.pg, std::move(*ms), &gate,
                                             [&rt, &consumer] { start_consumer(&rt, &consumer); }));
}

}  // namespace

void register_consume(CLI::App& app, command_main& selected) {
    auto* cmd = add_service_command(
        app, "consume", "consume billing events from NSQ and charge Stripe exactly once",
        "  chargeguard consume --topic billing --channel chargeguard --lookupd-http-address nsqlookupd:4161 "
        "\\\n"
        "      --stripe-key-file /run/secrets/stripe_api_key --migrate\n"
        "  CHARGEGUARD_TOPIC=billing CHARGEGUARD_CHANNEL=chargeguard chargeguard consume --nsqd-tcp-address "
        "127.0.0.1:4150\n");
    auto f = std::make_shared<consume_flags>();
    add_nsq_consumer_flags(*cmd, f->nsq, true);
    add_pg_flags(*cmd, f->pg, true);
    add_stripe_flags(*cmd, f->stripe);
    add_pipeline_flags(*cmd, f->billing);
    add_heal_flags(*cmd, f->heal);
    add_runtime_flags(*cmd, f->rt);
    cmd->add_option("--stripe-io", f->stripe_io,
                    "where Stripe HTTPS requests run: loop (the event loop; each new connection's connect "
                    "and TLS handshake on the offload pool) or offload (all on the offload pool)")
        ->check(CLI::IsMember({"loop", "offload"}))
        ->capture_default_str()
        ->group(group_stripe);
    cmd->add_option("--stripe-pace-peers", f->pace_peers,
                    "share the Stripe rate control with the other consume sidecars of this ledger through "
                    "PostgreSQL (table stripe_pace_peers): one rate law per Stripe account, each sidecar its "
                    "share (opt-in: it drains a backlog slower after a 429 storm); off: each paces alone")
        ->capture_default_str()
        ->group(group_stripe);
    cmd->add_option("--stripe-pace-peers-interval-ms", f->pace_peers_interval_ms,
                    "how often the sidecars exchange their pacing state (a peer silent for 8 intervals, at "
                    "least 2 s, is forgotten)")
        ->check(CLI::Range(50u, 5000u))
        ->capture_default_str()
        ->group(group_stripe);
    cmd->add_option("--processing-poll-after", f->processing_poll_after,
                    "retrieve a payment still processing (a bank debit) from Stripe by id once it has waited "
                    "this long without news, so a lost webhook never leaves it open; 1s to 168h")
        ->capture_default_str()
        ->group(group_pipeline);
    cmd->add_option("--processing-poll-rate", f->processing_poll_rate,
                    "most retrieves per second the processing poll sends to Stripe")
        ->capture_default_str()
        ->group(group_pipeline);
    cmd->add_option("--nsqd-http-address", f->nsqd_http_addresses,
                    "HTTP address host:port of the nsqds given with --nsqd-tcp-address (repeatable), where "
                    "chargeguard_nsq_channel_depth is read; nsqlookupd names the others' itself")
        ->group(group_nsq);
    cmd->add_option("--channel-depth-interval", f->channel_depth_interval,
                    "how often chargeguard_nsq_channel_depth is read from nsqd's /stats (1s to 1h)")
        ->capture_default_str()
        ->group(group_nsq);
    env(cmd->add_flag(
            "--validate", f->validate,
            "check and exit: parse every setting, read the Stripe key, log the effective configuration "
            "(no secret), reach PostgreSQL, each nsqd or nsqlookupd and Stripe once; exit 0, or 78 "
            "naming what failed"),
        env_scope::never);
    cmd->callback([&selected, f] {
        for (const auto& a : f->nsqd_http_addresses)
            if (auto hp = net::parse_host_port(a); !hp)
                bad_value("--nsqd-http-address", a, hp.err().code.message());
        auto every = duration_flag("--channel-depth-interval", f->channel_depth_interval);
        if (every < std::chrono::seconds(1) || every > std::chrono::hours(1))
            bad_value("--channel-depth-interval", f->channel_depth_interval, "must be between 1s and 1h");
        selected = [f](const global_flags& g) { return run_consume(*f, g); };
    });
}

}  // namespace cg::app
