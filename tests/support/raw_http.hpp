// A blocking HTTP/1.1 client for tests, run on the test thread (never on the loop under test). It sends
// exactly the bytes given, so tests can send malformed requests.
#pragma once

#include <asio/connect.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>
#include <stdexcept>
#include <string>

#include "http/proto/parser.hpp"

namespace cg::test {

class raw_http {
  public:
    explicit raw_http(unsigned short port) : sock_(io_) {
        sock_.connect({asio::ip::make_address("127.0.0.1"), port});
    }

    // Sends `wire` and reads one response. Throws if the server closes before answering.
    // A server may answer (413/431) before it has read everything we send; the answer still counts.
    http::response exchange(const std::string& wire) {
        std::error_code ec;
        asio::write(sock_, asio::buffer(wire), ec);
        return read_response();
    }

    // Sends bytes without reading anything back.
    void exchange_partial(const std::string& wire) { asio::write(sock_, asio::buffer(wire)); }

    http::response get(const std::string& path) {
        return exchange("GET " + path + " HTTP/1.1\r\nHost: test\r\n\r\n");
    }

    http::response read_response() {
        http::response_parser p;
        for (;;) {
            if (!buf_.empty()) buf_.erase(0, p.feed(buf_));
            if (p.state() == http::parse_state::done) return p.message();
            if (p.state() == http::parse_state::failed)
                throw std::runtime_error("bad response: " + p.error_detail());
            char chunk[4096];
            std::error_code ec;
            auto n = sock_.read_some(asio::buffer(chunk), ec);
            if (ec) {
                p.feed_eof();
                if (p.state() == http::parse_state::done) return p.message();
                throw std::runtime_error("connection closed before a response: " + ec.message());
            }
            buf_.append(chunk, n);
        }
    }

    // True when the server has closed the connection (reads EOF, nothing pending).
    bool closed_by_peer() {
        char c;
        std::error_code ec;
        sock_.read_some(asio::buffer(&c, 1), ec);
        return ec == asio::error::eof || ec == asio::error::connection_reset;
    }

  private:
    asio::io_context io_;
    asio::ip::tcp::socket sock_;
    std::string buf_;
};

inline http::response http_get(unsigned short port, const std::string& path) {
    return raw_http(port).get(path);
}

}  // namespace cg::test
