// `chargeguard webhooks`: the Stripe webhook receiver (docs/operating/webhooks.md). Its own process, not a
// listener inside `consume`: a flood of Stripe retries, or a bad deploy of the receiver, never touches the
// sidecar's event loop or its charges, and the endpoint can face the internet (behind TLS, here or at a
// proxy) while the sidecar's health port stays private. /healthz, /readyz (postgres) and /metrics on
// --health-listen.
//
// Secrets: --webhook-secret-file (one or two lines: the current endpoint secret, then the previous one
// during a rotation) or CHARGEGUARD_WEBHOOK_SECRET (the same format); never argv.
// Executors: the listener, the handler and the PostgreSQL pool all run on the runtime's main io_context.
// SIGTERM: the listener stops, the pool closes, exit 0.
//
// --retry-declined-on-payment-method-change (off by default): an event saying a customer's payment method
// changed retries that customer's declined rows (app/webhook_receiver.hpp), so this process then also
// needs the Stripe key (an open PaymentIntent of the decline is cancelled first, as retry-declined does)
// and nsqd (the retried event is published to --topic for `consume` to charge). Without the flag neither
// is read nor reached. The Stripe client's HTTPS work runs on the offload pool, never on the event loop.
#include <malloc.h>

#include <algorithm>
#include <memory>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/listener_flags.hpp"
#include "app/nsq_flags.hpp"
#include "app/pg_flags.hpp"
#include "app/runtime.hpp"
#include "app/schema_gate.hpp"
#include "app/stripe_flags.hpp"
#include "app/webhook_receiver.hpp"
#include "http/server.hpp"
#include "net/address.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"
#include "stripe/client.hpp"

namespace cg::app {
namespace {

struct webhooks_flags {
    std::string listen = "127.0.0.1:8440";
    std::string path = "/stripe/webhooks";
    std::string secret_file;
    std::string secret_in_argv;  // never used: --webhook-secret is refused (see register_webhooks)
    std::string tolerance = "5m";
    std::size_t max_body_bytes = 256 * 1024;
    std::size_t max_buffered_bytes = 64 * 1024 * 1024;
    std::size_t max_in_flight = 64;
    listener_flags listener;
    pg_flags pg;
    runtime_flags rt;
    bool retry_declined = false;
    std::string nsqd_tcp_address, topic = "billing";
    stripe_flags stripe;
};

// One or two secrets, one a line (surrounding whitespace and blank lines ignored), each `whsec_…`.
std::vector<std::string> parse_webhook_secrets(const std::string& source, std::string_view text) {
    std::vector<std::string> out;
    std::size_t pos = 0;
    while (pos <= text.size()) {
        auto nl = text.find('\n', pos);
        auto line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
        pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
        while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
        while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
        if (line.empty()) continue;
        if (!line.starts_with("whsec_") || line.size() < 10)
            throw config_error(source + ": line " + std::to_string(out.size() + 1) +
                               " is not a Stripe endpoint secret (whsec_…)");
        out.emplace_back(line);
    }
    if (out.empty()) throw config_error(source + ": no webhook secret");
    if (out.size() > 2)
        throw config_error(source + ": at most two secrets (the current one, then the previous one)");
    return out;
}

webhook_receiver_config to_receiver_config(const webhooks_flags& f) {
    webhook_receiver_config c;
    if (f.path.empty() || f.path.front() != '/') throw usage_error("--path must start with '/'");
    c.path = f.path;
    const char* env_secret = std::getenv("CHARGEGUARD_WEBHOOK_SECRET");
    if (!f.secret_file.empty())
        c.secrets =
            parse_webhook_secrets(looks_like_secret(f.secret_file) ? std::string("--webhook-secret-file")
                                                                   : "--webhook-secret-file " + f.secret_file,
                                  read_secret_file("--webhook-secret-file", f.secret_file));
    else if (env_secret && *env_secret)
        c.secrets = parse_webhook_secrets("CHARGEGUARD_WEBHOOK_SECRET", env_secret);
    else
        throw usage_error(
            "a webhook secret is required: --webhook-secret-file or CHARGEGUARD_WEBHOOK_SECRET");
    auto tol = duration_flag("--tolerance", f.tolerance);
    if (tol < std::chrono::seconds(1) || tol > std::chrono::hours(24))
        bad_value("--tolerance", f.tolerance, "must be between 1s and 24h");
    c.tolerance = std::chrono::duration_cast<std::chrono::seconds>(tol);
    c.max_body_bytes = f.max_body_bytes;
    c.max_in_flight = f.max_in_flight;
    return c;
}

net::awaitable<void> stop_receiving(http::server* server) {
    server->stop();
    co_return;
}

int run_webhooks(const webhooks_flags& f, const global_flags& g) {
    auto cfg = to_receiver_config(f);
    // Request bodies of 64 KiB and more get pages of their own, given back to the kernel when freed, and
    // resident only as far as they were written: glibc's default (a threshold that rises as large blocks
    // are freed) would keep a flood's freed bodies in the heap, and the RSS far above what
    // --max-buffered-bytes holds at any one time.
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    // The receiver answers bodies over --max-body-bytes with a counted 413.
    auto sopts = to_listener_options(f.listener, f.max_body_bytes, "chargeguard-webhooks");
    // The listener's memory bound, whatever clients send (docs/operating/webhooks.md has the figures).
    sopts.max_buffered_bytes = std::max(f.max_buffered_bytes, 4 * f.max_body_bytes);
    auto [listen, opts, ms, log] = prepare_listener_service(f.listen, f.rt, f.pg, g.level());
    effective_config settings("webhooks");
    settings.add("listen", f.listen)
        .add("path", cfg.path)
        .add("tls", !f.listener.tls_cert.empty())
        .add("secrets", static_cast<std::int64_t>(cfg.secrets.size()))
        .add("secret_from", f.secret_file.empty() ? "CHARGEGUARD_WEBHOOK_SECRET" : "--webhook-secret-file")
        .add("tolerance_s", static_cast<std::int64_t>(cfg.tolerance.count()))
        .add("max_body_bytes", cfg.max_body_bytes)
        .add("max_buffered_bytes", sopts.max_buffered_bytes)
        .add("max_in_flight", cfg.max_in_flight)
        .add("api_version", cfg.api_version)
        .add_address("pg", to_pg_config(f.pg).describe());
    add_runtime_settings(settings, f.rt, opts);
    settings.log(log, "webhooks starting");

    runtime rt(opts, log);
    rt.set_effective_config(settings);
    auto pool = start_pool(rt, f.pg);
    rt.startup().require("postgres", "PostgreSQL (first connection)");
    schema_gate gate(rt, pool, ms);
    webhook_receiver receiver(std::move(cfg), pool, log, rt.metrics());
    std::unique_ptr<stripe::client> stripe;
    std::unique_ptr<nsq::producer> producer;
    if (f.retry_declined) {
        auto c = stripe::client::create(rt.offload().get_executor(), to_stripe_config(f.stripe), log,
                                        &rt.metrics());
        if (!c) {
            log.error("cannot create the Stripe client", {{"error", c.err().describe()}});
            return 1;
        }
        stripe = std::move(*c);
        producer = std::make_unique<nsq::producer>(rt.io().get_executor(), f.nsqd_tcp_address,
                                                   nsq::producer_config{}, log);
        receiver.retry_declined_with(*producer, *stripe, f.topic);
        log.info("declined rows are retried when a customer's payment method changes",
                 {{"nsqd_tcp_address", f.nsqd_tcp_address}, {"topic", f.topic}});
    }
    sopts.metrics = &rt.metrics();
    sopts.listener = "webhooks";
    http::server server(rt.io().get_executor(), receiver.routes(), std::move(sopts), log);
    auto ep = server.listen(listen);
    if (!ep) {
        log.error("cannot listen", {{"error", ep.err().describe()}});
        return 1;
    }
    rt.on_shutdown([&server]() { return stop_receiving(&server); });
    // After the listener: a delivery still being handled may publish a retried event until then.
    if (producer) rt.on_shutdown([p = producer.get()]() { return p->close(); });
    // PostgreSQL (and --migrate), then the schema gate; only then does the listener accept.
    return rt.start_and_run(
        start_when_ready(&rt, pool.get(), &f.pg, std::move(ms), &gate, [&rt, &server, ep = *ep] {
            server.start();
            rt.log().info("webhook receiver listening",
                          {{"address", ep.address().to_string()}, {"port", ep.port()}});
        }));
}

}  // namespace

void register_webhooks(CLI::App& app, command_main& selected) {
    auto* cmd = add_service_command(
        app, "webhooks", "the Stripe webhook receiver: verifies and records each event once",
        "  chargeguard webhooks --listen 0.0.0.0:8440 --webhook-secret-file /run/secrets/stripe_webhook "
        "--migrate\n"
        "  CHARGEGUARD_WEBHOOK_SECRET=whsec_… chargeguard webhooks --tls-cert hooks.pem --tls-key "
        "hooks.key\n");
    auto f = std::make_shared<webhooks_flags>();
    cmd->add_option("--listen", f->listen, "address Stripe delivers to")->capture_default_str();
    cmd->add_option("--path", f->path, "the endpoint's path (POST only)")->capture_default_str();
    cmd->add_option("--webhook-secret-file", f->secret_file,
                    "file with the endpoint secret (whsec_…), and the previous one on a second line during "
                    "a rotation (else CHARGEGUARD_WEBHOOK_SECRET)");
    // Refused by name, its value never read back: CLI11 would otherwise list the value among the arguments
    // it did not expect. Not mirrored: CHARGEGUARD_WEBHOOK_SECRET is the secret itself (read above).
    auto* in_argv = env(cmd->add_option("--webhook-secret", f->secret_in_argv)->group("")->expected(0, 1),
                        env_scope::never);
    cmd->add_option("--tolerance", f->tolerance,
                    "refuse deliveries signed longer ago (or further ahead) than this; 1s to 24h")
        ->capture_default_str();
    cmd->add_option("--max-body-bytes", f->max_body_bytes, "largest event body accepted (larger: 413)")
        ->check(CLI::Range(std::size_t{1024}, std::size_t{16 * 1024 * 1024}))
        ->capture_default_str();
    cmd->add_option("--max-buffered-bytes", f->max_buffered_bytes,
                    "bytes of requests read and not yet answered across every connection; a read over it "
                    "is answered 503 and its connection closed (at least 4 x --max-body-bytes)")
        ->check(CLI::Range(std::size_t{1024 * 1024}, std::size_t{4096} * 1024 * 1024))
        ->capture_default_str();
    cmd->add_option("--max-in-flight", f->max_in_flight,
                    "deliveries being recorded at once; beyond, 503 with Retry-After (Stripe retries)")
        ->check(CLI::Range(std::size_t{1}, std::size_t{4096}))
        ->capture_default_str();
    cmd->add_flag("--retry-declined-on-payment-method-change", f->retry_declined,
                  "when Stripe says a customer's payment method changed (payment_method.attached, or "
                  "customer.updated with a new invoice_settings.default_payment_method), retry that "
                  "customer's declined keys as retry-declined does (needs --nsqd-tcp-address and the Stripe "
                  "key)");
    cmd->add_option("--nsqd-tcp-address", f->nsqd_tcp_address,
                    "nsqd TCP address host:port the retried events are published to (with "
                    "--retry-declined-on-payment-method-change)");
    cmd->add_option("--topic", f->topic,
                    "the topic consume reads (with --retry-declined-on-payment-method-change)")
        ->capture_default_str();
    add_stripe_flags(*cmd, f->stripe);
    add_listener_flags(*cmd, f->listener);
    add_pg_flags(*cmd, f->pg, true);
    add_runtime_flags(*cmd, f->rt);
    cmd->callback([&selected, f, in_argv] {
        if (in_argv->count() > 0)
            throw usage_error(
                "--webhook-secret is not accepted: a secret on the command line is visible to every local "
                "user; use --webhook-secret-file or CHARGEGUARD_WEBHOOK_SECRET");
        if (f->retry_declined) {
            if (f->nsqd_tcp_address.empty())
                throw usage_error("--retry-declined-on-payment-method-change needs --nsqd-tcp-address");
            if (auto hp = net::parse_host_port(f->nsqd_tcp_address); !hp)
                bad_value("--nsqd-tcp-address", f->nsqd_tcp_address, hp.err().code.message());
            if (!nsq::proto::valid_topic_name(f->topic))
                bad_value("--topic", f->topic, "not a valid topic name");
            (void)to_stripe_config(f->stripe);  // reads and checks the key before anything starts
        }
        selected = [f](const global_flags& g) { return run_webhooks(*f, g); };
    });
}

}  // namespace cg::app
