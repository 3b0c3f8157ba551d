// pg::connection: construction, teardown, state, errors and notices (connection_impl.hpp lists the rest).
#include <poll.h>
#include <sys/socket.h>

#include <asio/post.hpp>

#include "pg/cancel.hpp"
#include "pg/connection_impl.hpp"
#include "pg/stats.hpp"

namespace cg::pg {

using detail::deadline_after;
using detail::trim;

namespace {

struct finish_deleter {
    void operator()(PGconn* c) const noexcept { PQfinish(c); }
};

void ignore_notice(void*, const char*) {}

}  // namespace

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

// The outcome of an operation whose commit the synchronous standby never confirmed: reported like a timeout
// (the outcome is unknown to the caller), never as success, so nothing is acknowledged — a FIN, a webhook's
// 2xx — on the strength of a commit a failover can lose. A retry finds the local commit if the server stays.
error connection::unconfirmed_commit() const {
    return error(
        errc::timeout,
        "the synchronous standby did not confirm the commit (its wait was cancelled): committed on this "
        "server only, which a failover may lose");
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
    // PostgreSQL's WARNING when a cancel or a termination ends a commit's wait for the synchronous standby
    // (syncrep.c): the transaction stays committed locally and the command still reports success. Known by
    // its source function, which, unlike the message, is not translated.
    const char* fn = PQresultErrorField(res, PG_DIAG_SOURCE_FUNCTION);
    if (severity == "WARNING" && fn && std::string_view(fn) == "SyncRepWaitForLSN") {
        c->commit_unconfirmed_ = true;
        c->log_.warn("postgres commit not confirmed by the synchronous standby",
                     {{"message", trim(msg ? msg : "")}});
    }
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
