// `chargeguard tail`: like nsq_tail — consumes a topic through an ephemeral channel of its own, prints each
// message as one JSON line {"id","attempts","timestamp","body"} on stdout and FINs it. SIGTERM drains (RDY 0,
// in-flight finished, CLS) and exits 0.
//
// What tail FINs is gone from its channel: on a shared channel it would take events from their consumer
// (the sidecar's billing events would never be charged). So --channel comes from the command line only, a
// channel not ending in #ephemeral needs --take-from-channel, and the sidecar's own channel
// (CHARGEGUARD_CHANNEL) is refused outright. --max-messages N takes at most N: max_in_flight is at most N,
// and a message received once N are printed is REQueued at once, never FINed.
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/write.hpp>
#include <csignal>
#include <random>
#include <string>
#include <vector>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/nsq_flags.hpp"
#include "app/runtime.hpp"
#include "net/tokens.hpp"
#include "nsq/consumer.hpp"

namespace cg::app {
namespace {

// Serialises lines to stdout without blocking the loop when stdout is a pipe or a terminal; a regular
// file (which epoll refuses) is written directly — it does not block for long.
class line_writer {
  public:
    explicit line_writer(asio::any_io_executor ex)
        : sd_(ex), idle_(ex, std::chrono::steady_clock::time_point::max()) {
        std::error_code ec;
        sd_.assign(::dup(STDOUT_FILENO), ec);
        async_ = !ec;
        if (ec) {
            std::error_code ignored;
            sd_.close(ignored);
        }
    }

    void write(std::string line) {
        if (!async_) {
            write_blocking(line);
            return;
        }
        buf_ += line;
        if (!writing_) {
            writing_ = true;
            asio::co_spawn(sd_.get_executor(), drain(this), asio::detached);
        }
    }

    // Completes once everything written so far reached stdout.
    asio::awaitable<void> flush() {
        while (writing_) co_await idle_.async_wait(net::nothrow);
    }

    bool broken() const { return broken_; }

  private:
    static asio::awaitable<void> drain(line_writer* self) {
        while (!self->buf_.empty() && !self->broken_) {
            std::swap(self->buf_, self->sending_);
            auto [ec, n] = co_await asio::async_write(self->sd_, asio::buffer(self->sending_), net::nothrow);
            self->sending_.clear();
            if (ec) self->broken_ = true;  // EPIPE: the reader went away
        }
        self->buf_.clear();
        self->writing_ = false;
        self->idle_.cancel();
    }

    void write_blocking(const std::string& s) {
        std::size_t off = 0;
        while (off < s.size() && !broken_) {
            auto n = ::write(STDOUT_FILENO, s.data() + off, s.size() - off);
            if (n < 0) {
                if (errno == EINTR) continue;
                broken_ = true;
                return;
            }
            off += static_cast<std::size_t>(n);
        }
    }

    asio::posix::stream_descriptor sd_;
    net::steady_timer idle_;
    std::string buf_, sending_;
    bool async_ = false, writing_ = false, broken_ = false;
};

std::string json_line(const nsq::message& m) {
    std::string s = "{\"id\":";
    append_json_string(s, m.id());
    s += ",\"attempts\":" + std::to_string(m.attempts()) + ",\"timestamp\":" + std::to_string(m.timestamp()) +
         ",\"body\":";
    append_json_string(s, m.body());
    s += "}\n";
    return s;
}

struct tail_flags {
    nsq_consumer_flags nsq;
    runtime_flags rt;
    std::uint64_t max_messages = 0;
    bool take_from_channel = false;
};

// What the tail handler needs, owned by run_tail's frame (which outlives the consumer and the loop).
struct tail_state {
    runtime& rt;
    line_writer& out;
    std::uint64_t max_messages = 0;
    std::uint64_t printed = 0;
};

// The handler: one JSON line per message, FIN; past --max-messages, REQ without delay (the message goes back
// to its channel untouched). A free coroutine (docs/contributing.md "Coroutine lifetimes": no capturing
// coroutine lambdas).
asio::awaitable<nsq::disposition> tail_message(tail_state* st, nsq::message& m) {
    if (st->max_messages > 0 && st->printed >= st->max_messages)
        co_return nsq::disposition::requeue_without_backoff(std::chrono::milliseconds(0));
    st->out.write(json_line(m));
    if (st->out.broken()) st->rt.request_stop("stdout closed");
    if (st->max_messages > 0 && ++st->printed == st->max_messages)
        st->rt.request_stop("--max-messages reached");
    co_return nsq::disposition::finish();
}

asio::awaitable<void> tail_drain(nsq::consumer* consumer, line_writer* out) {
    co_await consumer->stop();
    co_await out->flush();
}

bool is_ephemeral_channel(const std::string& s) {
    constexpr std::string_view tail = "#ephemeral";
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Refuses a channel tail would take messages from; throws usage_error.
void check_channel(const tail_flags& f) {
    const char* sidecar = std::getenv("CHARGEGUARD_CHANNEL");
    if (sidecar && *sidecar && f.nsq.channel == sidecar)
        throw usage_error("--channel " + f.nsq.channel +
                          ": the sidecar's channel (CHARGEGUARD_CHANNEL); tail would take billing events "
                          "from consume and they would never be charged. Leave --channel out: tail reads "
                          "through an ephemeral channel of its own");
    if (!is_ephemeral_channel(f.nsq.channel) && !f.take_from_channel)
        throw usage_error(
            "--channel " + f.nsq.channel +
            ": not an #ephemeral channel; tail FINs what it prints, taking those messages from "
            "every other consumer of the channel. Give --take-from-channel if that is meant, or "
            "leave --channel out");
}

int run_tail(tail_flags f, const global_flags& g) {
    if (f.nsq.channel.empty()) {
        std::random_device rd;
        f.nsq.channel = "tail" + std::to_string(rd() % 1000000) + "#ephemeral";
    }
    check_channel(f);
    auto cfg = to_consumer_config(f.nsq);  // throws before anything starts
    // Never more in flight than is left to print.
    if (f.max_messages > 0 && cfg.max_in_flight > f.max_messages)
        cfg.max_in_flight = static_cast<unsigned>(f.max_messages);
    // A reader never gives up on a message (the give-up path FINs).
    cfg.max_attempts = 0;
    auto opts = to_runtime_options(f.rt);
    auto log = make_stderr_logger(g.level());
    std::signal(SIGPIPE, SIG_IGN);
    effective_config settings("tail");
    settings.add("topic", cfg.topic)
        .add("channel", cfg.channel)
        .add_address("nsqd_tcp_addresses", cfg.nsqd_tcp_addresses)
        .add_address("lookupd_http_addresses", cfg.lookupd_http_addresses)
        .add("max_in_flight", cfg.max_in_flight)
        .add("msg_timeout_ms", static_cast<std::int64_t>(cfg.msg_timeout.count()))
        .add("max_messages", f.max_messages);
    add_runtime_settings(settings, f.rt, opts);
    runtime rt(opts, log);
    rt.set_effective_config(settings);
    auto ex = rt.io().get_executor();
    line_writer out(ex);
    tail_state st{rt, out, f.max_messages};
    nsq::consumer consumer(
        ex, cfg, [&st](nsq::message& m) { return tail_message(&st, m); }, log, rt.metrics());
    consumer.add_readiness(rt.health());
    rt.on_shutdown([&consumer, &out]() { return tail_drain(&consumer, &out); });
    if (auto ep = rt.start(); !ep) {
        log.error("cannot start", {{"error", ep.err().describe()}});
        return 1;
    }
    if (auto r = consumer.start(); !r) {
        log.error("cannot start the consumer", {{"error", r.err().describe()}});
        return 1;
    }
    return rt.run();
}

}  // namespace

void register_tail(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("tail", "print messages of an NSQ topic as JSON lines (like nsq_tail)");
    cmd->footer(
        "Examples:\n"
        "  chargeguard tail --topic billing --max-messages 10     (an ephemeral channel: takes nothing "
        "away)\n"
        "  chargeguard tail --topic billing --channel debug#ephemeral\n"
        "Only connection settings (addresses, TLS) come from CHARGEGUARD_* variables; --topic and --channel "
        "come from the command line.\n");
    auto f = std::make_shared<tail_flags>();
    add_nsq_consumer_flags(*cmd, f->nsq, false);
    // The channel selects what tail consumes: command line only, whatever the environment says.
    env(cmd->get_option("--channel"), env_scope::never)
        ->description("NSQ channel (default: an #ephemeral one of tail's own)");
    env(cmd->add_flag(
               "--take-from-channel", f->take_from_channel,
               "allow a --channel not ending in #ephemeral: what tail prints is FINed there, taken from "
               "the channel's other consumers")
            ->group(group_nsq),
        env_scope::never);
    add_runtime_flags(*cmd, f->rt);
    cmd->add_option("--max-messages", f->max_messages,
                    "exit after this many messages, taking no more than that (0 = run until SIGTERM)");
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return run_tail(*f, g); }; });
}

}  // namespace cg::app
