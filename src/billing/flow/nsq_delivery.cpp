#include "billing/flow/nsq_delivery.hpp"

namespace cg::billing {

delivery delivery_of(nsq::message& m, const std::string& topic, const std::string& channel) {
    delivery d;
    d.topic = topic;
    d.channel = channel;
    d.message_id = std::string(m.id());  // 16 ASCII characters, as nsqd prints them
    d.attempts = m.attempts();
    d.body = m.take_body();
    return d;
}

nsq::disposition to_disposition(const verdict& v) {
    if (v.finished()) return nsq::disposition::finish();
    return nsq::disposition::requeue_without_backoff(v.delay);
}

net::awaitable<verdict> run_delivery(charge_flow& p, nsq::message& m, const std::string& topic,
                                     const std::string& channel, bool give_up) {
    nsq::keepalive alive(m);
    if (give_up) co_return co_await p.give_up(delivery_of(m, topic, channel), [&m] { m.touch(); });
    co_return co_await p.handle(delivery_of(m, topic, channel), [&m] { m.touch(); });
}

net::awaitable<nsq::disposition> run_delivery_disposition(charge_flow& p, nsq::message& m,
                                                          const std::string& topic,
                                                          const std::string& channel, bool give_up) {
    nsq::keepalive alive(m);
    if (give_up)
        co_return to_disposition(co_await p.give_up(delivery_of(m, topic, channel), [&m] { m.touch(); }));
    co_return to_disposition(co_await p.handle(delivery_of(m, topic, channel), [&m] { m.touch(); }));
}

}  // namespace cg::billing
