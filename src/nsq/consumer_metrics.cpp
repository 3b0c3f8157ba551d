#include "nsq/consumer_metrics.hpp"

namespace cg::nsq {

consumer_metrics::consumer_metrics(metrics::registry& reg, const std::string& topic,
                                   const std::string& channel) {
    metrics::labels lb{{"topic", topic}, {"channel", channel}};
    received = &reg.counter("chargeguard_nsq_messages_received_total", "NSQ messages received").Add(lb);
    finished = &reg.counter("chargeguard_nsq_messages_finished_total", "NSQ messages FINed").Add(lb);
    requeued = &reg.counter("chargeguard_nsq_messages_requeued_total", "NSQ messages REQed").Add(lb);
    gave_up = &reg.counter("chargeguard_nsq_messages_given_up_total",
                           "NSQ messages past max_attempts passed to the give-up handler")
                   .Add(lb);
    fin_failed = &reg.counter("chargeguard_nsq_fin_failed_total",
                              "E_FIN_FAILED from nsqd: the message had already timed out")
                      .Add(lb);
    touches = &reg.counter("chargeguard_nsq_touches_total", "TOUCH commands sent").Add(lb);
    dropped = &reg.counter("chargeguard_nsq_messages_dropped_total",
                           "NSQ messages dropped unhandled: their connection had closed, so no answer "
                           "could be sent (nsqd redelivers them after msg_timeout)")
                   .Add(lb);
    handler_errors = &reg.counter("chargeguard_nsq_handler_errors_total",
                                  "message or give-up handlers that threw (a bug: the message is requeued)")
                          .Add(lb);
    connections = &reg.gauge("chargeguard_nsq_connections", "nsqd connections subscribed").Add(lb);
    rdy = &reg.gauge("chargeguard_nsq_rdy", "sum of RDY over all nsqd connections").Add(lb);
    handlers = &reg.gauge("chargeguard_nsq_handlers_running", "message handlers running").Add(lb);
}

}  // namespace cg::nsq
