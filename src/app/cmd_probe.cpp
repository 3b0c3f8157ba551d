// `chargeguard probe URL`: a tiny HTTP GET for container HEALTHCHECKs and runbooks (the image has no curl).
// Exit 0 on a 2xx answer within --timeout, 1 otherwise (connection refused, timeout, any other status). It
// prints the status line and then the whole body: a health answer names every check, and the failing one
// may be on any line. URL may be a bare path ("/healthz"): the origin is then the consume health listener
// this container is configured with (CHARGEGUARD_HEALTH_LISTEN, else 127.0.0.1:9180), so a HEALTHCHECK
// follows the configured listener instead of repeating its port.
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "app/cli.hpp"
#include "app/commands.hpp"
#include "http/client.hpp"

// g++ 12 at -O2 reports a false positive on Asio's coroutine frame allocator (GCC bug 109224), as the
// billing library does with -Wno-mismatched-new-delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace cg::app {
namespace {

struct probe_flags {
    std::string url;
    double timeout_s = 3;
};

// "http://host:port/path?q" → origin "http://host:port" and target "/path?q" ("/" when absent).
bool split_url(const std::string& url, std::string& origin, std::string& target) {
    const std::string scheme = "http://";
    if (url.rfind(scheme, 0) != 0) return false;
    auto slash = url.find('/', scheme.size());
    origin = url.substr(0, slash);
    target = slash == std::string::npos ? "/" : url.substr(slash);
    return origin.size() > scheme.size();
}

net::awaitable<int> probe_once(std::string origin, std::string target, std::chrono::milliseconds timeout) {
    http::client_options o;
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

// The origin of the configured health listener: a wildcard host (0.0.0.0, ::, empty) is reached on loopback.
std::string health_origin() {
    const char* env = std::getenv("CHARGEGUARD_HEALTH_LISTEN");
    std::string listen = env && *env ? env : "127.0.0.1:9180";
    auto colon = listen.rfind(':');
    if (colon == std::string::npos) return "http://" + listen;
    std::string host = listen.substr(0, colon), port = listen.substr(colon + 1);
    if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
    if (host == "[::]" || host == "::") host = "[::1]";
    return "http://" + host + ":" + port;
}

int run_probe(const probe_flags& f) {
    std::string origin, target;
    std::string url = !f.url.empty() && f.url[0] == '/' ? health_origin() + f.url : f.url;
    if (!split_url(url, origin, target)) {
        std::printf("probe: '%s' is not an http:// URL\n", f.url.c_str());
        return 1;
    }
    if (auto o = http::parse_origin(origin); !o) {
        std::printf("probe: %s\n", o.err().describe().c_str());
        return 1;
    }
    asio::io_context io{1};
    int rc = 1;
    auto timeout = std::chrono::milliseconds(static_cast<long long>(f.timeout_s * 1000));
    asio::co_spawn(io, probe_once(origin, target, timeout), [&rc](std::exception_ptr e, int r) {
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
        "  chargeguard probe --timeout 500ms /readyz\n");
    cmd->add_option(
           "URL", f->url,
           "http://host:port/path, or a path on the configured health listener (CHARGEGUARD_HEALTH_LISTEN)")
        ->required();
    add_duration_option(*cmd, "--timeout", f->timeout_s, "time for connect + answer", 0.01, 600.0);
    cmd->callback([&selected, f] { selected = [f](const global_flags&) { return run_probe(*f); }; });
}

}  // namespace cg::app
