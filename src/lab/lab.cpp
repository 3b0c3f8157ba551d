#include "lab/lab.hpp"

#include <signal.h>
#include <simdjson.h>

#include <asio/co_spawn.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_future.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "billing/event.hpp"
#include "billing/key.hpp"
#include "billing/ledger.hpp"
#include "billing/pipeline.hpp"
#include "http/client.hpp"
#include "lab/keys.hpp"
#include "metrics/registry.hpp"
#include "nsq/connection.hpp"
#include "nsq/consumer.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"

namespace cg::lab {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using sclock = std::chrono::steady_clock;

namespace {

const std::string key_namespace = "lab";
const std::string channel_name = "lab";
const std::string billing_period = "2026-11";
constexpr auto stripe_day = std::chrono::hours(25);  // past Stripe's 24 h idempotency window

net::awaitable<void> sleep_for(milliseconds d) {
    net::steady_timer t(co_await asio::this_coro::executor, d);
    co_await t.async_wait();
}

std::string event_body(const scenario& s, int i) {
    return R"({"customer_id":"cust-)" + std::to_string(i) + R"(","billing_period":")" + billing_period +
           R"(","amount_cents":)" + std::to_string(1000 + i) +
           R"(,"currency":"usd","stripe_customer_id":"cus_lab)" + std::to_string(i) +
           R"(","description":"lab )" + s.name + R"("})";
}

std::string stripe_customer(int i) {
    return "cus_lab" + std::to_string(i);
}

std::string topic_for(const scenario& s, bool safe) {
    std::string t = "lab.";
    for (char c : s.name) t += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ? c : '_';
    return t + (safe ? ".safe" : ".unsafe");
}

// Blocking work for the offload pool.
net::awaitable<std::optional<child>> spawn_and_wait_line(std::vector<std::string> argv, std::string err_path,
                                                         std::string* line) {
    auto c = child::spawn(argv, err_path);
    if (!c) co_return std::nullopt;
    if (line) {
        auto l = c->read_line(10s);
        if (!l) co_return std::nullopt;
        *line = *l;
    }
    co_return std::move(*c);
}

net::awaitable<int> stop_child(child c, int sig) {
    co_return c.stop(sig, 10s);
}

}  // namespace

// --- one nsqd --------------------------------------------------------------------------------------------

struct lab::broker {
    bool real = false;
    child proc;
    std::string tcp_address, http_address, data_dir;
    sclock::time_point started;
    std::unique_ptr<http::client> http;
};

struct channel_stats {
    bool found = false;
    std::int64_t topic_depth = 0, depth = 0, in_flight = 0, deferred = 0, timeouts = 0;
    bool quiet() const { return topic_depth == 0 && depth == 0 && in_flight == 0 && deferred == 0; }
};

namespace {

net::awaitable<result<std::string>> http_call(http::client& c, std::string method, std::string target,
                                              std::string body) {
    http::request r;
    r.method = std::move(method);
    r.target = std::move(target);
    r.body = std::move(body);
    auto res = co_await c.request(std::move(r));
    if (!res.ok()) co_return res.err;
    if (res.resp.status != 200)
        co_return error(std::make_error_code(std::errc::protocol_error),
                        "HTTP " + std::to_string(res.resp.status) + ": " + res.resp.body);
    co_return std::move(res.resp.body);
}

net::awaitable<channel_stats> stats_of(lab::broker& b, const std::string& topic) {
    channel_stats out;
    auto body = co_await http_call(*b.http, "GET",
                                   "/stats?format=json&topic=" + topic + "&channel=" + channel_name, "");
    if (!body) co_return out;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    if (p.parse(*body).get(doc)) co_return out;
    simdjson::dom::array topics;
    if (doc["topics"].get(topics)) co_return out;
    for (auto t : topics) {
        std::string_view name;
        if (t["topic_name"].get(name) || name != topic) continue;
        std::int64_t d = 0;
        if (!t["depth"].get(d)) out.topic_depth = d;
        simdjson::dom::array chans;
        if (t["channels"].get(chans)) continue;
        for (auto c : chans) {
            std::string_view cn;
            if (c["channel_name"].get(cn) || cn != channel_name) continue;
            out.found = true;
            std::int64_t v = 0;
            if (!c["depth"].get(v)) out.depth = v;
            if (!c["in_flight_count"].get(v)) out.in_flight = v;
            if (!c["deferred_count"].get(v)) out.deferred = v;
            if (!c["timeout_count"].get(v)) out.timeouts = v;
        }
    }
    co_return out;
}

}  // namespace

// --- one variant's state (main loop) ----------------------------------------------------------------------

struct lab::variant_run {
    variant_run(lab* l, const scenario* s, bool sf, asio::any_io_executor ex)
        : L(l), sc(s), safe(sf), park(ex, sclock::time_point::max()) {}

    lab* L;
    const scenario* sc;
    bool safe;
    std::string topic;
    bool real = false;         // the real nsqd
    bool two_brokers = false;  // FM2b on fake-nsqd: the event reaches a second nsqd
    std::string data_dir;
    std::vector<std::string> bodies;
    std::vector<std::unique_ptr<broker>> brokers;
    std::unique_ptr<metrics::registry> reg = std::make_unique<metrics::registry>();
    std::unique_ptr<billing::pipeline> pipeline;
    std::unique_ptr<nsq::consumer> consumer;
    nsq::consumer_config ncfg;
    std::string conn_uuid = random_uuid();
    int crashes_left = 0;
    bool crash_pending = false;
    bool clock_jumped = false;
    std::chrono::seconds clock_offset{0};
    net::steady_timer park;  // crashed handlers wait here until their consumer is torn down
    std::set<std::string> keys;
    int running = 0;  // handlers of this run's consumers (current or crashed) not yet returned
    std::uint64_t received = 0, fin_failed = 0, timeouts = 0, disconnects = 0;

    void snapshot_consumer() {
        if (!consumer) return;
        received += consumer->stats().received;
        fin_failed += consumer->stats().fin_failed;
    }
};

namespace {

using run_t = lab::variant_run;

// Counts a handler as running for its whole life, so a run ends only once every handler — including those
// of a crashed consumer — has returned and nothing refers to the run any more.
struct running_guard {
    explicit running_guard(run_t* r) : v(r) { ++v->running; }
    ~running_guard() { --v->running; }
    running_guard(const running_guard&) = delete;
    running_guard& operator=(const running_guard&) = delete;
    run_t* v;
};

// "Crash after Stripe answered, before FIN": the first `crashes` deliveries of a run park here; the driver
// sees crash_pending, tears the consumer's connections down without a FIN (what a killed process does), and
// only then wakes them, to return into a consumer that can no longer answer nsqd.
net::awaitable<bool> maybe_crash(run_t* v) {
    if (v->crashes_left <= 0) co_return false;
    --v->crashes_left;
    v->crash_pending = true;
    co_await v->park.async_wait();
    co_return true;
}

// The deferred-REQ scenario: the first delivery's requeue lands after Stripe's 24 h window.
net::awaitable<void> after_delivery(run_t* v) {
    if (!v->sc->clock_jump_after_first || v->clock_jumped) co_return;
    v->clock_jumped = true;
    co_await v->L->advance_stripe_clock(stripe_day);
    v->clock_offset += stripe_day;
}

stripe::charge_request charge_for(const billing::billing_event& ev, std::string key) {
    stripe::charge_request r;
    r.amount = ev.amount_cents;
    r.currency = ev.currency;
    r.customer = ev.stripe_customer_id;
    r.description = ev.description;
    r.metadata = {
        {"billing_key", key}, {"customer_id", ev.customer_id}, {"billing_period", ev.billing_period}};
    r.idempotency_key = std::move(key);
    return r;
}

nsq::disposition after_stripe(const stripe::charge_outcome& out) {
    using oc = stripe::outcome_class;
    if (out.cls == oc::retry_same_key || out.cls == oc::indeterminate)
        return nsq::disposition::requeue(300ms);
    return nsq::disposition::finish();
}

billing::lease_token token_of(const billing::ledger_record& r) {
    return r.lease_epoch;
}

// The ledger without the rest: a pending row and a lease before Stripe, recovery of an expired lease by
// calling Stripe again — but under a naive key (salted with Attempts) and without searching Stripe first.
net::awaitable<nsq::disposition> ledger_naive(run_t* v, nsq::message& m, billing::billing_event ev) {
    auto& led = v->L->ledger();
    auto base = billing::base_key(key_namespace, ev.customer_id, ev.billing_period);
    const milliseconds lease = 2s;
    billing::new_record rec{base, ev, std::string(m.id()), m.attempts()};
    auto pf = co_await led.preflight(rec, lease);
    if (!pf) co_return nsq::disposition::requeue(300ms);
    billing::lease_token tok;
    if (pf->inserted) {
        tok = token_of(pf->record);
    } else {
        if (billing::is_final(pf->record.status)) co_return nsq::disposition::finish();
        auto taken = co_await led.take_expired_lease(base, lease, std::string(m.id()), m.attempts());
        if (!taken || !*taken) co_return nsq::disposition::requeue_without_backoff(500ms);
        tok = token_of(**taken);
    }
    auto att = co_await led.record_attempt(base, tok, lease);
    if (!att || !*att) co_return nsq::disposition::requeue_without_backoff(500ms);
    key_inputs in;
    in.key_namespace = key_namespace;
    in.customer_id = ev.customer_id;
    in.billing_period = ev.billing_period;
    in.attempts = m.attempts();
    auto key = make_key(v->sc->unsafe_key, in);
    v->keys.insert(key);
    stripe::charge_outcome out;
    {
        nsq::keepalive alive(m);
        out = co_await v->L->stripe().create_charge(charge_for(ev, key));
    }
    if (co_await maybe_crash(v)) co_return nsq::disposition::finish();
    if (out.cls == stripe::outcome_class::succeeded) {
        co_await led.mark_charged(base, out.charge_id);
        co_return nsq::disposition::finish();
    }
    if (out.cls == stripe::outcome_class::indeterminate) {
        co_await led.mark_indeterminate(base, (*att)->lease, out.message);
        co_return nsq::disposition::requeue(300ms);
    }
    co_return nsq::disposition::finish();
}

// The unsafe consumer: the real NSQ consumer and Stripe client, no ledger, and one of the bad keys.
net::awaitable<nsq::disposition> unsafe_handle(run_t* v, nsq::message& m) {
    running_guard g(v);
    auto ev = billing::parse_event(m.body());
    if (!ev) co_return nsq::disposition::finish();
    if (v->sc->call == unsafe_call::ledger_naive_key) co_return co_await ledger_naive(v, m, std::move(*ev));
    std::optional<nsq::keepalive> alive;
    if (v->sc->call == unsafe_call::offloaded_touch) alive.emplace(m);
    key_inputs in;
    in.key_namespace = key_namespace;
    in.customer_id = ev->customer_id;
    in.billing_period = ev->billing_period;
    in.attempts = m.attempts();
    in.connection_uuid = v->conn_uuid;
    in.nsqd_address = m.conn() ? m.conn()->key() : std::string();
    in.call_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    in.message_id = std::string(m.id());
    auto key = make_key(v->sc->unsafe_key, in);
    v->keys.insert(key);
    stripe::charge_outcome out;
    if (v->sc->call == unsafe_call::blocking) {
        // pynsq's IOLoop failure: the handler waits for Stripe on the loop's own thread, so nothing else on
        // the main loop runs — no heartbeat answer, no FIN of the messages already done, no reads.
        auto f = asio::co_spawn(v->L->offload().get_executor(),
                                v->L->stripe().create_charge(charge_for(*ev, key)), asio::use_future);
        out = f.get();
    } else {
        out = co_await v->L->stripe().create_charge(charge_for(*ev, key));
    }
    alive.reset();
    if (co_await maybe_crash(v)) co_return nsq::disposition::finish();
    co_await after_delivery(v);
    co_return after_stripe(out);
}

billing::delivery delivery_of(run_t* v, const nsq::message& m) {
    billing::delivery d;
    d.topic = v->topic;
    d.channel = channel_name;
    d.message_id = std::string(m.id());
    d.attempts = m.attempts();
    d.body = m.body();
    return d;
}

// As `consume` maps a verdict (src/app/cmd_consume.cpp): a requeue is "not now", never a handler failure.
nsq::disposition to_disposition(const billing::verdict& v) {
    if (v.finished()) return nsq::disposition::finish();
    return nsq::disposition::requeue_without_backoff(v.delay);
}

// The safe consumer: what `chargeguard consume` runs — the pipeline, with the message TOUCHed throughout.
net::awaitable<nsq::disposition> safe_handle(run_t* v, nsq::message& m) {
    running_guard g(v);
    billing::verdict verdict;
    {
        nsq::keepalive alive(m);
        verdict = co_await v->pipeline->handle(delivery_of(v, m), [&m] { m.touch(); });
    }
    if (co_await maybe_crash(v)) co_return nsq::disposition::finish();
    co_await after_delivery(v);
    co_return to_disposition(verdict);
}

// go-nsq's default past max_attempts: log and FIN.
net::awaitable<nsq::disposition> unsafe_give_up(nsq::message&) {
    co_return nsq::disposition::finish();
}

// As `consume`: past max attempts the pipeline runs the same machine; its verdict is applied like any other.
net::awaitable<nsq::disposition> safe_give_up(run_t* v, nsq::message& m) {
    running_guard g(v);
    billing::verdict verdict;
    {
        nsq::keepalive alive(m);
        verdict = co_await v->pipeline->give_up(delivery_of(v, m), [&m] { m.touch(); });
    }
    co_return to_disposition(verdict);
}

billing::pipeline_config pipeline_config_for(run_t* v) {
    billing::pipeline_config c;
    c.key_namespace = key_namespace;
    c.lease = 2s;
    c.lease_renew_interval = 500ms;
    c.lease_held_delay = 500ms;
    c.retry_same_key_delay = 300ms;
    c.indeterminate_delay = 300ms;
    c.stripe_unavailable_delay = 500ms;
    c.postgres_backoff = {100ms, 1s};
    // The world's clock: moved with fake-stripe's when a scenario lets a day pass.
    c.now = [v] { return std::chrono::system_clock::now() + v->clock_offset; };
    return c;
}

void start_consumer(run_t* v, const logger& log) {
    v->ncfg.nsqd_tcp_addresses.clear();
    for (const auto& b : v->brokers) v->ncfg.nsqd_tcp_addresses.push_back(b->tcp_address);
    v->conn_uuid = random_uuid();
    if (v->safe) {
        v->consumer = std::make_unique<nsq::consumer>(
            v->L->io_executor(), v->ncfg, [v](nsq::message& m) { return safe_handle(v, m); }, log, *v->reg);
        v->consumer->set_give_up_handler([v](nsq::message& m) { return safe_give_up(v, m); });
    } else {
        v->consumer = std::make_unique<nsq::consumer>(
            v->L->io_executor(), v->ncfg, [v](nsq::message& m) { return unsafe_handle(v, m); }, log, *v->reg);
        v->consumer->set_give_up_handler([](nsq::message& m) { return unsafe_give_up(m); });
    }
    if (auto r = v->consumer->start(); !r) throw std::runtime_error("consumer: " + r.err().describe());
}

bool consumer_idle(const run_t& v) {
    const auto& s = v.consumer->stats();
    return s.received == s.finished + s.requeued + s.responses_dropped;
}

}  // namespace

// --- lab -------------------------------------------------------------------------------------------------

lab::lab(asio::io_context& io, net::offload_pool& offload, lab_options opts, logger log)
    : io_(io), offload_(offload), opts_(std::move(opts)), log_(std::move(log)) {}

lab::~lab() = default;

asio::any_io_executor lab::io_executor() {
    return io_.get_executor();
}

net::awaitable<result<void>> lab::start() {
    std::string line;
    // (A named argv: g++ 12 cannot compile a braced list inside a co_await expression.)
    std::vector<std::string> argv{opts_.fake_stripe_bin,
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--cert",
                                  opts_.certs_dir + "/server.pem",
                                  "--key",
                                  opts_.certs_dir + "/server.key"};
    auto proc = co_await net::offload(offload_.get_executor(),
                                      spawn_and_wait_line(argv, opts_.work_dir + "/fake-stripe.log", &line));
    if (!proc)
        co_return error(std::make_error_code(std::errc::no_such_process),
                        "fake-stripe did not start: " + opts_.fake_stripe_bin);
    stripe_proc_ = std::move(*proc);
    auto at = line.rfind(' ');
    std::string base = "https://" + line.substr(at + 1);

    stripe::client_config sc;
    sc.api_base = base;
    sc.api_key = "sk_test_chargeguard_lab";
    sc.ca_file = opts_.certs_dir + "/ca.pem";
    sc.request_timeout = 10s;
    sc.connect_timeout = 2s;
    sc.retry = {2, 50ms, 200ms};
    sc.max_connections = 32;
    auto cl = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!cl) co_return cl.err();
    stripe_ = std::move(*cl);
    sc.retry = {0, 50ms, 50ms};
    auto ad = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!ad) co_return ad.err();
    admin_ = std::move(*ad);

    pg::pool_options po;
    po.server = opts_.pg;
    po.size = 4;
    pool_ = pg::pool::create(io_.get_executor(), offload_.get_executor(), std::move(po), log_);
    auto c = co_await pool_->acquire();
    if (!c) co_return c.err();
    auto ms = pg::embedded_migrations();
    if (!ms) co_return ms.err();
    auto mig = co_await pg::migrate(**c, *ms, {}, log_);
    if (!mig) co_return mig.err();
    ledger_ = std::make_unique<billing::ledger>(pool_);
    co_return result<void>{};
}

net::awaitable<void> lab::stop() {
    if (pool_) co_await pool_->close();
    if (stripe_proc_.pid() > 0)
        co_await net::offload(offload_.get_executor(), stop_child(std::move(stripe_proc_), SIGTERM));
}

net::awaitable<result<std::string>> lab::admin(std::string method, std::string target, std::string body) {
    auto r = co_await admin_->call(std::move(method), std::move(target), std::move(body),
                                   "lab-admin-" + std::to_string(++seq_));
    if (!r.http.ok()) co_return r.http.err;
    if (r.http.resp.status != 200)
        co_return error(std::make_error_code(std::errc::protocol_error),
                        "fake-stripe admin: HTTP " + std::to_string(r.http.resp.status));
    co_return std::move(r.http.resp.body);
}

net::awaitable<void> lab::advance_stripe_clock(std::chrono::seconds by) {
    auto r = co_await admin("POST", "/_admin/clock", "advance_s=" + std::to_string(by.count()));
    if (!r) throw std::runtime_error("cannot move fake-stripe's clock: " + r.err().describe());
}

net::awaitable<void> lab::sql(std::string statement) {
    auto c = co_await pool_->acquire();
    if (!c) throw std::runtime_error("postgres: " + c.err().describe());
    auto r = co_await (*c)->query_with(statement, pg::params(), 10s);
    if (!r) throw std::runtime_error("postgres: " + r.err().describe());
}

net::awaitable<result<std::unique_ptr<lab::broker>>> lab::start_broker(bool real, std::string data_dir) {
    auto b = std::make_unique<broker>();
    b->real = real;
    b->data_dir = data_dir;
    std::string line;
    std::string err_log = opts_.work_dir + (real ? "/nsqd.log" : "/fake-nsqd.log");
    if (real) {
        auto tp = free_port();
        auto hp = free_port();
        if (!tp || !hp) co_return error(std::make_error_code(std::errc::address_in_use), "no free port");
        b->tcp_address = "127.0.0.1:" + std::to_string(*tp);
        b->http_address = "127.0.0.1:" + std::to_string(*hp);
        std::filesystem::create_directories(data_dir);
        auto secs = std::to_string(opts_.msg_timeout.count()) + "ms";
        std::vector<std::string> argv{opts_.nsqd_bin,
                                      "--tcp-address=" + b->tcp_address,
                                      "--http-address=" + b->http_address,
                                      "--data-path=" + data_dir,
                                      "--msg-timeout=" + secs,
                                      "--broadcast-address=127.0.0.1",
                                      "--log-level=warn"};
        auto p = co_await net::offload(offload_.get_executor(), spawn_and_wait_line(argv, err_log, nullptr));
        if (!p)
            co_return error(std::make_error_code(std::errc::no_such_process),
                            "nsqd did not start: " + opts_.nsqd_bin);
        b->proc = std::move(*p);
    } else {
        std::vector<std::string> argv{opts_.fake_nsqd_bin, "--msg-timeout-ms",
                                      std::to_string(opts_.msg_timeout.count())};
        auto p = co_await net::offload(offload_.get_executor(), spawn_and_wait_line(argv, err_log, &line));
        if (!p)
            co_return error(std::make_error_code(std::errc::no_such_process),
                            "fake-nsqd did not start: " + opts_.fake_nsqd_bin);
        b->proc = std::move(*p);
        unsigned tcp = 0, http = 0;
        if (std::sscanf(line.c_str(), "tcp=%u http=%u", &tcp, &http) != 2)
            co_return error(std::make_error_code(std::errc::protocol_error), "fake-nsqd said: " + line);
        b->tcp_address = "127.0.0.1:" + std::to_string(tcp);
        b->http_address = "127.0.0.1:" + std::to_string(http);
    }
    b->started = sclock::now();
    http::client_options ho;
    ho.request_timeout = 5s;
    ho.connect_timeout = 2s;
    auto hc = http::client::create(offload_.get_executor(), "http://" + b->http_address, ho, log_);
    if (!hc) co_return hc.err();
    b->http = std::move(*hc);
    // Up when /ping answers.
    auto deadline = sclock::now() + 10s;
    for (;;) {
        auto r = co_await http_call(*b->http, "GET", "/ping", "");
        if (r) break;
        if (sclock::now() > deadline)
            co_return error(std::make_error_code(std::errc::timed_out), "nsqd /ping");
        co_await sleep_for(50ms);
    }
    co_return std::move(b);
}

net::awaitable<void> lab::stop_broker(std::unique_ptr<broker> b) {
    b->http.reset();
    // SIGTERM: a real nsqd writes its in-flight and queued messages to --data-path before it exits.
    co_await net::offload(offload_.get_executor(), stop_child(std::move(b->proc), SIGTERM));
}

net::awaitable<std::vector<row>> lab::run(const scenario& s) {
    std::vector<row> rows;
    rows.push_back(co_await run_variant(s, false));
    rows.push_back(co_await run_variant(s, true));
    co_return rows;
}

net::awaitable<row> lab::run_variant(const scenario& s, bool safe) {
    auto v = std::make_unique<variant_run>(this, &s, safe, io_.get_executor());
    v->topic = topic_for(s, safe);
    v->real = real_broker_for(s);
    // Without a real nsqd there is no broker restart that keeps its messages: the fake broker's FM2b history
    // is the other way a message reaches a second nsqd — the producer's failover re-publish.
    v->two_brokers = s.broker_restart && !v->real;
    v->crashes_left = v->two_brokers ? 0 : s.crashes;
    v->data_dir = opts_.work_dir + "/nsqd-" + v->topic;
    for (int i = 1; i <= s.events; ++i) v->bodies.push_back(event_body(s, i));
    log_.info("lab: running",
              {{"scenario", s.name}, {"variant", safe ? "safe" : "unsafe"}, {"real_nsqd", v->real}});

    co_await prepare(*v);
    co_await publish(*v);
    configure_consumer(*v);
    if (safe)
        v->pipeline =
            std::make_unique<billing::pipeline>(pipeline_config_for(v.get()), *ledger_, *stripe_, log_);
    start_consumer(v.get(), log_);
    co_await drive(*v);
    co_await wind_down(*v);
    co_return co_await count(*v);
}

// Fresh state for one run: fake-stripe reset with the scenario's faults, the ledger emptied, the broker(s)
// started with the topic and channel created.
net::awaitable<void> lab::prepare(variant_run& v) {
    const auto& s = *v.sc;
    if (auto r = co_await admin("POST", "/_admin/reset", ""); !r)
        throw std::runtime_error(r.err().describe());
    std::string faults = "latency_ms=" + std::to_string(s.stripe_latency_ms) +
                         "&fail_after_create=" + std::to_string(s.fail_after_create);
    if (auto r = co_await admin("POST", "/_admin/faults", faults); !r)
        throw std::runtime_error(r.err().describe());
    co_await sql("TRUNCATE billing_records, dead_letters");
    for (int i = 0; i < (v.two_brokers ? 2 : 1); ++i) {
        auto b = co_await start_broker(v.real, v.data_dir);
        if (!b) throw std::runtime_error("broker: " + b.err().describe());
        v.brokers.push_back(std::move(*b));
    }
    for (auto& b : v.brokers) {
        auto t = co_await http_call(*b->http, "POST", "/topic/create?topic=" + v.topic, "");
        if (!t) throw std::runtime_error("topic/create: " + t.err().describe());
        auto r = co_await http_call(*b->http, "POST",
                                    "/channel/create?topic=" + v.topic + "&channel=" + channel_name, "");
        if (!r) throw std::runtime_error("channel/create: " + r.err().describe());
    }
    // A real nsqd scans a new channel for timeouts only from its next 5 s refresh: start after it.
    if (v.real && s.stripe_latency_ms > opts_.msg_timeout.count()) {
        auto ready_at = v.brokers[0]->started + 5500ms;
        if (sclock::now() < ready_at)
            co_await sleep_for(std::chrono::duration_cast<milliseconds>(ready_at - sclock::now()));
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
    // Short delays so the whole table runs in minutes.
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
        for (auto& b : v.brokers)
            v.timeouts += static_cast<std::uint64_t>((co_await stats_of(*b, v.topic)).timeouts);
        auto old = std::move(v.brokers[0]);
        v.brokers.clear();
        co_await stop_broker(std::move(old));
        auto b = co_await start_broker(true, v.data_dir);
        if (!b) throw std::runtime_error("broker restart: " + b.err().describe());
        v.brokers.push_back(std::move(*b));
    }
    start_consumer(&v, log_);
}

net::awaitable<void> lab::channel_op(variant_run& v, std::string op) {
    auto r = co_await http_call(*v.brokers[0]->http, "POST",
                                "/channel/" + op + "?topic=" + v.topic + "&channel=" + channel_name, "");
    if (!r) throw std::runtime_error("channel/" + op + ": " + r.err().describe());
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
        co_await sleep_for(100ms);
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
    for (auto& b : v.brokers)
        v.timeouts += static_cast<std::uint64_t>((co_await stats_of(*b, v.topic)).timeouts);
    for (auto& b : v.brokers) co_await stop_broker(std::move(b));
    v.brokers.clear();
    for (auto until = sclock::now() + 30s; v.running > 0 && sclock::now() < until;) co_await sleep_for(20ms);
    if (v.running > 0) throw std::runtime_error("handlers still running after the run ended");
}

// The row: the consumers' and nsqd's counts, and what fake-stripe holds — succeeded charges per customer, and
// POSTs per idempotency key the run used.
net::awaitable<row> lab::count(variant_run& v) {
    const auto& s = *v.sc;
    row out;
    out.scenario = s.name;
    out.variant = v.safe ? "safe" : "unsafe";
    out.deliveries = v.received;
    out.fin_failed = v.fin_failed;
    out.disconnects = v.disconnects;
    out.nsqd_timeouts = v.timeouts;
    auto charges = co_await admin("GET", "/_admin/charges", "");
    if (!charges) throw std::runtime_error(charges.err().describe());
    std::map<std::string, std::uint64_t> per_customer;
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    simdjson::dom::array data;
    if (p.parse(*charges).get(doc) || doc["data"].get(data))
        throw std::runtime_error("fake-stripe /_admin/charges: unexpected JSON");
    for (auto c : data) {
        std::string_view status, customer;
        if (c["status"].get(status) || status != "succeeded" || c["customer"].get(customer)) continue;
        ++per_customer[std::string(customer)];
        ++out.charges_created;
    }
    for (int i = 1; i <= s.events; ++i) {
        auto n = per_customer[stripe_customer(i)];
        if (n == 0) ++out.customers_uncharged;
        if (n > 1) out.duplicate_charges += n - 1;
    }
    std::set<std::string> keys = v.keys;
    if (v.safe)  // the pipeline's keys: the content key and its later generations
        for (int i = 1; i <= s.events; ++i) {
            auto base = billing::base_key(key_namespace, "cust-" + std::to_string(i), billing_period);
            for (int g = 1; g <= 5; ++g) keys.insert(billing::stripe_idempotency_key(base, g));
        }
    for (const auto& k : keys) {
        auto r = co_await admin("GET", "/_admin/posts?key=" + http::url_encode(k), "");
        simdjson::dom::parser pp;
        simdjson::dom::element d;
        std::int64_t n = 0;
        if (!r || pp.parse(*r).get(d) || d["count"].get(n))
            throw std::runtime_error("fake-stripe /_admin/posts: " + (r ? *r : r.err().describe()));
        out.stripe_posts += static_cast<std::uint64_t>(n);
    }
    co_return out;
}

}  // namespace cg::lab
