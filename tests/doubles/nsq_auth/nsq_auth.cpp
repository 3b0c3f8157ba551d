#include "nsq_auth.hpp"

#include "core/log.hpp"
#include "http/proto/message.hpp"
#include "http/router.hpp"
#include "http/server.hpp"

namespace cg::test::nsq {

struct fake_nsq_auth::impl {
    explicit impl(asio::any_io_executor e) : ex(e) {}
    asio::any_io_executor ex;
    std::map<std::string, auth_identity> secrets;
    std::vector<auth_query> queries;
    std::unique_ptr<http::server> server;
    std::uint16_t port = 0;
};

namespace {

void json_list(std::string& out, const std::vector<std::string>& xs) {
    out.push_back('[');
    for (std::size_t i = 0; i < xs.size(); ++i) {
        if (i) out.push_back(',');
        append_json_string(out, xs[i]);
    }
    out.push_back(']');
}

}  // namespace

std::string to_json(const auth_identity& id) {
    std::string o = "{\"ttl\":" + std::to_string(id.ttl) + ",\"identity\":";
    append_json_string(o, id.identity);
    o += ",\"identity_url\":";
    append_json_string(o, id.identity_url);
    o += ",\"authorizations\":[";
    for (std::size_t i = 0; i < id.authorizations.size(); ++i) {
        const auto& a = id.authorizations[i];
        if (i) o.push_back(',');
        o += "{\"topic\":";
        append_json_string(o, a.topic);
        o += ",\"channels\":";
        json_list(o, a.channels);
        o += ",\"permissions\":";
        json_list(o, a.permissions);
        o.push_back('}');
    }
    o += "]}";
    return o;
}

fake_nsq_auth::fake_nsq_auth(asio::any_io_executor ex) : impl_(std::make_shared<impl>(ex)) {}
fake_nsq_auth::~fake_nsq_auth() {
    stop();
}

void fake_nsq_auth::add_secret(const std::string& secret, auth_identity id) {
    impl_->secrets[secret] = std::move(id);
}

result<void> fake_nsq_auth::start() {
    std::weak_ptr<impl> w = impl_;
    http::router r;
    r.add("GET", "/auth", [w](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        if (!s) co_return http::make_response(503, "");
        auto q = req.query();
        auth_query aq{http::query_param(q, "remote_ip").value_or(""),
                      http::query_param(q, "tls").value_or(""), http::query_param(q, "secret").value_or(""),
                      http::query_param(q, "common_name").value_or("")};
        s->queries.push_back(aq);
        auto it = s->secrets.find(aq.secret);
        if (it == s->secrets.end())
            co_return http::make_response(403, "{\"message\":\"NOT_AUTHORIZED\"}",
                                          "application/json; charset=utf-8");
        co_return http::make_response(200, to_json(it->second), "application/json; charset=utf-8");
    });
    http::server_options so;
    so.server_name = "fake-nsq-auth";
    impl_->server = std::make_unique<http::server>(impl_->ex, std::move(r), so, logger{});
    auto ep = impl_->server->listen({"127.0.0.1", 0});
    if (!ep) return ep.err();
    impl_->port = ep->port();
    impl_->server->start();
    return {};
}

void fake_nsq_auth::stop() {
    if (impl_->server) impl_->server->stop();
}

std::uint16_t fake_nsq_auth::port() const {
    return impl_->port;
}
std::vector<auth_query> fake_nsq_auth::queries() const {
    return impl_->queries;
}

}  // namespace cg::test::nsq
