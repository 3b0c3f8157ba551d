// Publishing to one nsqd over TCP: PUB, MPUB, DPUB, pipelined (answers come back in order), with a
// lazy connect and reconnects with exponential backoff after a failure. Heartbeats are answered.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "nsq/config.hpp"

namespace cg::nsq {

class producer {
  public:
    producer(asio::any_io_executor ex, std::string nsqd_tcp_address, producer_config cfg, logger log);
    // Closes the connection; pending calls complete with shutting_down.
    ~producer();
    producer(const producer&) = delete;
    producer& operator=(const producer&) = delete;

    // Each call returns once nsqd answered: OK → success; an error frame → server_error carrying nsqd's
    // text (E_BAD_TOPIC …); a lost connection or no answer within publish_timeout → an error (the
    // message may or may not have been published). What nsqd would refuse fatally is refused before
    // anything is sent, failing only that call: bad_name (topic), invalid_publish (an empty body, a body
    // over max_msg_size, an MPUB over max_body_size, a DPUB delay over max_req_timeout; a negative delay
    // is sent as 0). Connects on demand; after a failure the next
    // connect waits out an exponential backoff. Calls may overlap. Completes on the producer's executor;
    // the producer must outlive the call.
    asio::awaitable<result<void>> publish(std::string topic, std::string body);
    asio::awaitable<result<void>> multi_publish(std::string topic, std::vector<std::string> bodies);
    asio::awaitable<result<void>> deferred_publish(std::string topic, std::chrono::milliseconds delay,
                                                   std::string body);

    // Closes the connection once every pending call was answered.
    asio::awaitable<void> close();

    std::uint64_t published_messages() const;

    struct state;

  private:
    asio::awaitable<result<void>> send(std::string command, std::uint64_t count);
    std::shared_ptr<state> st_;
};

}  // namespace cg::nsq
