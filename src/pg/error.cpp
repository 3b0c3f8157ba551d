#include "pg/error.hpp"

#include "core/error.hpp"

namespace cg::pg {
namespace {

const char* describe(int v) noexcept {
    switch (static_cast<errc>(v)) {
        case errc::ok:
            return "ok";
        case errc::unavailable:
            return "PostgreSQL unavailable";
        case errc::connection_failed:
            return "could not connect to PostgreSQL";
        case errc::auth_failed:
            return "PostgreSQL authentication failed";
        case errc::connection_lost:
            return "PostgreSQL connection lost (outcome unknown)";
        case errc::timeout:
            return "PostgreSQL query timed out";
        case errc::canceled:
            return "PostgreSQL operation cancelled";
        case errc::unique_violation:
            return "unique violation";
        case errc::foreign_key_violation:
            return "foreign key violation";
        case errc::check_violation:
            return "check constraint violation";
        case errc::not_null_violation:
            return "not-null violation";
        case errc::integrity_violation:
            return "integrity constraint violation";
        case errc::serialization_failure:
            return "serialization failure";
        case errc::deadlock:
            return "deadlock detected";
        case errc::lock_not_available:
            return "lock not available";
        case errc::query_canceled:
            return "query cancelled by the server";
        case errc::syntax_error:
            return "SQL syntax or access rule error";
        case errc::data_exception:
            return "data exception";
        case errc::insufficient_resources:
            return "insufficient resources";
        case errc::server_error:
            return "PostgreSQL server error";
        case errc::pipeline_aborted:
            return "skipped: an earlier statement of the pipeline failed";
        case errc::rolled_back:
            return "rolled back: a later statement of the same batch failed";
        case errc::protocol_error:
            return "unexpected libpq state";
        case errc::bad_config:
            return "bad PostgreSQL configuration";
        case errc::bad_migration:
            return "bad migration";
    }
    return "unknown PostgreSQL error";
}

}  // namespace

const std::error_category& category() noexcept {
    static const simple_category cat("chargeguard.pg", describe);
    return cat;
}

errc errc_from_sqlstate(std::string_view s) noexcept {
    if (s.size() != 5) return errc::server_error;
    if (s == "23505") return errc::unique_violation;
    if (s == "23503") return errc::foreign_key_violation;
    if (s == "23514") return errc::check_violation;
    if (s == "23502") return errc::not_null_violation;
    if (s == "40001") return errc::serialization_failure;
    if (s == "40P01") return errc::deadlock;
    if (s == "55P03") return errc::lock_not_available;
    if (s == "57014") return errc::query_canceled;
    if (s == "28P01" || s == "28000") return errc::auth_failed;
    // 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now: the server is going away.
    if (s == "57P01" || s == "57P02" || s == "57P03") return errc::connection_lost;
    auto cls = s.substr(0, 2);
    if (cls == "23") return errc::integrity_violation;
    if (cls == "42") return errc::syntax_error;
    if (cls == "22") return errc::data_exception;
    if (cls == "53") return errc::insufficient_resources;
    if (cls == "08") return errc::connection_lost;  // connection exception
    return errc::server_error;
}

const char* errc_name(errc e) noexcept {
    switch (e) {
        case errc::ok:
            return "ok";
        case errc::unavailable:
            return "unavailable";
        case errc::connection_failed:
            return "connection_failed";
        case errc::auth_failed:
            return "auth_failed";
        case errc::connection_lost:
            return "connection_lost";
        case errc::timeout:
            return "timeout";
        case errc::canceled:
            return "canceled";
        case errc::unique_violation:
            return "unique_violation";
        case errc::foreign_key_violation:
            return "foreign_key_violation";
        case errc::check_violation:
            return "check_violation";
        case errc::not_null_violation:
            return "not_null_violation";
        case errc::integrity_violation:
            return "integrity_violation";
        case errc::serialization_failure:
            return "serialization_failure";
        case errc::deadlock:
            return "deadlock";
        case errc::lock_not_available:
            return "lock_not_available";
        case errc::query_canceled:
            return "query_canceled";
        case errc::syntax_error:
            return "syntax_error";
        case errc::data_exception:
            return "data_exception";
        case errc::insufficient_resources:
            return "insufficient_resources";
        case errc::server_error:
            return "server_error";
        case errc::pipeline_aborted:
            return "pipeline_aborted";
        case errc::rolled_back:
            return "rolled_back";
        case errc::protocol_error:
            return "protocol_error";
        case errc::bad_config:
            return "bad_config";
        case errc::bad_migration:
            return "bad_migration";
    }
    return "unknown";
}

const char* error_class(const std::error_code& ec) noexcept {
    if (!ec) return "ok";
    if (ec.category() == category()) return errc_name(static_cast<errc>(ec.value()));
    return ec.category().name();
}

bool is_transient(const std::error_code& ec) noexcept {
    if (ec.category() != category()) return false;
    switch (static_cast<errc>(ec.value())) {
        case errc::unavailable:
        case errc::connection_failed:
        case errc::connection_lost:
        case errc::timeout:
        case errc::serialization_failure:
        case errc::deadlock:
        case errc::lock_not_available:
        case errc::query_canceled:
        case errc::insufficient_resources:
            return true;
        default:
            return false;
    }
}

}  // namespace cg::pg
