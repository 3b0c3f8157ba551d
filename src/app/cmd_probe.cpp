// `chargeguard probe URL`: a tiny HTTP GET for container HEALTHCHECKs and runbooks (the image has no curl).
// Exit 0 on a 2xx answer within --timeout, 1 otherwise (connection refused, timeout, any other status). It
// prints the status line and then the whole body: a health answer names every check, and the failing one
// may be on any line. URL may be a bare path ("/healthz"): the origin is then the consume health listener
// this container is configured with (CHARGEGUARD_HEALTH_LISTEN, else 127.0.0.1:9180), so a HEALTHCHECK
// follows the configured listener instead of repeating its port, and its scheme (https when
// CHARGEGUARD_HEALTH_TLS_CERT_FILE is set). A listener with basic auth takes credentials from a file
// (--health-credentials-file), never from argv.
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "app/nsq_flags.hpp"
#include "http/client.hpp"
#include "net/tls.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
namespace {

struct probe_flags {
    std::string url;
    double timeout_s = 3;
    std::string ca_file;           // https: the CA bundle that verifies the listener (else the system store)
    std::string credentials_file;  // user:password for a listener with basic auth
};

// "http://host:port/path?q" → origin "http://host:port" and target "/path?q" ("/" when absent); https too.
bool split_url(const std::string& url, std::string& origin, std::string& target) {
    std::string scheme = url.rfind("https://", 0) == 0 ? "https://" : "http://";
    if (url.rfind(scheme, 0) != 0) return false;
    auto slash = url.find('/', scheme.size());
    origin = url.substr(0, slash);
    target = slash == std::string::npos ? "/" : url.substr(slash);
    return origin.size() > scheme.size();
}

net::awaitable<int> probe_once(std::string origin, std::string target, std::chrono::milliseconds timeout,
                               std::shared_ptr<asio::ssl::context> tls, std::string authorization) {
    http::client_options o;
    o.tls = std::move(tls);
    o.connect_timeout = timeout;
    o.request_timeout = timeout;
    o.max_connections = 1;
    auto cl = http::client::create(co_await asio::this_coro::executor, origin, o, logger());
    if (!cl) {
        std::printf("probe: %s\n", cl.err().describe().c_str());
        co_return 1;
    }
    http::request req;
    req.target = target;
    if (!authorization.empty()) req.headers.add("Authorization", std::move(authorization));
    auto r = co_await (*cl)->request(std::move(req));
    if (!r.ok()) {
        std::printf("probe: %s%s: %s\n", origin.c_str(), target.c_str(), r.err.describe().c_str());
        co_return 1;
    }
    bool ok = r.resp.status >= 200 && r.resp.status < 300;
    std::printf("probe: %s%s: %d\n", origin.c_str(), target.c_str(), r.resp.status);
    std::fwrite(r.resp.body.data(), 1, r.resp.body.size(), stdout);
    if (!r.resp.body.empty() && r.resp.body.back() != '\n') std::fputc('\n', stdout);
    co_return ok ? 0 : 1;
}

// The origin of the configured health listener: a wildcard host (0.0.0.0, ::, empty) is reached on loopback;
// https when the listener serves TLS.
std::string health_origin() {
    const char* cert = std::getenv("CHARGEGUARD_HEALTH_TLS_CERT_FILE");
    std::string scheme = cert && *cert ? "https://" : "http://";
    const char* env = std::getenv("CHARGEGUARD_HEALTH_LISTEN");
    std::string listen = env && *env ? env : "127.0.0.1:9180";
    auto colon = listen.rfind(':');
    if (colon == std::string::npos) return scheme + listen;
    std::string host = listen.substr(0, colon), port = listen.substr(colon + 1);
    if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
    if (host == "[::]" || host == "::") host = "[::1]";
    return scheme + host + ":" + port;
}

// "Basic base64(user:password)" from the first line of `path`; usage_error/config_error naming the flag,
// never the file's content.
std::string basic_authorization(const std::string& path) {
    auto text = read_secret_file("--health-credentials-file", path);
    auto line = text.substr(0, text.find_first_of("\r\n"));
    OPENSSL_cleanse(text.data(), text.size());
    if (line.find(':') == std::string::npos || line.front() == ':')
        bad_secret_file("--health-credentials-file", path, "not user:password on its first line");
    std::string b64(4 * ((line.size() + 2) / 3) + 1, '\0');
    int n =
        EVP_EncodeBlock(reinterpret_cast<unsigned char*>(b64.data()),
                        reinterpret_cast<const unsigned char*>(line.data()), static_cast<int>(line.size()));
    OPENSSL_cleanse(line.data(), line.size());
    b64.resize(static_cast<std::size_t>(n));
    return "Basic " + b64;
}

int run_probe(const probe_flags& f) {
    std::string origin, target;
    std::string url = !f.url.empty() && f.url[0] == '/' ? health_origin() + f.url : f.url;
    if (!split_url(url, origin, target)) {
        std::printf("probe: '%s' is not an http:// or https:// URL\n", f.url.c_str());
        return 1;
    }
    if (auto o = http::parse_origin(origin); !o) {
        std::printf("probe: %s\n", o.err().describe().c_str());
        return 1;
    }
    std::shared_ptr<asio::ssl::context> tls;
    if (origin.rfind("https://", 0) == 0) {
        auto ctx = net::make_tls_client_context({f.ca_file});
        if (!ctx) throw config_error("--health-ca-file: " + ctx.err().message);
        tls = *ctx;
    }
    std::string authorization =
        f.credentials_file.empty() ? std::string() : basic_authorization(f.credentials_file);
    asio::io_context io{1};
    int rc = 1;
    auto timeout = std::chrono::milliseconds(static_cast<long long>(f.timeout_s * 1000));
    asio::co_spawn(io, probe_once(origin, target, timeout, std::move(tls), std::move(authorization)),
                   [&rc](std::exception_ptr e, int r) {
                       if (e) {
                           std::printf("probe: %s\n", describe_exception(e).c_str());
                           r = 1;
                       }
                       rc = r;
                   });
    io.run();
    return rc;
}

}  // namespace

void register_probe(CLI::App& app, command_main& selected) {
    auto f = std::make_shared<probe_flags>();
    auto* cmd = app.add_subcommand(
        "probe", "HTTP GET URL, print the status and the whole body; exit 0 on 2xx, 1 otherwise");
    cmd->footer(
        "Examples:\n"
        "  chargeguard probe /healthz          # the listener CHARGEGUARD_HEALTH_LISTEN names (default "
        "127.0.0.1:9180)\n"
        "  chargeguard probe http://127.0.0.1:9180/healthz\n"
        "  chargeguard probe --timeout 500ms /readyz\n"
        "  chargeguard probe --health-ca-file ca.pem --health-credentials-file /run/secrets/health_user "
        "/metrics\n");
    cmd->add_option(
           "URL", f->url,
           "http://host:port/path, or a path on the configured health listener (CHARGEGUARD_HEALTH_LISTEN)")
        ->required();
    add_duration_option(*cmd, "--timeout", f->timeout_s, "time for connect + answer", 0.01, 600.0);
    env(cmd->add_option("--health-ca-file", f->ca_file,
                        "PEM CA bundle that verifies an https:// listener (default: the system store)"),
        env_scope::connection);
    env(cmd->add_option("--health-credentials-file", f->credentials_file,
                        "file holding user:password for a listener with --health-basic-auth-file"),
        env_scope::connection);
    cmd->callback([&selected, f] { selected = [f](const global_flags&) { return run_probe(*f); }; });
}

}  // namespace cg::app
