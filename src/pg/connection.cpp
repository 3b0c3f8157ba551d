#include "pg/connection.hpp"

#include <libpq-fe.h>
#include <poll.h>
#include <sys/socket.h>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/address.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <variant>

#include "net/resolve.hpp"
#include "pg/cancel.hpp"
#include "pg/stats.hpp"

namespace cg::pg {
namespace {

using clock = std::chrono::steady_clock;

struct finish_deleter {
    void operator()(PGconn* c) const noexcept { PQfinish(c); }
};

void ignore_notice(void*, const char*) {}

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    // libpq's multi-line messages ("…failed: Connection refused\n\tIs the server running…") on one line.
    for (std::size_t p; (p = s.find("\n\t")) != std::string::npos;) s.replace(p, 2, " ");
    for (auto& c : s)
        if (c == '\n') c = ' ';
    return s;
}

clock::time_point deadline_after(clock::duration d) {
    return d <= clock::duration::zero() ? clock::time_point::max() : clock::now() + d;
}

bool looks_like_auth_failure(PGconn* c, std::string_view msg) {
    if (PQconnectionNeedsPassword(c)) return true;
    for (auto needle : {"password authentication failed", "authentication failed", "no password supplied",
                        "no pg_hba.conf entry", "SCRAM"})
        if (msg.find(needle) != std::string_view::npos) return true;
    return false;
}

}  // namespace

struct connection::op {
    clock::time_point deadline;
    bool cancel_sent = false;
};

struct connection::io_ready {
    std::error_code ec;
    bool readable = false;
    bool writable = false;
};

struct connection::attempt {
    std::string host;      // for libpq (messages, TLS name, .pgpass); empty for the default socket
    std::string hostaddr;  // numeric; empty for Unix sockets
    std::string port;
};

connection::connection(asio::any_io_executor ex, asio::any_io_executor offload, connection_options opts,
                       logger log, std::shared_ptr<stats> st)
    : offload_(std::move(offload)),
      sd_(ex),
      timer_(ex),
      opts_(opts),
      log_(std::move(log)),
      stats_(std::move(st)) {}

connection::~connection() {
    if (!conn_) return;
    if (broken_) abort_socket();
    sd_.release();  // libpq owns the fd: PQfinish closes it
    PQsetNoticeProcessor(conn_, ignore_notice, nullptr);
    // PQfinish may block (it writes a Terminate message): run it on the offload pool. If that pool never
    // runs the handler (stopped), destroying the handler still finishes the connection.
    asio::post(offload_, [c = std::unique_ptr<PGconn, finish_deleter>(conn_)]() mutable { c.reset(); });
    conn_ = nullptr;
}

// A connection dropped mid-operation (timed out, cancelled, lost) may still hold an unsent or unacknowledged
// statement in the kernel's send queue; an ordinary close keeps retransmitting it, so after a partition heals
// the server would still receive and run a statement we reported as failed. SO_LINGER 0 makes the close that
// PQfinish does abortive (RST, queue discarded). Set here, on the caller's thread and at once, so it holds
// however late the offload pool runs PQfinish.
void connection::abort_socket() noexcept {
    int fd = PQsocket(conn_);
    if (fd < 0) return;
    ::linger l{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
}

// ---- connecting -------------------------------------------------------------------------------------

net::awaitable<result<std::vector<connection::attempt>>> connection::plan_attempts(const config& cfg) {
    std::vector<attempt> out;
    std::string last_error;
    for (const auto& ep : cfg.endpoints) {
        if (!ep.hostaddr.empty() || ep.is_unix_socket() || ep.host.empty()) {
            out.push_back({ep.host, ep.hostaddr, ep.port});
            continue;
        }
        std::error_code parse_ec;
        asio::ip::make_address(ep.host, parse_ec);
        if (!parse_ec) {  // already numeric
            out.push_back({ep.host, ep.host, ep.port});
            continue;
        }
        auto results = co_await net::resolve(ep.host, ep.port, cfg.connect_timeout);
        if (!results) {
            last_error = results.err().message;  // "resolve <host>: <why>"
            continue;
        }
        for (const auto& r : *results) out.push_back({ep.host, r.endpoint().address().to_string(), ep.port});
    }
    if (out.empty())
        co_return error(errc::connection_failed, last_error.empty() ? "no server to connect to" : last_error);
    co_return out;
}

net::awaitable<result<std::unique_ptr<connection>>> connection::connect(const config& cfg,
                                                                        asio::any_io_executor offload,
                                                                        connection_options opts, logger log,
                                                                        std::shared_ptr<stats> st) {
    auto ex = co_await asio::this_coro::executor;
    auto plan = co_await plan_attempts(cfg);
    if (!plan) {
        if (st) st->connect_done(false);
        co_return plan.err();
    }
    error last;
    for (const auto& a : *plan) {
        std::unique_ptr<connection> c(new connection(ex, offload, opts, log, st));
        auto r = co_await c->start(cfg, a);
        if (st) st->connect_done(static_cast<bool>(r));
        if (r) {
            c->log_ = log.with({{"backend_pid", c->backend_pid()}});
            co_return c;
        }
        last = r.err();
        // Wrong credentials or a cancelled caller will not get better on the next address.
        if (last.code == errc::auth_failed || last.code == errc::canceled) break;
    }
    co_return last;
}

net::awaitable<result<void>> connection::start(const config& cfg, const attempt& a) {
    std::vector<const char*> keys, vals;
    for (const auto& [k, v] : cfg.keywords) {
        if (k == "options") continue;
        keys.push_back(k.c_str());
        vals.push_back(v.c_str());
    }
    // Results are decoded from text: pin the formats the decoders expect (types.hpp).
    std::string options(cfg.get("options"));
    options += " -c DateStyle=ISO,YMD -c TimeZone=UTC -c bytea_output=hex";
    keys.push_back("options");
    vals.push_back(options.c_str());
    if (!a.host.empty()) keys.push_back("host"), vals.push_back(a.host.c_str());
    if (!a.hostaddr.empty()) keys.push_back("hostaddr"), vals.push_back(a.hostaddr.c_str());
    keys.push_back("port"), vals.push_back(a.port.c_str());
    keys.push_back(nullptr), vals.push_back(nullptr);

    conn_ = PQconnectStartParams(keys.data(), vals.data(), 0);
    if (!conn_) co_return error(errc::connection_failed, "libpq: out of memory");
    PQsetNoticeReceiver(conn_, &connection::on_notice, this);
    if (PQstatus(conn_) == CONNECTION_BAD) co_return error(errc::connection_failed, conn_message());

    op o{deadline_after(cfg.connect_timeout)};
    auto st = PGRES_POLLING_WRITING;  // libpq: behave as if PQconnectPoll had asked for writability
    for (;;) {
        reassign_socket();  // libpq may have opened a new socket (next address, SSL retry, …)
        if (st == PGRES_POLLING_OK) break;
        if (st == PGRES_POLLING_FAILED) {
            auto msg = conn_message();
            co_return error(looks_like_auth_failure(conn_, msg) ? errc::auth_failed : errc::connection_failed,
                            msg);
        }
        auto w = co_await wait_io(st == PGRES_POLLING_READING ? want::read : want::write, o.deadline);
        if (w.ec == errc::timeout)
            co_return error(
                errc::connection_failed,
                "connection to " + (a.host.empty() ? std::string("the default socket") : a.host) + " port " +
                    a.port + " timed out after " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::milliseconds>(cfg.connect_timeout).count()) +
                    " ms");
        if (w.ec == errc::canceled) co_return error(errc::canceled, "connect cancelled");
        st = PQconnectPoll(conn_);
    }
    if (PQsetnonblocking(conn_, 1) != 0) co_return error(errc::connection_failed, conn_message());
    last_used_ = clock::now();
    co_return result<void>{};
}

void connection::reassign_socket() {
    // Release (never close) and re-register every time: libpq can close a socket and get the same fd number
    // for the next one, which a "did the number change?" test would miss.
    sd_.release();
    int fd = PQsocket(conn_);
    if (fd >= 0) {
        std::error_code ec;
        sd_.assign(fd, ec);
        if (ec) log_.warn("could not register the PostgreSQL socket", {{"error", ec.message()}});
    }
}

// ---- waiting on the socket ----------------------------------------------------------------------------

net::awaitable<connection::io_ready> connection::wait_io(want w, clock::time_point deadline) {
    using namespace asio::experimental::awaitable_operators;
    using wait_type = asio::posix::descriptor_base::wait_type;
    int fd = PQsocket(conn_);
    if (fd < 0 || !sd_.is_open()) co_return io_ready{make_error_code(errc::connection_lost)};
    // Asio's reactor is edge-triggered: an edge that arrived while nothing waited is gone. Ask the kernel
    // for the level first, so data libpq left in the socket never makes us wait for a new edge.
    short events = w == want::read ? POLLIN : w == want::write ? POLLOUT : (POLLIN | POLLOUT);
    pollfd p{fd, events, 0};
    if (::poll(&p, 1, 0) > 0 && p.revents) {
        bool err = p.revents & (POLLHUP | POLLERR | POLLNVAL);
        co_return io_ready{{}, (p.revents & POLLIN) || err, (p.revents & POLLOUT) || err};
    }
    if (clock::now() >= deadline) co_return io_ready{make_error_code(errc::timeout)};
    const bool timed = deadline != clock::time_point::max();
    if (timed) timer_.expires_at(deadline);
    auto first_ec = [](auto& v) { return std::visit([](auto& t) { return std::get<0>(t); }, v); };

    std::error_code ec;
    int which = 0;  // 0 readable, 1 writable, 2 timer
    if (w == want::read_or_write) {
        if (timed) {
            auto r = co_await (sd_.async_wait(wait_type::wait_read) ||
                               sd_.async_wait(wait_type::wait_write) || timer_.async_wait());
            which = static_cast<int>(r.index());
            ec = first_ec(r);
        } else {
            auto r = co_await (sd_.async_wait(wait_type::wait_read) || sd_.async_wait(wait_type::wait_write));
            which = static_cast<int>(r.index());
            ec = first_ec(r);
        }
    } else {
        auto type = w == want::read ? wait_type::wait_read : wait_type::wait_write;
        if (timed) {
            auto r = co_await (sd_.async_wait(type) || timer_.async_wait());
            which = r.index() == 0 ? (w == want::read ? 0 : 1) : 2;
            ec = first_ec(r);
        } else {
            auto [e] = co_await sd_.async_wait(type);
            which = w == want::read ? 0 : 1;
            ec = e;
        }
    }
    if (which == 2) co_return io_ready{make_error_code(ec ? errc::canceled : errc::timeout)};
    if (ec == asio::error::operation_aborted) co_return io_ready{make_error_code(errc::canceled)};
    if (ec) co_return io_ready{make_error_code(errc::connection_lost)};
    co_return io_ready{{}, which == 0, which == 1};
}

net::awaitable<std::error_code> connection::flush(op& o) {
    for (;;) {
        int r = PQflush(conn_);
        if (r == 0) co_return std::error_code{};
        if (r < 0) co_return make_error_code(errc::connection_lost);
        // The server may be blocked writing results to us: read while we wait to write (STYLE.md).
        auto w = co_await wait_io(want::read_or_write, o.deadline);
        if (w.ec) co_return w.ec;
        if (w.readable && !PQconsumeInput(conn_)) co_return make_error_code(errc::connection_lost);
    }
}

net::awaitable<result<pg_result*>> connection::next_result(op& o) {
    for (;;) {
        if (!PQisBusy(conn_)) co_return PQgetResult(conn_);
        auto w = co_await wait_io(want::read, o.deadline);
        if (w.ec == errc::timeout && !o.cancel_sent) {
            // Ask the server to stop, then give it a moment to answer, so the statement's outcome is known
            // (its result, or 57014 from our cancel). The connection is not reused either way (end_op).
            send_cancel();
            o.cancel_sent = true;
            o.deadline = deadline_after(opts_.cancel_grace);
            continue;
        }
        if (w.ec) co_return fail_op(w.ec, o);
        if (!PQconsumeInput(conn_)) co_return lost("reading");
    }
}

// ---- operations -------------------------------------------------------------------------------------

connection::stmt_plan connection::plan_statement(const std::string& sql, const params& p) {
    if (opts_.max_prepared == 0) return {};
    // Keyed by text and parameter types: a statement prepared for int4 must not receive an int8.
    std::string key = sql;
    key.push_back('\0');
    key.append(reinterpret_cast<const char*>(p.types()),
               static_cast<std::size_t>(p.size()) * sizeof(unsigned));
    if (auto it = prepared_.find(key); it != prepared_.end()) return {it->second, {}, false};
    if (prepared_.size() >= opts_.max_prepared) return {};
    return {"cg_" + std::to_string(next_statement_++), std::move(key), true};
}

bool connection::send_statement(const std::string& sql, const params& p, const stmt_plan& plan) {
    if (plan.name.empty())
        return PQsendQueryParams(conn_, sql.c_str(), p.size(), p.types(), p.values(), p.lengths(),
                                 p.formats(), 0);
    return PQsendQueryPrepared(conn_, plan.name.c_str(), p.size(), p.values(), p.lengths(), p.formats(), 0);
}

result<void> connection::begin_op() {
    if (!conn_ || broken_ || PQstatus(conn_) != CONNECTION_OK) return lost("before sending");
    if (busy_) return error(errc::protocol_error, "connection already has an operation in progress");
    busy_ = true;
    return {};
}

void connection::end_op(clock::time_point began, const std::error_code& ec, const op& o) {
    busy_ = false;
    // A connection we sent a cancel for is never reused. PostgreSQL's postmaster delivers a cancel as two
    // SIGINTs (to the backend and to its process group); when the first has already ended our statement,
    // the second can land after it and cancel whatever this connection runs next (seen under CPU load:
    // the statement after a timed-out one failing with 57014). Timeouts are rare; a reconnect is cheap.
    if (o.cancel_sent) broken_ = true;
    last_used_ = clock::now();
    if (stats_) stats_->query_done(std::chrono::duration<double>(last_used_ - began).count(), ec);
}

net::awaitable<result<rows>> connection::query_with(std::string_view sql, params p, duration timeout) {
    auto began = clock::now();
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    std::string text(sql);  // libpq wants NUL-terminated SQL
    result<rows> out = error(errc::protocol_error, "no result");
    auto plan = plan_statement(text, p);
    if (plan.prepare) {
        // First use on this connection: Parse once (one extra round trip), then execute by name.
        result<void> prepared;
        if (!PQsendPrepare(conn_, plan.name.c_str(), text.c_str(), p.size(), p.types())) {
            prepared = lost("sending");
        } else if (auto ec = co_await flush(o)) {
            prepared = fail_op(ec, o);
        } else if (auto r = co_await collect(o); !r) {
            prepared = r.err();
        }
        if (!prepared) {
            end_op(began, prepared.code(), o);
            co_return prepared.err();
        }
        prepared_.emplace(plan.key, plan.name);
    }
    if (!send_statement(text, p, plan)) {
        out = lost("sending");
    } else if (auto ec = co_await flush(o)) {
        out = fail_op(ec, o);
    } else {
        out = co_await collect(o);
    }
    end_op(began, out.code(), o);
    co_return out;
}

net::awaitable<result<void>> connection::execute(std::string_view sql) {
    return execute(sql, opts_.query_timeout);
}

net::awaitable<result<void>> connection::execute(std::string_view sql, duration timeout) {
    auto began = clock::now();
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    std::string text(sql);
    result<void> out;
    if (!PQsendQuery(conn_, text.c_str())) {
        out = lost("sending");
    } else if (auto ec = co_await flush(o)) {
        out = fail_op(ec, o);
    } else {
        auto r = co_await collect(o);
        if (!r) out = r.err();
    }
    end_op(began, out.code(), o);
    co_return out;
}

// Reads the results of one query up to libpq's NULL; returns the last rows or the first error.
net::awaitable<result<rows>> connection::collect(op& o) {
    result<rows> out = error(errc::protocol_error, "the server returned no result");
    bool failed = false;
    for (;;) {
        auto r = co_await next_result(o);
        if (!r) co_return r.err();
        if (!*r) break;
        rows res(*r);  // owns the PGresult from here on
        auto status = PQresultStatus(*r);
        if (status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK || status == PGRES_EMPTY_QUERY) {
            if (!failed) out = std::move(res);
        } else if (status == PGRES_FATAL_ERROR || status == PGRES_NONFATAL_ERROR) {
            if (!failed) out = result_error(*r, o);
            failed = true;
        } else {
            // COPY and friends are not supported: the connection's protocol state is now unknown.
            broken_ = true;
            co_return error(errc::protocol_error,
                            std::string("unsupported result status ") + PQresStatus(status));
        }
    }
    co_return out;
}

net::awaitable<result<std::vector<result<rows>>>> connection::run(const pipeline& batch) {
    return run(batch, opts_.query_timeout);
}

net::awaitable<result<std::vector<result<rows>>>> connection::run(const pipeline& batch, duration timeout) {
    auto began = clock::now();
    if (batch.empty()) co_return std::vector<result<rows>>{};
    if (auto ok = begin_op(); !ok) co_return ok.err();
    op o{deadline_after(timeout)};
    const bool sync_each = batch.mode() == pipeline::sync_mode::per_statement;
    result<std::vector<result<rows>>> out = error(errc::protocol_error, "pipeline not run");
    std::vector<stmt_plan> plans;
    if (!PQenterPipelineMode(conn_)) {
        out = error(errc::protocol_error, "could not enter pipeline mode: " + conn_message());
    } else {
        // Everything is queued in libpq's output buffer first (nonblocking mode never blocks here); flush()
        // then sends it while reading whatever the server already answered.
        bool queued = true;
        plans.reserve(batch.size());
        std::unordered_map<std::string, std::string> preparing;  // first Parse of each new statement only
        for (const auto& s : batch.statements()) {
            const auto& p = s.args;
            auto plan = plan_statement(s.sql, p);
            if (plan.prepare) {
                if (auto it = preparing.find(plan.key); it != preparing.end()) {
                    plan.name = it->second;  // parsed earlier in this batch
                    plan.prepare = false;
                } else {
                    preparing.emplace(plan.key, plan.name);
                    queued = PQsendPrepare(conn_, plan.name.c_str(), s.sql.c_str(), p.size(), p.types());
                }
            }
            queued = queued && send_statement(s.sql, p, plan) && (!sync_each || PQpipelineSync(conn_));
            plans.push_back(std::move(plan));
            if (!queued) break;
        }
        if (!queued || (!sync_each && !PQpipelineSync(conn_))) {
            out = lost("queueing the pipeline");
        } else if (auto ec = co_await flush(o)) {
            out = fail_op(ec, o);
        } else {
            out = co_await collect_pipeline(o, batch, plans);
        }
        if (!out) broken_ = true;  // stuck in pipeline mode with unread results: unusable
    }
    end_op(began, out.code(), o);
    co_return out;
}

net::awaitable<result<void>> connection::expect_sync(op& o) {
    auto sync = co_await next_result(o);
    if (!sync) co_return sync.err();
    rows owner(*sync);
    if (!*sync || PQresultStatus(*sync) != PGRES_PIPELINE_SYNC)
        co_return error(errc::protocol_error, "pipeline: missing sync result");
    co_return result<void>{};
}

net::awaitable<result<void>> connection::read_prepare(op& o, const stmt_plan& plan) {
    auto r = co_await next_result(o);
    if (!r) co_return r.err();
    if (!*r) co_return error(errc::protocol_error, "pipeline: missing prepare result");
    rows owner(*r);
    result<void> out;
    switch (PQresultStatus(*r)) {
        case PGRES_COMMAND_OK:
            prepared_.emplace(plan.key, plan.name);
            break;
        case PGRES_PIPELINE_ABORTED:
            out = error(errc::pipeline_aborted, "prepare skipped");
            break;
        case PGRES_FATAL_ERROR:
            out = result_error(*r, o);
            break;
        default:
            co_return error(errc::protocol_error, "pipeline: unexpected prepare result");
    }
    auto end = co_await next_result(o);
    if (!end) co_return end.err();
    if (*end) {
        rows extra(*end);
        co_return error(errc::protocol_error, "pipeline: more than one prepare result");
    }
    co_return out;
}

net::awaitable<result<std::vector<result<rows>>>> connection::collect_pipeline(
    op& o, const pipeline& batch, const std::vector<stmt_plan>& plans) {
    const bool sync_each = batch.mode() == pipeline::sync_mode::per_statement;
    const std::size_t n = batch.size();
    std::vector<result<rows>> out;
    out.reserve(n);
    std::size_t first_failure = n;
    bool txn_control = false;  // an explicit BEGIN/COMMIT/ROLLBACK changes what a failure undoes
    for (std::size_t i = 0; i < n; ++i) {
        std::optional<error> prepare_failed;
        if (plans[i].prepare) {
            auto pr = co_await read_prepare(o, plans[i]);
            if (!pr && pr.code() != errc::pipeline_aborted && pr.code().category() == category() &&
                (pr.code() == errc::connection_lost || pr.code() == errc::timeout ||
                 pr.code() == errc::canceled || pr.code() == errc::protocol_error))
                co_return pr.err();
            if (!pr && pr.code() != errc::pipeline_aborted) prepare_failed = pr.err();
        }
        auto r = co_await next_result(o);
        if (!r) co_return r.err();
        if (!*r)
            co_return error(errc::protocol_error,
                            "pipeline: missing result for statement " + std::to_string(i));
        rows res(*r);
        if (prepare_failed) {  // the execute was skipped; the statement's error is the Parse error
            if (stats_) stats_->error(prepare_failed->code);
            if (first_failure == n) first_failure = i;
            out.emplace_back(std::move(*prepare_failed));
        } else
            switch (PQresultStatus(*r)) {
                case PGRES_TUPLES_OK:
                case PGRES_COMMAND_OK: {
                    auto tag = res.command();
                    if (tag == "BEGIN" || tag == "COMMIT" || tag == "ROLLBACK" || tag == "START TRANSACTION")
                        txn_control = true;
                    out.emplace_back(std::move(res));
                    break;
                }
                case PGRES_PIPELINE_ABORTED:
                    out.emplace_back(error(errc::pipeline_aborted, "statement " + std::to_string(i)));
                    break;
                case PGRES_FATAL_ERROR: {
                    auto e = result_error(*r, o);
                    if (stats_) stats_->error(e.code);
                    if (first_failure == n) first_failure = i;
                    out.emplace_back(std::move(e));
                    break;
                }
                default:
                    co_return error(errc::protocol_error, std::string("pipeline: unexpected result status ") +
                                                              PQresStatus(PQresultStatus(*r)));
            }
        auto end = co_await next_result(o);  // each statement's results end with NULL
        if (!end) co_return end.err();
        if (*end) {
            rows extra(*end);
            co_return error(errc::protocol_error,
                            "pipeline: more than one result for statement " + std::to_string(i));
        }
        if (sync_each)
            if (auto s = co_await expect_sync(o); !s) co_return s.err();
    }
    if (!sync_each)
        if (auto s = co_await expect_sync(o); !s) co_return s.err();
    if (!PQexitPipelineMode(conn_))
        co_return error(errc::protocol_error, "could not leave pipeline mode: " + conn_message());
    // One sync = one implicit transaction: a failure undid everything before it.
    if (!sync_each && first_failure < n && !txn_control)
        for (std::size_t i = 0; i < first_failure; ++i)
            out[i] = error(errc::rolled_back, "statement " + std::to_string(i) + " undone: statement " +
                                                  std::to_string(first_failure) + " of the batch failed");
    co_return out;
}

// ---- state and errors -----------------------------------------------------------------------------------

tx_status connection::transaction_status() const noexcept {
    if (!conn_) return tx_status::unknown;
    switch (PQtransactionStatus(conn_)) {
        case PQTRANS_IDLE:
            return tx_status::idle;
        case PQTRANS_ACTIVE:
            return tx_status::active;
        case PQTRANS_INTRANS:
            return tx_status::in_transaction;
        case PQTRANS_INERROR:
            return tx_status::in_error;
        default:
            return tx_status::unknown;
    }
}

bool connection::check_alive() {
    if (!conn_ || broken_ || busy_ || PQstatus(conn_) != CONNECTION_OK) return false;
    pollfd p{PQsocket(conn_), POLLIN | POLLRDHUP, 0};
    if (p.fd < 0) return false;
    if (::poll(&p, 1, 0) > 0) {
        // Read what the server said last first (its FATAL reaches on_notice, which logs it and marks the
        // session broken even while the socket still looks open).
        if ((p.revents & POLLIN) && !PQconsumeInput(conn_)) broken_ = true;
        while (PGnotify* n = PQnotifies(conn_)) PQfreemem(n);
        // The server closed its end (shutdown, restart, idle timeout): whatever it said, we are done.
        if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) broken_ = true;
        if (broken_) return false;
    }
    return PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) == PQTRANS_IDLE;
}

int connection::backend_pid() const noexcept {
    return conn_ ? PQbackendPID(conn_) : 0;
}

void connection::send_cancel() {
    // PQcancel blocks without a timeout: never on the offload pool (cancel.hpp says why and where instead).
    // Fire and forget; the caller waits for the query's own result (or the grace deadline).
    send_cancel_request(PQgetCancel(conn_), log_);
}

error connection::lost(std::string_view what) {
    broken_ = true;
    return error(errc::connection_lost, std::string(what) + ": " + conn_message());
}

error connection::fail_op(std::error_code ec, const op& o) {
    broken_ = true;  // we stopped in the middle of the protocol: the connection cannot be reused
    if (ec == errc::canceled) {
        send_cancel();
        return error(errc::canceled, "operation cancelled by the caller");
    }
    if (ec == errc::timeout)
        return error(errc::timeout, o.cancel_sent ? "the server did not end the cancelled query in time"
                                                  : "timed out while sending");
    return error(ec, conn_message());
}

error connection::result_error(const pg_result* r, const op& o) {
    const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char* primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    const char* detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL);
    std::string msg = primary ? primary : trim(PQresultErrorMessage(r));
    if (detail) msg += std::string(" (") + detail + ")";
    if (state) msg = std::string("[") + state + "] " + msg;
    errc e = state ? errc_from_sqlstate(state) : errc::server_error;
    if (e == errc::query_canceled && o.cancel_sent) e = errc::timeout;  // our own cancel after the deadline
    if (PQstatus(conn_) == CONNECTION_BAD) {
        broken_ = true;
        if (e != errc::auth_failed) e = errc::connection_lost;
    }
    return error(e, msg);
}

std::string connection::conn_message() const {
    return conn_ ? trim(PQerrorMessage(conn_)) : "no connection";
}

// libpq hands an ErrorResponse that arrives while no query runs (the server's FATAL before it closes an
// idle session: pg_terminate_backend, shutdown, idle timeout) to the notice receiver. A FATAL or PANIC
// means the session is over even while the socket still looks open: mark it broken so the pool drops it.
void connection::on_notice(void* self, const PGresult* res) {
    auto* c = static_cast<connection*>(self);
    if (!c || !res) return;
    const char* sev = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
    const char* msg = PQresultErrorMessage(res);
    std::string_view severity = sev ? sev : "";
    if (severity == "FATAL" || severity == "PANIC") {
        c->broken_ = true;
        const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        c->log_.warn("postgres ended the session",
                     {{"message", trim(msg ? msg : "")}, {"sqlstate", state ? state : ""}});
    } else if (c->log_.enabled(log_level::debug)) {
        c->log_.debug("postgres notice", {{"message", trim(msg ? msg : "")}});
    }
}

}  // namespace cg::pg
