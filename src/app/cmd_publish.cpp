// `chargeguard publish --nsqd-tcp-address ADDR --topic T FILE|-`: publishes JSONL billing events (one
// per line) with MPUB in batches. A progress bar (count and rate) on a terminal; plain log lines
// otherwise. Input is read on the offload pool so a slow stdin never stalls heartbeats.
#include <fcntl.h>
#include <simdjson.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/nsq_flags.hpp"
#include "billing/machine/event.hpp"
#include "net/offload.hpp"
#include "net/timeout.hpp"
#include "nsq/producer.hpp"
#include "nsq/proto/commands.hpp"
#include "nsq/proto/error.hpp"

namespace cg::app {
namespace {

using namespace std::chrono;

struct publish_flags {
    nsq_security_flags security;
    std::string nsqd_tcp_address;
    std::string topic;
    std::string file;
    std::size_t batch_size = 500;
    std::size_t batch_bytes = 1024 * 1024;
    unsigned retries = 5;
    bool no_validate = false;
};

// Checks one input line before it is published. With validation (the default) a line must be a billing
// event `consume` will accept; otherwise any JSON object passes (to exercise the dead-letter path).
// Returns the reason a line is refused, or an empty string.
std::string check_line(const std::string& line, bool validate, simdjson::dom::parser& parser) {
    if (validate) {
        auto ev = billing::parse_event(line);
        return ev ? std::string() : ev.err().message.empty() ? ev.err().describe() : ev.err().message;
    }
    simdjson::dom::element doc;
    if (parser.parse(line).get(doc) != simdjson::SUCCESS || !doc.is_object()) return "not a JSON object";
    return {};
}

// Blocking read of up to 64 KiB; runs on the offload pool. Empty string at EOF; throws on error.
asio::awaitable<std::string> read_chunk(int fd) {
    std::string buf(64 * 1024, '\0');
    for (;;) {
        auto n = ::read(fd, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw std::runtime_error(std::string("read: ") + std::strerror(errno));
        buf.resize(static_cast<std::size_t>(n));
        co_return buf;
    }
}

class progress {
  public:
    explicit progress(logger log)
        : log_(std::move(log)), tty_(::isatty(STDERR_FILENO) == 1), t0_(steady_clock::now()) {}

    void update(std::uint64_t published, bool final = false) {
        auto now = steady_clock::now();
        if (!final && now - last_ < milliseconds(tty_ ? 200 : 1000)) return;
        last_ = now;
        double secs = std::max(1e-3, duration<double>(now - t0_).count());
        double rate = static_cast<double>(published) / secs;
        if (tty_) {
            // A bar that fills once per 10 000 events (the total is unknown on a stream).
            int fill = static_cast<int>((published % 10000) * 30 / 10000);
            std::string bar(static_cast<std::size_t>(fill), '#');
            bar.resize(30, '.');
            std::fprintf(stderr, "\r[%s] %llu events  %.0f/s%s", bar.c_str(),
                         static_cast<unsigned long long>(published), rate, final ? "\n" : "");
        } else {
            log_.info(final ? "publish finished" : "publishing",
                      {{"published", published}, {"per_second", rate}});
        }
    }

  private:
    logger log_;
    bool tty_;
    steady_clock::time_point t0_, last_{};
};

struct publish_state {
    publish_flags f;
    logger log;
    net::offload_pool* pool;
    nsq::producer* producer;
    std::uint64_t published = 0, line_no = 0;
    bool stop = false;
    int exit_code = 0;
};

asio::awaitable<bool> send_batch(publish_state& st, std::vector<std::string>& batch, progress& prog) {
    if (batch.empty()) co_return true;
    for (unsigned attempt = 1;; ++attempt) {
        auto r = co_await st.producer->multi_publish(st.f.topic, batch);
        if (r) break;
        bool retryable = r.code() != nsq::errc::server_error && r.code() != nsq::errc::bad_name &&
                         r.code() != nsq::errc::invalid_publish;  // refused before sending: it never will be
        if (!retryable || attempt > st.f.retries) {
            st.log.error("MPUB failed", {{"error", r.err().describe()}, {"published", st.published}});
            co_return false;
        }
        st.log.warn("MPUB failed; retrying", {{"error", r.err().describe()}, {"attempt", attempt}});
        co_await net::sleep_for(milliseconds(200) * attempt);
    }
    st.published += batch.size();
    batch.clear();
    prog.update(st.published);
    co_return true;
}

asio::awaitable<void> publish_all(publish_state& st) {
    int fd = STDIN_FILENO;
    if (st.f.file != "-") {
        fd = ::open(st.f.file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            st.log.error("cannot open input", {{"file", st.f.file}, {"error", std::strerror(errno)}});
            st.exit_code = 1;
            co_return;
        }
    }
    progress prog(st.log);
    std::vector<std::string> batch;
    std::size_t batch_bytes = 0;
    std::string pending;
    simdjson::dom::parser parser;
    bool eof = false;
    while (!eof && !st.stop) {
        auto chunk = co_await net::offload(st.pool->get_executor(), read_chunk(fd));
        eof = chunk.empty();
        pending += chunk;
        std::size_t pos = 0;
        for (;;) {
            auto nl = pending.find('\n', pos);
            if (nl == std::string::npos && !eof) break;
            std::string line = pending.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
            pos = nl == std::string::npos ? pending.size() : nl + 1;
            ++st.line_no;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.find_first_not_of(" \t") == std::string::npos) {
                if (nl == std::string::npos) break;
                continue;
            }
            if (auto why = check_line(line, !st.f.no_validate, parser); !why.empty()) {
                // Earlier batches are already out; publishing them again after fixing the file is harmless,
                // since charges are keyed on each event's content.
                st.log.error("input line refused; stopping",
                             {{"line", st.line_no}, {"reason", why}, {"published", st.published}});
                st.exit_code = 1;
                co_await st.producer->close();  // a connected producer keeps the loop (and the process) alive
                co_return;
            }
            batch_bytes += line.size();
            batch.push_back(std::move(line));
            if (batch.size() >= st.f.batch_size || batch_bytes >= st.f.batch_bytes) {
                if (!co_await send_batch(st, batch, prog)) {
                    st.exit_code = 1;
                    co_await st.producer->close();
                    co_return;
                }
                batch_bytes = 0;
            }
            if (nl == std::string::npos) break;
        }
        pending.erase(0, pos);
    }
    if (!co_await send_batch(st, batch, prog)) st.exit_code = 1;
    if (fd != STDIN_FILENO) ::close(fd);
    prog.update(st.published, true);
    co_await st.producer->close();
}

int run_publish(const publish_flags& f, const global_flags& g) {
    if (!nsq::proto::valid_topic_name(f.topic))
        throw CLI::ValidationError("--topic", "'" + f.topic + "' is not a valid topic name");
    if (!net::parse_host_port(f.nsqd_tcp_address))
        throw CLI::ValidationError("--nsqd-tcp-address", "'" + f.nsqd_tcp_address + "' is not host:port");
    nsq::producer_config pcfg;
    pcfg.security = to_nsq_security(f.security, std::getenv("CHARGEGUARD_NSQ_AUTH_SECRET"));
    auto log = make_stderr_logger(g.level());
    asio::io_context io(1);
    net::offload_pool pool(1);
    nsq::producer producer(io.get_executor(), f.nsqd_tcp_address, pcfg, log);
    publish_state st{f, log, &pool, &producer};
    asio::signal_set sigs(io, SIGINT, SIGTERM);
    sigs.async_wait([&](std::error_code ec, int) {
        if (ec) return;
        log.warn("signal: finishing the current batch and stopping");
        st.stop = true;
        st.exit_code = 130;
    });
    asio::co_spawn(io, publish_all(st), [&](std::exception_ptr e) {
        if (e) {
            log.error("publish failed", {{"error", describe_exception(e)}});
            st.exit_code = 1;
        }
        sigs.cancel();
    });
    io.run();
    pool.stop();
    return st.exit_code;
}

}  // namespace

void register_publish(CLI::App& app, command_main& selected) {
    auto* cmd = app.add_subcommand("publish", "publish JSONL billing events to nsqd with MPUB");
    cmd->footer(
        "Examples:\n"
        "  chargeguard publish --nsqd-tcp-address nsqd:4150 --topic billing run-2026-11.jsonl\n"
        "  generate-run | chargeguard publish --nsqd-tcp-address nsqd:4150 --topic billing -\n"
        "The topic comes from the command line only, never from CHARGEGUARD_TOPIC.\n");
    auto f = std::make_shared<publish_flags>();
    env(cmd->add_option("--nsqd-tcp-address", f->nsqd_tcp_address, "nsqd TCP address host:port")
            ->required()
            ->group(group_nsq),
        env_scope::connection);
    // Where events go: the command line only.
    env(cmd->add_option("--topic", f->topic, "NSQ topic")->required()->group(group_nsq), env_scope::never);
    cmd->add_option("--batch-size", f->batch_size, "events per MPUB")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    cmd->add_option("--retries", f->retries, "retries of a failed MPUB (connection errors)")
        ->capture_default_str();
    cmd->add_flag("--no-validate", f->no_validate,
                  "publish any JSON object, not only valid billing events (to exercise dead-lettering)");
    cmd->add_option("FILE", f->file, "JSONL file, one event per line ('-' for stdin)")->required();
    add_nsq_security_flags(*cmd, f->security);
    cmd->callback([&selected, f] { selected = [f](const global_flags& g) { return run_publish(*f, g); }; });
}

}  // namespace cg::app
