#include "billing/flow/nsq_delivery.hpp"
#include "lab/keys.hpp"
#include "lab/run_state.hpp"

namespace cg::lab {
namespace {

// The pipeline's verdict on one delivery (or, past max attempts, its give-up), as `consume` runs it.
net::awaitable<billing::verdict> pipeline_verdict(run_t* v, nsq::message& m, bool give_up) {
    co_return co_await billing::run_delivery(*v->pipeline, m, v->topic, channel_name, give_up);
}

}  // namespace

// The safe consumer: what `chargeguard consume` runs — the pipeline, with the message TOUCHed throughout.
net::awaitable<nsq::disposition> safe_handle(run_t* v, nsq::message& m) {
    running_guard g(v);
    const bool crashable = crash_applies(v, m.body());  // before the pipeline takes the body
    auto verdict = co_await pipeline_verdict(v, m, false);
    if (crashable && co_await maybe_crash(v)) co_return nsq::disposition::finish();
    co_await after_delivery(v);
    co_return billing::to_disposition(verdict);
}

// As `consume`: past max attempts the pipeline runs the same machine; its verdict is applied like any other.
net::awaitable<nsq::disposition> safe_give_up(run_t* v, nsq::message& m) {
    running_guard g(v);
    co_return billing::to_disposition(co_await pipeline_verdict(v, m, true));
}

billing::charge_flow_config lab_pipeline_config(std::string ns) {
    billing::charge_flow_config c;
    c.key_namespace = std::move(ns);
    c.lease = 2s;
    c.lease_renew_interval = 500ms;
    c.lease_held_delay = 500ms;
    c.retry_same_key_delay = 300ms;
    c.indeterminate_delay = 300ms;
    c.stripe_unavailable_delay = 500ms;
    c.new_key_quiet = 1s;  // two renewal intervals
    c.postgres_backoff = {100ms, 1s};
    c.correction_wait_delay = 300ms;
    return c;
}

billing::charge_flow_config pipeline_config_for(run_t* v) {
    auto c = lab_pipeline_config(key_namespace);
    // The world's clock: moved with fake-stripe's when a scenario lets a day pass.
    c.now = [v] { return std::chrono::system_clock::now() + v->clock_offset; };
    return c;
}

void start_consumer(run_t* v, const logger& log) {
    v->ncfg.nsqd_tcp_addresses.clear();
    for (const auto& b : v->brokers) v->ncfg.nsqd_tcp_addresses.push_back(b->tcp_address);
    v->conn_uuid = random_uuid();
    v->consumer = std::make_unique<nsq::consumer>(
        v->L->io_executor(), v->ncfg,
        [v](nsq::message& m) { return v->safe ? safe_handle(v, m) : unsafe_handle(v, m); }, log, *v->reg);
    v->consumer->set_give_up_handler(
        [v](nsq::message& m) { return v->safe ? safe_give_up(v, m) : unsafe_give_up(m); });
    need(v->consumer->start(), "consumer");
}

bool consumer_idle(const run_t& v) {
    const auto& s = v.consumer->stats();
    return s.received == s.finished + s.requeued + s.responses_dropped;
}

}  // namespace cg::lab
