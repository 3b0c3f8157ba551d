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
#include "http/server.hpp"
#include "lab/keys.hpp"
#include "metrics/registry.hpp"
#include "nsq/connection.hpp"
#include "nsq/consumer.hpp"
#include "pg/migrations.hpp"
#include "pg/pool.hpp"
#include "stripe/client.hpp"
#include "vault/cap.hpp"
#include "vault/policy.hpp"
#include "vault/proxy.hpp"
#include "vault/secret.hpp"
#include "vault/store.hpp"

namespace cg::lab {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using sclock = std::chrono::steady_clock;

namespace {

const std::string key_namespace = "lab";
const std::string channel_name = "lab";
const std::string billing_period = "2026-11";
constexpr auto stripe_day = std::chrono::hours(25);  // past Stripe's 24 h idempotency window

// A step the run cannot go on without: its value, or an exception that ends the lab saying what and why.
template <typename T>
T need(result<T> r, const std::string& what) {
    if (!r) throw std::runtime_error(what + ": " + r.err().describe());
    return std::move(*r);
}
void need(result<void> r, const std::string& what) {
    if (!r) throw std::runtime_error(what + ": " + r.err().describe());
}

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

// The lab's Stripe clients: to fake-stripe with the "real" key, or to the vault proxy with a vault key.
stripe::client_config stripe_config(std::string base, std::string key, std::string ca_file) {
    stripe::client_config sc;
    sc.api_base = std::move(base);
    sc.api_key = std::move(key);
    sc.ca_file = std::move(ca_file);
    sc.request_timeout = 10s;
    sc.connect_timeout = 2s;
    sc.retry = {2, 50ms, 200ms};
    sc.max_connections = 32;
    return sc;
}

const std::string stripe_key = "sk_test_chargeguard_lab";

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

// The body of a 200 answer from nsqd's or fake-stripe's HTTP API; anything else is an error.
result<std::string> body_of(http::client_result res) {
    if (!res.ok()) return res.err;
    if (res.resp.status != 200)
        return error(std::make_error_code(std::errc::protocol_error),
                     "HTTP " + std::to_string(res.resp.status) + ": " + res.resp.body);
    return std::move(res.resp.body);
}

net::awaitable<result<std::string>> http_call(http::client& c, std::string method, std::string target,
                                              std::string body) {
    http::request r;
    r.method = std::move(method);
    r.target = std::move(target);
    r.body = std::move(body);
    co_return body_of(co_await c.request(std::move(r)));
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

// The vault proxy of one run, as `chargeguard proxy` runs it, and the key it was issued. Members are
// destroyed in reverse: the caller's client, the listener, the proxy, then what the proxy refers to.
struct lab::vault_run {
    std::shared_ptr<pg::pool> pool;
    metrics::registry reg;
    std::unique_ptr<vault::proxy> proxy;
    std::unique_ptr<http::server> server;
    std::unique_ptr<stripe::client> client;  // the consumer's: the vault secret as its Stripe key
    std::string key_id;
    row::vault_figures fig;
};

struct lab::variant_run {
    variant_run(lab* l, const scenario* s, bool sf, asio::any_io_executor ex)
        : L(l), sc(s), safe(sf), park(ex, sclock::time_point::max()) {}
    ~variant_run() = default;

    lab* L;
    const scenario* sc;
    bool safe;
    stripe::client* stripe = nullptr;  // fake-stripe, or the vault proxy (vault set)
    std::unique_ptr<vault_run> vault;
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

// The unsafe consumers' charge under `key`; the key is remembered so the count can ask fake-stripe how many
// POSTs it saw under it.
stripe::charge_request charge_for(run_t* v, const billing::billing_event& ev, std::string key) {
    v->keys.insert(key);
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

// What the unsafe consumers know about one delivery when they build a key.
key_inputs inputs_for(run_t* v, const nsq::message& m, const billing::billing_event& ev) {
    key_inputs in;
    in.key_namespace = key_namespace;
    in.customer_id = ev.customer_id;
    in.billing_period = ev.billing_period;
    in.attempts = m.attempts();
    in.connection_uuid = v->conn_uuid;
    in.nsqd_address = m.conn() ? m.conn()->key() : std::string();
    in.call_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
    in.message_id = std::string(m.id());
    return in;
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
    stripe::charge_outcome out;
    {
        nsq::keepalive alive(m);
        out = co_await v->stripe->create_charge(
            charge_for(v, ev, make_key(v->sc->unsafe_key, inputs_for(v, m, ev))));
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
    auto key = make_key(v->sc->unsafe_key, inputs_for(v, m, *ev));
    stripe::charge_outcome out;
    if (v->sc->call == unsafe_call::blocking) {
        // pynsq's IOLoop failure: the handler waits for Stripe on the loop's own thread, so nothing else on
        // the main loop runs — no heartbeat answer, no FIN of the messages already done, no reads.
        auto f =
            asio::co_spawn(v->L->offload().get_executor(),
                           v->stripe->create_charge(charge_for(v, *ev, std::move(key))), asio::use_future);
        out = f.get();
    } else {
        out = co_await v->stripe->create_charge(charge_for(v, *ev, std::move(key)));
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

// The pipeline's verdict on one delivery (or, past max attempts, its give-up), the message TOUCHed
// throughout, as `consume` runs it.
net::awaitable<billing::verdict> pipeline_verdict(run_t* v, nsq::message& m, bool give_up) {
    nsq::keepalive alive(m);
    if (give_up) co_return co_await v->pipeline->give_up(delivery_of(v, m), [&m] { m.touch(); });
    co_return co_await v->pipeline->handle(delivery_of(v, m), [&m] { m.touch(); });
}

// The safe consumer: what `chargeguard consume` runs — the pipeline, with the message TOUCHed throughout.
net::awaitable<nsq::disposition> safe_handle(run_t* v, nsq::message& m) {
    running_guard g(v);
    auto verdict = co_await pipeline_verdict(v, m, false);
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
    co_return to_disposition(co_await pipeline_verdict(v, m, true));
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
    c.new_key_quiet = 1s;  // two renewal intervals
    c.postgres_backoff = {100ms, 1s};
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

// nsqd's timeout counts for the run's topic, added up before a broker goes away.
net::awaitable<void> add_timeouts(run_t& v) {
    for (auto& b : v.brokers)
        v.timeouts += static_cast<std::uint64_t>((co_await stats_of(*b, v.topic)).timeouts);
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
    stripe_base_ = "https://" + line.substr(at + 1);

    auto sc = stripe_config(stripe_base_, stripe_key, opts_.certs_dir + "/ca.pem");
    auto cl = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!cl) co_return cl.err();
    stripe_ = std::move(*cl);
    sc.retry = {0, 50ms, 50ms};
    auto ad = stripe::client::create(offload_.get_executor(), sc, log_);
    if (!ad) co_return ad.err();
    admin_ = std::move(*ad);

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
    if (stripe_proc_.pid() > 0)
        co_await net::offload(offload_.get_executor(), stop_child(std::move(stripe_proc_), SIGTERM));
}

net::awaitable<result<std::string>> lab::admin(std::string method, std::string target, std::string body) {
    auto r = co_await admin_->call(std::move(method), std::move(target), std::move(body),
                                   "lab-admin-" + std::to_string(++seq_));
    co_return body_of(std::move(r.http));
}

net::awaitable<void> lab::advance_stripe_clock(std::chrono::seconds by) {
    need(co_await admin("POST", "/_admin/clock", "advance_s=" + std::to_string(by.count())),
         "cannot move fake-stripe's clock");
}

net::awaitable<pg::rows> lab::sql(std::string statement) {
    auto c = need(co_await pool_->acquire(), "postgres");
    co_return need(co_await c->query_with(statement, pg::params(), 10s), "postgres");
}

net::awaitable<result<std::unique_ptr<lab::broker>>> lab::start_broker(bool real, std::string data_dir) {
    auto b = std::make_unique<broker>();
    b->real = real;
    b->data_dir = data_dir;
    std::string line;
    std::vector<std::string> argv;
    std::string err_log = opts_.work_dir + (real ? "/nsqd.log" : "/fake-nsqd.log");
    if (real) {
        auto tp = free_port();
        auto hp = free_port();
        if (!tp || !hp) co_return error(std::make_error_code(std::errc::address_in_use), "no free port");
        b->tcp_address = "127.0.0.1:" + std::to_string(*tp);
        b->http_address = "127.0.0.1:" + std::to_string(*hp);
        std::filesystem::create_directories(data_dir);
        argv = {opts_.nsqd_bin,
                "--tcp-address=" + b->tcp_address,
                "--http-address=" + b->http_address,
                "--data-path=" + data_dir,
                "--msg-timeout=" + std::to_string(opts_.msg_timeout.count()) + "ms",
                "--broadcast-address=127.0.0.1",
                "--log-level=warn"};
    } else {
        // fake-nsqd picks its ports and says which on its first line.
        argv = {opts_.fake_nsqd_bin, "--msg-timeout-ms", std::to_string(opts_.msg_timeout.count())};
    }
    auto p = co_await net::offload(offload_.get_executor(),
                                   spawn_and_wait_line(argv, err_log, real ? nullptr : &line));
    if (!p) co_return error(std::make_error_code(std::errc::no_such_process), "did not start: " + argv[0]);
    b->proc = std::move(*p);
    if (!real) {
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
    log_.info("lab: running",
              {{"scenario", s.name}, {"variant", std::string(name_of(which))}, {"real_nsqd", v->real}});

    co_await prepare(*v);
    if (s.spend_cap && which != variant::unsafe) co_await start_vault(*v);
    std::exception_ptr failed;
    try {
        co_await publish(*v);
        configure_consumer(*v);
        if (safe)
            v->pipeline =
                std::make_unique<billing::pipeline>(pipeline_config_for(v.get()), *ledger_, *v->stripe, log_);
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
    co_await sql("TRUNCATE billing_records, dead_letters, vault_audit, vault_spend, vault_keys");
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
            co_await sleep_for(std::chrono::duration_cast<milliseconds>(ready_at - sclock::now()));
    }
}

// The vault for one run: a key for the period capped at floor(expected × 1.10), expected summed over the
// run's events as `vault issue --expected-file` sums the billing run; the proxy (its own pool, as a separate
// `chargeguard proxy` process would have) listening on loopback with fake-stripe as its upstream; and the
// consumer's Stripe client pointed at it with the vault secret as its key.
net::awaitable<void> lab::start_vault(variant_run& v) {
    auto vr = std::make_unique<vault_run>();
    for (const auto& body : v.bodies)
        if (auto ev = billing::parse_event(body); ev && ev->billing_period == billing_period)
            vr->fig.expected_cents += ev->amount_cents;
    vr->fig.cap_cents = need(
        vault::cap_for(vr->fig.expected_cents, need(vault::parse_headroom("1.10"), "headroom")), "vault cap");

    vr->pool = make_pool();
    auto secret = need(vault::issue_secret(), "vault secret");
    vault::new_key k;
    k.id = secret.id;
    k.name = "lab " + v.topic;
    k.secret_hash = secret.hash;
    k.billing_period = billing_period;
    k.cap_cents = vr->fig.cap_cents;
    k.currency = "usd";
    k.allowed = *vault::parse_allow_list(vault::default_allow);
    vault::store store(vr->pool);
    need(co_await store.insert_key(std::move(k)), "vault issue");
    vr->key_id = secret.id;

    vault::proxy_config pc;
    pc.upstream = stripe_base_;
    pc.upstream_key = stripe_key;
    pc.ca_file = opts_.certs_dir + "/ca.pem";
    pc.request_timeout = 10s;
    pc.connect_timeout = 2s;
    vr->proxy = need(vault::proxy::create(io_.get_executor(), offload_.get_executor(), std::move(pc),
                                          vr->pool, log_, vr->reg),
                     "vault proxy");
    http::server_options so;
    so.limits.max_body_bytes = 1024 * 1024;
    vr->server = std::make_unique<http::server>(io_.get_executor(), vr->proxy->routes(), std::move(so), log_);
    auto ep = need(vr->server->listen(net::host_port{"127.0.0.1", 0}), "vault proxy listen");
    vr->client = need(stripe::client::create(offload_.get_executor(),
                                             stripe_config("http://127.0.0.1:" + std::to_string(ep.port()),
                                                           secret.secret, opts_.certs_dir + "/ca.pem"),
                                             log_),
                      "stripe client for the vault proxy");
    // Nothing can fail from here on: once started, the proxy is stopped by stop_vault().
    vr->server->start();
    vr->proxy->start();
    v.stripe = vr->client.get();
    v.vault = std::move(vr);
}

// After the run: the listener closed, the proxy's audit rows written, its pool closed.
net::awaitable<void> lab::stop_vault(variant_run& v) {
    v.stripe = stripe_.get();
    v.vault->server->stop();
    co_await v.vault->proxy->stop();
    co_await v.vault->pool->close();
}

// The proxy's own account of the run (one audit row per request): creating POSTs, refused at the cap (never
// forwarded), sent on to Stripe.
net::awaitable<row::vault_figures> lab::vault_count(variant_run& v, std::int64_t charged_cents) {
    auto fig = v.vault->fig;
    fig.charged_cents = charged_cents;
    auto r = co_await sql(
        "SELECT count(*), count(*) FILTER (WHERE outcome = 'cap_exceeded'), "
        "count(*) FILTER (WHERE upstream_status IS NOT NULL) FROM vault_audit WHERE method = 'POST' AND "
        "vault_key_id = '" +
        v.vault->key_id + "'");
    fig.posts = std::stoull(std::string(r.text(0, 0)));
    fig.refused = std::stoull(std::string(r.text(0, 1)));
    fig.forwarded = std::stoull(std::string(r.text(0, 2)));
    co_return fig;
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
    co_await add_timeouts(v);
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
    std::int64_t charged_cents = 0;
    for (auto c : data) {
        std::string_view status, customer;
        std::int64_t amount = 0;
        if (c["status"].get(status) || status != "succeeded" || c["customer"].get(customer) ||
            c["amount"].get(amount))
            continue;
        ++per_customer[std::string(customer)];
        ++out.charges_created;
        charged_cents += amount;
    }
    if (v.vault) out.vault = co_await vault_count(v, charged_cents);
    out.variant = variant_label(v.safe ? "safe" : "unsafe", out.vault);
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
