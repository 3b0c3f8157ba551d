// fake-nsqd as a process: nsqd (TCP + HTTP) and, with --lookupd-http-address, an nsqlookupd that lists
// this nsqd for every topic given with --topic. Prints "tcp=PORT http=PORT [lookupd=PORT]" on stdout.
#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>

#include "fake_nsqd.hpp"

int main(int argc, char** argv) {
    using namespace cg::test::nsq;
    CLI::App app{"fake-nsqd: an nsqd 1.3.0 test double"};
    std::string tcp = "127.0.0.1:0", http = "127.0.0.1:0", lookupd;
    std::vector<std::string> topics;
    int msg_timeout_ms = 60000, max_rdy = 2500, preload = 0, body_size = 200;
    std::string preload_topic;
    app.add_option("--tcp-address", tcp);
    app.add_option("--http-address", http);
    app.add_option("--lookupd-http-address", lookupd, "also serve nsqlookupd on this address");
    app.add_option("--topic", topics, "topics the lookupd role lists this nsqd for");
    app.add_option("--msg-timeout-ms", msg_timeout_ms);
    app.add_option("--max-rdy-count", max_rdy);
    app.add_option("--preload", preload, "publish this many messages to --preload-topic at start");
    app.add_option("--preload-topic", preload_topic);
    app.add_option("--body-size", body_size);
    CLI11_PARSE(app, argc, argv);

    asio::io_context io;
    fake_nsqd_options opts;
    opts.msg_timeout = std::chrono::milliseconds(msg_timeout_ms);
    opts.max_rdy_count = max_rdy;
    fake_nsqd nsqd(io.get_executor(), opts);
    auto tcp_hp = cg::net::parse_host_port(tcp);
    auto http_hp = cg::net::parse_host_port(http);
    if (!tcp_hp || !http_hp) {
        std::fprintf(stderr, "bad address\n");
        return 2;
    }
    if (auto r = nsqd.start(*tcp_hp, *http_hp); !r) {
        std::fprintf(stderr, "fake-nsqd: %s\n", r.err().describe().c_str());
        return 1;
    }
    for (int i = 0; i < preload; ++i)
        nsqd.publish(preload_topic, std::string(static_cast<std::size_t>(body_size), 'x'));
    std::unique_ptr<fake_nsqlookupd> lk;
    std::printf("tcp=%u http=%u", nsqd.tcp_port(), nsqd.http_port());
    if (!lookupd.empty()) {
        lk = std::make_unique<fake_nsqlookupd>(io.get_executor());
        auto hp = cg::net::parse_host_port(lookupd);
        if (!hp || !lk->start(*hp)) {
            std::fprintf(stderr, "fake-nsqlookupd: cannot listen\n");
            return 1;
        }
        for (const auto& t : topics) lk->add_producer(t, nsqd.producer());
        std::printf(" lookupd=%u", lk->http_port());
    }
    std::printf("\n");
    std::fflush(stdout);
    asio::signal_set sigs(io, SIGINT, SIGTERM);
    sigs.async_wait([&](std::error_code, int) {
        nsqd.stop();
        if (lk) lk->stop();
        io.stop();
    });
    io.run();
    return 0;
}
