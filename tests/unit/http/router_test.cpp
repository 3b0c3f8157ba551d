#include "http/router.hpp"

#include <boost/test/unit_test.hpp>

#include "support/run_async.hpp"

using namespace cg::http;

namespace {
asio::awaitable<response> ok_handler(request& r) {
    co_return make_response(200, "ok " + std::string(r.path()));
}

asio::awaitable<std::vector<int>> exercise(const router* rt) {
    std::vector<int> statuses;
    for (auto [method, target] : {std::pair{"GET", "/healthz"},
                                  {"POST", "/healthz"},
                                  {"GET", "/nope"},
                                  {"HEAD", "/healthz"},
                                  {"DELETE", "/admin/x/y"}}) {
        request r;
        r.method = method;
        r.target = target;
        auto resp = co_await rt->dispatch(r);
        statuses.push_back(resp.status);
        if (resp.status == 405) BOOST_TEST(*resp.headers.get("Allow") == "GET");
    }
    co_return statuses;
}
}  // namespace

BOOST_AUTO_TEST_CASE(dispatch_404_405_prefix) {
    router rt;
    rt.add("GET", "/healthz", ok_handler);
    rt.add_prefix("", "/admin/", ok_handler);
    auto statuses = cg::test::run_async([&] { return exercise(&rt); });
    BOOST_TEST(statuses == (std::vector<int>{200, 405, 404, 200, 200}), boost::test_tools::per_element());
}
