#include "app/listener_flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "net/tls.hpp"

namespace cg::app {

void add_listener_flags(CLI::App& cmd, listener_flags& f) {
    cmd.add_option("--max-connections", f.max_connections, "client connections open at once")
        ->check(CLI::Range(std::size_t{1}, std::size_t{100000}))
        ->capture_default_str();
    add_duration_option(cmd, "--read-timeout", f.read_timeout_s,
                        "time a client has to send a complete request", 0.1, 3600.0);
    cmd.add_option("--tls-cert", f.tls_cert, "PEM certificate chain: serve HTTPS on --listen");
    cmd.add_option("--tls-key", f.tls_key, "PEM private key for --tls-cert");
}

http::server_options to_listener_options(const listener_flags& f, std::size_t max_body_bytes,
                                         std::string server_name) {
    http::server_options o;
    o.limits.max_body_bytes = std::max<std::size_t>(max_body_bytes * 4, 1024 * 1024);
    o.limits.max_header_bytes = 16 * 1024;
    o.max_connections = f.max_connections;
    o.read_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.read_timeout_s * 1000.0));
    o.server_name = std::move(server_name);
    if (f.tls_cert.empty() != f.tls_key.empty()) throw usage_error("--tls-cert and --tls-key go together");
    if (!f.tls_cert.empty()) {
        auto tls = net::make_tls_server_context({f.tls_cert, f.tls_key});
        if (!tls) throw config_error("--tls-cert/--tls-key: " + tls.err().message);
        o.tls = *tls;
    }
    return o;
}

listener_service_start prepare_listener_service(const std::string& listen, const runtime_flags& rt,
                                                const pg_flags& pg, log_level level) {
    auto address = net::parse_host_port(listen);
    if (!address) throw CLI::ValidationError("--listen", address.err().describe());
    auto opts = to_runtime_options(rt);
    auto ms = load_migrations(pg);
    if (!ms) throw CLI::ValidationError("--migrations-dir", ms.err().describe());
    return {std::move(*address), opts, std::move(*ms), make_stderr_logger(level)};
}

}  // namespace cg::app
