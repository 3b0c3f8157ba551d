// fake-nsqlookupd: GET /lookup lists the producers a test registered for a topic, in nsqlookupd's JSON.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fake_nsqd.hpp"
#include "http/server.hpp"
#include "nsqd_state.hpp"

namespace cg::test::nsq {

using namespace nsqd_detail;

// --- fake-nsqlookupd ----------------------------------------------------------------------------------
struct fake_nsqlookupd::impl {
    asio::any_io_executor ex;
    logger log;
    std::unique_ptr<http::server> http;
    std::map<std::string, std::vector<cg::nsq::proto::producer_info>> producers;
    std::uint64_t lookups = 0;
};

fake_nsqlookupd::fake_nsqlookupd(asio::any_io_executor ex, logger log)
    : impl_(std::make_shared<impl>(impl{ex, std::move(log), nullptr, {}, 0})) {}

fake_nsqlookupd::~fake_nsqlookupd() {
    stop();
}

result<void> fake_nsqlookupd::start(const net::host_port& addr) {
    std::weak_ptr<impl> w = impl_;
    http::router r;
    r.add("GET", "/ping", [](http::request&) -> asio::awaitable<http::response> { co_return ok_text(); });
    r.add("GET", "/lookup", [w](http::request& req) -> asio::awaitable<http::response> {
        auto s = w.lock();
        ++s->lookups;
        auto t = http::query_param(req.query(), "topic");
        if (!t) co_return json_error(400, "MISSING_ARG_TOPIC");
        auto it = s->producers.find(*t);
        if (it == s->producers.end()) co_return json_error(404, "TOPIC_NOT_FOUND");
        auto resp = http::make_response(200, cg::nsq::proto::to_lookup_json({}, it->second),
                                        "application/json; charset=utf-8");
        resp.headers.add("X-Nsq-Content-Type", "nsq; version=1.0");
        co_return resp;
    });
    http::server_options so;
    so.server_name = "fake-nsqlookupd";
    impl_->http = std::make_unique<http::server>(impl_->ex, std::move(r), so, impl_->log);
    auto ep = impl_->http->listen(addr);
    if (!ep) return ep.err();
    impl_->http->start();
    return {};
}

void fake_nsqlookupd::stop() {
    if (impl_->http) impl_->http->stop();
}

std::uint16_t fake_nsqlookupd::http_port() const {
    return impl_->http ? impl_->http->local_endpoint().port() : 0;
}

void fake_nsqlookupd::add_producer(const std::string& topic, cg::nsq::proto::producer_info p) {
    auto& v = impl_->producers[topic];
    std::erase_if(v, [&](const auto& o) { return o.key() == p.key(); });
    v.push_back(std::move(p));
}

void fake_nsqlookupd::remove_producer(const std::string& topic, const std::string& key) {
    auto it = impl_->producers.find(topic);
    if (it == impl_->producers.end()) return;
    std::erase_if(it->second, [&](const auto& o) { return o.key() == key; });
    if (it->second.empty()) impl_->producers.erase(it);
}

std::uint64_t fake_nsqlookupd::lookups() const {
    return impl_->lookups;
}

}  // namespace cg::test::nsq
