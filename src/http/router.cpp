#include "http/router.hpp"

namespace cg::http {

router& router::add(std::string method, std::string path, handler h) {
    routes_.push_back({std::move(method), std::move(path), false, std::move(h)});
    return *this;
}

router& router::add_prefix(std::string method, std::string prefix, handler h) {
    routes_.push_back({std::move(method), std::move(prefix), true, std::move(h)});
    return *this;
}

namespace {

asio::awaitable<response> answer(response r) {
    co_return r;
}

}  // namespace

// Not a coroutine: the handler's own coroutine is what the server awaits, so a request being handled holds
// no frame of the router's.
asio::awaitable<response> router::dispatch(request& req) const {
    auto path = req.path();
    std::string allow;
    for (const auto& r : routes_) {
        bool path_ok = r.prefix ? path.starts_with(r.path) : path == r.path;
        if (!path_ok) continue;
        bool method_ok =
            r.method.empty() || r.method == req.method || (req.method == "HEAD" && r.method == "GET");
        if (method_ok) return r.h(req);
        if (!allow.empty()) allow += ", ";
        allow += r.method;
    }
    if (!allow.empty()) {
        auto resp = make_response(405, "method not allowed\n");
        resp.headers.add("Allow", allow);
        return answer(std::move(resp));
    }
    return answer(make_response(404, "not found\n"));
}

}  // namespace cg::http
