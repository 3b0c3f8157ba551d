#include "pg/config.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <memory>

#include "pg/error.hpp"
#include "pg/types.hpp"

namespace cg::pg {
namespace {

struct options_deleter {
    void operator()(PQconninfoOption* o) const noexcept { PQconninfoFree(o); }
};
using options_ptr = std::unique_ptr<PQconninfoOption, options_deleter>;

std::vector<std::string> split_commas(std::string_view s) {
    std::vector<std::string> out;
    if (s.empty()) return out;
    std::size_t start = 0;
    for (;;) {
        auto comma = s.find(',', start);
        out.emplace_back(
            s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    return out;
}

// host/hostaddr/port lists → endpoints, with libpq's rules: a single port applies to every host.
result<std::vector<endpoint>> make_endpoints(std::string_view host, std::string_view hostaddr,
                                             std::string_view port) {
    auto hosts = split_commas(host);
    auto addrs = split_commas(hostaddr);
    auto ports = split_commas(port);
    std::size_t n = std::max(hosts.size(), addrs.size());
    if (!hosts.empty() && !addrs.empty() && hosts.size() != addrs.size())
        return error(errc::bad_config, "host and hostaddr list different numbers of servers");
    if (n == 0) n = 1;  // nothing given: libpq's default Unix socket directory
    if (ports.size() > 1 && ports.size() != n)
        return error(errc::bad_config, "port lists a different number of entries than host");
    std::vector<endpoint> out;
    for (std::size_t i = 0; i < n; ++i) {
        endpoint e;
        if (i < hosts.size()) e.host = hosts[i];
        if (i < addrs.size()) e.hostaddr = addrs[i];
        e.port = ports.empty() ? "5432" : ports.size() == 1 ? ports[0] : ports[i];
        if (e.port.empty()) e.port = "5432";
        auto p = parse_int64(e.port);
        if (!p || *p <= 0 || *p > 65535)
            return error(errc::bad_config, "port \"" + e.port + "\" is not a port number");
        out.push_back(std::move(e));
    }
    return out;
}

}  // namespace

result<config> config::from_dsn(std::string_view dsn) {
    char* err = nullptr;
    options_ptr given;
    if (!dsn.empty()) {
        given.reset(PQconninfoParse(std::string(dsn).c_str(), &err));
        if (!given) {
            std::string msg = err ? err : "out of memory";
            if (err) PQfreemem(err);
            while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
            return error(errc::bad_config, "--pg-dsn: " + msg);
        }
    }
    options_ptr defaults(PQconndefaults());
    if (!defaults) return error(errc::bad_config, "libpq could not build its default options");

    config c;
    std::string host, hostaddr, port;
    bool gss_given = std::getenv("PGGSSENCMODE") != nullptr;
    for (auto* d = defaults.get(); d->keyword; ++d) {
        const char* val = d->val;
        if (given) {
            for (auto* g = given.get(); g->keyword; ++g)
                if (std::string_view(g->keyword) == d->keyword && g->val) {
                    val = g->val;
                    if (std::string_view(d->keyword) == "password" && *g->val) c.dsn_has_password = true;
                    if (std::string_view(d->keyword) == "gssencmode") gss_given = true;
                }
        }
        if (!val) continue;
        std::string_view kw = d->keyword;
        if (kw == "host")
            host = val;
        else if (kw == "hostaddr")
            hostaddr = val;
        else if (kw == "port")
            port = val;
        else
            c.keywords.emplace_back(kw, val);
    }
    auto eps = make_endpoints(host, hostaddr, port);
    if (!eps) return eps.err();
    c.endpoints = std::move(*eps);

    if (auto t = c.get("connect_timeout"); !t.empty()) {
        auto secs = parse_int64(t);
        if (!secs || *secs < 0) return error(errc::bad_config, "connect_timeout must be a number of seconds");
        // libpq: 0 means forever, and anything under 2 s is raised to 2 s. Forever is no choice for a
        // service.
        if (*secs > 0) c.connect_timeout = std::chrono::seconds(std::max<std::int64_t>(*secs, 2));
    }
    // GSSAPI encryption probing may consult a Kerberos credential cache inside PQconnectPoll (file reads,
    // possibly network): only when the operator asked for it.
    if (!gss_given) c.set("gssencmode", "disable");
    if (c.get("application_name").empty() && c.get("fallback_application_name").empty())
        c.set("fallback_application_name", "chargeguard");
    return c;
}

std::string_view config::get(std::string_view keyword) const {
    for (auto& [k, v] : keywords)
        if (k == keyword) return v;
    return {};
}

void config::set(std::string_view keyword, std::string value) {
    for (auto& [k, v] : keywords)
        if (k == keyword) {
            v = std::move(value);
            return;
        }
    keywords.emplace_back(keyword, std::move(value));
}

std::string config::describe() const {
    std::string out;
    for (std::size_t i = 0; i < endpoints.size(); ++i) {
        out += i ? "," : "host=";
        out += endpoints[i].host.empty() ? std::string("(default socket)") : endpoints[i].host;
        if (!endpoints[i].hostaddr.empty()) out += "(" + endpoints[i].hostaddr + ")";
        out += ":" + endpoints[i].port;
    }
    for (auto key : {"dbname", "user"})
        if (auto v = get(key); !v.empty()) out += std::string(" ") + key + "=" + std::string(v);
    return out;
}

}  // namespace cg::pg
