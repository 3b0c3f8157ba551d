#include "lab/run_state.hpp"
#include "pg/migrations.hpp"
#include "pg/params.hpp"

namespace cg::lab {

std::string event_body(const scenario& s, int i) {
    return R"({"customer_id":"cust-)" + std::to_string(i) + R"(","billing_period":")" + billing_period +
           R"(","amount_cents":)" + std::to_string(1000 + i) +
           R"(,"currency":"usd","stripe_customer_id":"cus_lab)" + std::to_string(i) +
           R"(","description":"lab )" + s.name + R"("})";
}

// Event `i`'s correction: revision 1, the period's total 500 lower.
std::string correction_body(const scenario& s, int i) {
    return R"({"customer_id":"cust-)" + std::to_string(i) + R"(","billing_period":")" + billing_period +
           R"(","amount_cents":)" + std::to_string(500 + i) +
           R"(,"currency":"usd","stripe_customer_id":"cus_lab)" + std::to_string(i) +
           R"(","description":"lab )" + s.name + R"(","revision":1})";
}

std::string stripe_customer(int i) {
    return "cus_lab" + std::to_string(i);
}

std::string_view name_of(variant w) {
    switch (w) {
        case variant::unsafe:
            return "unsafe";
        case variant::unsafe_capped:
            return "capped";
        case variant::safe:
            break;
    }
    return "safe";
}

std::string topic_for(const scenario& s, variant w) {
    std::string t = "lab.";
    for (char c : s.name) t += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
    return t + "." + std::string(name_of(w));
}

lab::lab(asio::io_context& io, net::offload_pool& offload, lab_options opts, logger log)
    : io_(io), offload_(offload), opts_(std::move(opts)), log_(std::move(log)) {}

lab::~lab() = default;

asio::any_io_executor lab::io_executor() {
    return io_.get_executor();
}

net::awaitable<result<void>> lab::start() {
    if (auto s = co_await start_stripe(); !s) co_return s.err();

    pool_ = make_pool();
    auto c = co_await pool_->acquire();
    if (!c) co_return c.err();
    auto ms = pg::embedded_migrations();
    if (!ms) co_return ms.err();
    auto mig = co_await pg::migrate(**c, *ms, {}, log_);
    if (!mig) co_return mig.err();
    ledger_ = std::make_unique<billing::ledger>(pool_);
    co_return result<void>{};
}

std::shared_ptr<pg::pool> lab::make_pool() {
    pg::pool_options po;
    po.server = opts_.pg;
    po.size = 4;
    return pg::pool::create(io_.get_executor(), offload_.get_executor(), std::move(po), log_);
}

net::awaitable<void> lab::stop() {
    if (pool_) co_await pool_->close();
    co_await stop_stripe();
}

net::awaitable<pg::rows> lab::sql(std::string statement, pg::params params) {
    auto c = need(co_await pool_->acquire(), "postgres");
    co_return need(co_await c->query_with(statement, std::move(params), 10s), "postgres");
}

net::awaitable<std::vector<row>> lab::run(const scenario& s) {
    std::vector<row> rows;
    for (auto w : variants_of(s)) rows.push_back(co_await run_variant(s, w));
    co_return rows;
}

net::awaitable<row> lab::run_variant(const scenario& s, variant which) {
    if (s.settles_later) co_return co_await run_settle_later(*this, s, which);
    const bool safe = which == variant::safe;
    auto v = std::make_unique<variant_run>(this, &s, safe, io_.get_executor());
    v->stripe = stripe_.get();
    v->topic = topic_for(s, which);
    v->real = real_broker_for(s);
    // Without a real nsqd there is no broker restart that keeps its messages: the fake broker's FM2b history
    // is the other way a message reaches a second nsqd — the producer's failover re-publish.
    v->two_brokers = s.broker_restart && !v->real;
    v->crashes_left = v->two_brokers ? 0 : s.crashes;
    v->data_dir = opts_.work_dir + "/nsqd-" + v->topic;
    for (int i = 1; i <= s.events; ++i) v->bodies.push_back(event_body(s, i));
    if (s.correction)
        for (int i = 1; i <= s.events; ++i) v->bodies.push_back(correction_body(s, i));
    log_.info("lab: running",
              {{"scenario", s.name}, {"variant", std::string(name_of(which))}, {"real_nsqd", v->real}});

    co_await prepare(*v);
    if (s.spend_cap && which != variant::unsafe) co_await start_vault(*v);
    std::exception_ptr failed;
    try {
        co_await publish(*v);
        configure_consumer(*v);
        if (safe)
            v->pipeline = std::make_unique<billing::charge_flow>(pipeline_config_for(v.get()), *ledger_,
                                                                 *v->stripe, log_);
        start_consumer(v.get(), log_);
        co_await drive(*v);
        co_await wind_down(*v);
    } catch (...) {
        failed = std::current_exception();
    }
    // Whatever happened, the proxy's background tasks end (they would keep the loop running) and its audit
    // rows are written before the count reads them.
    if (v->vault) co_await stop_vault(*v);
    if (failed) std::rethrow_exception(failed);
    co_return co_await count(*v);
}

// Fresh state for one run: fake-stripe reset with the scenario's faults, the ledger emptied, the broker(s)
// started with the topic and channel created.
net::awaitable<void> lab::prepare(variant_run& v) {
    const auto& s = *v.sc;
    need(co_await admin("POST", "/_admin/reset", ""), "fake-stripe reset");
    std::string faults = "latency_ms=" + std::to_string(s.stripe_latency_ms) +
                         "&fail_after_create=" + std::to_string(s.fail_after_create);
    need(co_await admin("POST", "/_admin/faults", faults), "fake-stripe faults");
    co_await sql(
        "TRUNCATE billing_records, billing_correction_moves, billing_corrections, dead_letters, vault_audit, "
        "vault_spend, vault_leases, vault_keys");
    for (int i = 0; i < (v.two_brokers ? 2 : 1); ++i)
        v.brokers.push_back(need(co_await start_broker(v.real, v.data_dir), "broker"));
    for (auto& b : v.brokers) {
        need(co_await http_call(*b->http, "POST", "/topic/create?topic=" + v.topic, ""), "topic/create");
        need(co_await http_call(*b->http, "POST",
                                "/channel/create?topic=" + v.topic + "&channel=" + channel_name, ""),
             "channel/create");
    }
    // A real nsqd scans a new channel for timeouts only from its next 5 s refresh: start after it.
    if (v.real && s.stripe_latency_ms > opts_.msg_timeout.count()) {
        auto ready_at = v.brokers[0]->started + 5500ms;
        if (sclock::now() < ready_at)
            co_await net::sleep_for(std::chrono::duration_cast<milliseconds>(ready_at - sclock::now()));
    }
}

// Every event once (twice when the producer re-publishes; also to the second nsqd in the fake FM2b).
net::awaitable<void> lab::publish(variant_run& v) {
    for (const auto& body : v.bodies) {
        std::vector<broker*> to{v.brokers[0].get()};
        if (v.sc->publish_twice) to.push_back(v.brokers[0].get());
        if (v.two_brokers) to.push_back(v.brokers[1].get());
        for (auto* b : to) {
            auto r = co_await http_call(*b->http, "POST", "/pub?topic=" + v.topic, body);
            if (!r) throw std::runtime_error("pub: " + r.err().describe());
        }
    }
}

void lab::configure_consumer(variant_run& v) {
    const auto& s = *v.sc;
    auto& c = v.ncfg;
    c.topic = v.topic;
    c.channel = channel_name;
    c.max_in_flight = v.two_brokers ? std::max(2u, s.max_in_flight) : s.max_in_flight;
    c.msg_timeout = opts_.msg_timeout;
    c.heartbeat_interval = milliseconds(s.heartbeat_ms);
    c.max_attempts = s.max_attempts;
    lab_consumer_delays(c);
}

void lab_consumer_delays(nsq::consumer_config& c) {
    c.reconnect_backoff_min = 100ms;
    c.reconnect_backoff_max = 1s;
    c.backoff_multiplier = 50ms;
    c.max_backoff_duration = 400ms;
    c.default_requeue_delay = 300ms;
    c.max_requeue_delay = 1s;
    c.rdy_redistribute_interval = 500ms;
    c.drain_timeout = 10s;
    c.connect_timeout = 2s;
}

// The crash: connections dropped without FIN, like a killed process; nsqd redelivers each message that was
// in flight once its msg_timeout runs out. Then a new consumer (a restarted process) subscribes.
net::awaitable<void> lab::crash_and_restart(variant_run& v) {
    v.snapshot_consumer();
    v.disconnects += v.consumer->stats().disconnects;
    v.consumer.reset();
    v.park.cancel();
    v.crash_pending = false;
    if (v.sc->broker_restart && v.real) {
        // …and the broker restarts on another address (its messages persisted in --data-path).
        co_await add_timeouts(v);
        auto old = std::move(v.brokers[0]);
        v.brokers.clear();
        co_await stop_broker(std::move(old));
        auto b = co_await start_broker(true, v.data_dir);
        if (!b) throw std::runtime_error("broker restart: " + b.err().describe());
        v.brokers.push_back(std::move(*b));
    }
    start_consumer(&v, log_);
}

// Until nothing is left to deliver: crashes and restarts as they come, the operator's pause/resume, the
// re-publish a day later. Settled = every handler idle and nsqd holding nothing (queued, in flight,
// deferred) for three polls in a row.
net::awaitable<void> lab::drive(variant_run& v) {
    const auto& s = *v.sc;
    auto deadline = sclock::now() + 150s;
    bool paused = false, resumed = false, republished = false;
    sclock::time_point paused_at;
    int quiet = 0;
    while (sclock::now() < deadline) {
        co_await net::sleep_for(100ms);
        if (v.crash_pending) {
            co_await crash_and_restart(v);
            quiet = 0;
            continue;
        }
        if (s.pause_in_flight && !paused &&
            v.consumer->stats().received >= static_cast<std::uint64_t>(s.events)) {
            co_await channel_op(v, "pause");
            paused = true;
            paused_at = sclock::now();
        } else if (paused && !resumed && sclock::now() - paused_at >= 2s) {
            co_await channel_op(v, "unpause");
            resumed = true;
        }
        bool idle = consumer_idle(v) && (!s.pause_in_flight || resumed);
        for (auto& b : v.brokers)
            if (idle && !(co_await stats_of(*b, v.topic)).quiet()) idle = false;
        quiet = idle ? quiet + 1 : 0;
        if (quiet < 3) continue;
        if (!s.republish_after_24h || republished) co_return;
        // A day later the same events come again (an upstream replay): Stripe has forgotten the key.
        republished = true;
        co_await advance_stripe_clock(stripe_day);
        v.clock_offset += stripe_day;
        co_await publish(v);
        quiet = 0;
    }
    throw std::runtime_error(s.name + ": the run did not settle within 150 s");
}

// Graceful stop of the last consumer, nsqd's timeout counts, the brokers stopped, every handler returned.
net::awaitable<void> lab::wind_down(variant_run& v) {
    v.disconnects += v.consumer->stats().disconnects;  // before the graceful stop closes them
    co_await v.consumer->stop();
    v.snapshot_consumer();
    v.consumer.reset();
    co_await add_timeouts(v);
    for (auto& b : v.brokers) co_await stop_broker(std::move(b));
    v.brokers.clear();
    for (auto until = sclock::now() + 30s; v.running > 0 && sclock::now() < until;)
        co_await net::sleep_for(20ms);
    if (v.running > 0) throw std::runtime_error("handlers still running after the run ended");
}

}  // namespace cg::lab
