// A small router: exact paths or prefixes, per method; async handlers.
#pragma once

#include <asio/awaitable.hpp>
#include <functional>
#include <string>
#include <vector>

#include "http/proto/message.hpp"

namespace cg::http {

// A handler runs on the server's executor; it may co_await (latency injection, database queries).
using handler = std::function<asio::awaitable<response>(request&)>;

class router {
  public:
    // `method` empty matches any method. Later routes do not override earlier ones.
    router& add(std::string method, std::string path, handler h);
    router& add_prefix(std::string method, std::string prefix, handler h);

    // Finds the handler and runs it: 404 when no path matches, 405 (with Allow) when only the method
    // differs. Exceptions from handlers propagate to the caller (the server turns them into 500).
    asio::awaitable<response> dispatch(request& req) const;

    // The handlers take their requests' bodies themselves (request::take_body, request::peek_body): on a
    // plain connection the server leaves a Content-Length body that has fully arrived in the socket, so a
    // request waiting in its handler holds no copy of it. The server consumes what a handler left unread
    // after answering.
    router& leave_bodies_unread() {
        bodies_unread_ = true;
        return *this;
    }
    bool bodies_unread() const noexcept { return bodies_unread_; }

  private:
    struct route {
        std::string method;
        std::string path;
        bool prefix;
        handler h;
    };
    std::vector<route> routes_;
    bool bodies_unread_ = false;
};

}  // namespace cg::http
