#include "vault/proxy_state.hpp"

namespace cg::vault {
namespace {

using clock = std::chrono::steady_clock;

double micros(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

void register_metrics(proxy::state& state, metrics::registry& reg) {
    auto* st = &state;
    st->requests = &reg.counter("chargeguard_vault_requests_total", "Proxied requests by outcome");
    st->resolutions = &reg.counter("chargeguard_vault_resolutions_total",
                                   "Uncertain or abandoned reservations the resolver looked at, by result");
    st->utilisation =
        &reg.gauge("chargeguard_vault_cap_utilisation_ratio",
                   "Committed spend (settled + reserved + uncertain) over the cap, per vault key");
    st->reservations = &reg.gauge("chargeguard_vault_reservations", "vault_spend rows by state");
    st->upstream_latency = &reg.histogram("chargeguard_vault_upstream_latency_seconds",
                                          "Time from forwarding a request to Stripe's complete answer")
                                .Add({}, metrics::latency_buckets());
    st->added_latency = &reg.histogram("chargeguard_vault_added_latency_seconds",
                                       "Time the proxy adds to a forwarded request (total minus upstream)")
                             .Add({}, metrics::latency_buckets());
    st->audit_dropped =
        &reg.counter("chargeguard_vault_audit_dropped_total",
                     "Audit rows dropped because PostgreSQL stayed unreachable and the queue was full")
             .Add({});
    st->settlements_dropped = &reg.counter("chargeguard_vault_settlements_dropped_total",
                                           "Answers not recorded (PostgreSQL away): the rows stay reserved "
                                           "until the resolver settles them")
                                   .Add({});
    auto& stages =
        reg.histogram("chargeguard_vault_stage_seconds",
                      "Forwarded creates, time per stage: auth (key checked), reserve_wait (queued for "
                      "the key's next batch), reserve_statement (cg_vault_step round trip), upstream, "
                      "answer (Stripe's answer to the response handed back)");
    st->stage_auth = &stages.Add({{"stage", "auth"}}, metrics::latency_buckets());
    st->stage_wait = &stages.Add({{"stage", "reserve_wait"}}, metrics::latency_buckets());
    st->stage_statement = &stages.Add({{"stage", "reserve_statement"}}, metrics::latency_buckets());
    st->stage_upstream = &stages.Add({{"stage", "upstream"}}, metrics::latency_buckets());
    st->stage_answer = &stages.Add({{"stage", "answer"}}, metrics::latency_buckets());
    st->audit_written = &reg.counter("chargeguard_vault_audit_written_total", "Audit rows written").Add({});
    st->lease_cents =
        &reg.gauge("chargeguard_vault_lease_cents",
                   "Cents this proxy's cap lease of a key holds and has not spent, per vault key");
    st->lease_takes = &reg.counter("chargeguard_vault_lease_takes_total",
                                   "Cap lease statements (take, top up, renew) by result");
    st->lease_returned_cents =
        &reg.counter("chargeguard_vault_lease_returned_cents_total",
                     "Cents this proxy gave back from its cap leases unspent (idle, refused, or at stop)")
             .Add({});
    st->leases_stranded = &reg.counter("chargeguard_vault_leases_stranded_total",
                                       "Cap leases this proxy left open because their spends could not be "
                                       "written (an operator forfeits them)")
                               .Add({});
    st->expired_lease_cents =
        &reg.gauge("chargeguard_vault_expired_lease_cents",
                   "Cents held by open cap leases past their expiry, every key: leases no holder renews "
                   "(a dead proxy's), counted against the caps until forfeited")
             .Add({});
}

void observe_stages(proxy::state& st, const ledger_line& l, clock::time_point end) {
    if (l.up_done == clock::time_point{} || l.stmt_done == clock::time_point{}) return;
    double auth = micros(l.started, l.authed), wait = micros(l.queued, l.stmt_sent),
           stmt = micros(l.stmt_sent, l.stmt_done), up = micros(l.up_sent, l.up_done),
           answer = micros(l.up_done, end);
    st.stage_auth->Observe(auth / 1e6);
    st.stage_wait->Observe(wait / 1e6);
    st.stage_statement->Observe(stmt / 1e6);
    st.stage_upstream->Observe(up / 1e6);
    st.stage_answer->Observe(answer / 1e6);
    if (!st.log.enabled(log_level::debug)) return;
    auto us = [](double v) { return static_cast<std::int64_t>(v); };
    st.log.debug("vault request stages", {{"t_us", us(micros(clock::time_point{}, l.started))},
                                          {"auth_us", us(auth)},
                                          {"parse_us", us(micros(l.authed, l.queued))},
                                          {"wait_us", us(wait)},
                                          {"stmt_us", us(stmt)},
                                          {"batch", l.batch_creates},
                                          {"settlements", l.batch_settlements},
                                          {"to_upstream_us", us(micros(l.stmt_done, l.up_sent))},
                                          {"upstream_us", us(up)},
                                          {"answer_us", us(answer)},
                                          {"total_us", us(micros(l.started, end))}});
}

}  // namespace cg::vault
