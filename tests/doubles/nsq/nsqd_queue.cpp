// fake-nsqd's topics and channels: publishing, delivery round-robin to ready clients, requeue and timeouts
// (nsqd's queueScanLoop), RDY assertions and a client's removal.

#include "nsq/proto/message.hpp"
#include "nsqd_state.hpp"

namespace cg::test::nsq {

namespace proto = cg::nsq::proto;
using namespace std::chrono;
using namespace nsqd_detail;

topic& fake_nsqd::impl::get_topic(const std::string& name) {
    auto& t = topics[name];
    if (!t) {
        t = std::make_unique<topic>();
        t->name = name;
    }
    return *t;
}

chan_t& fake_nsqd::impl::get_channel(topic& t, const std::string& name) {
    auto& c = t.channels[name];
    if (!c) {
        c = std::make_unique<chan_t>();
        c->name = name;
        flush_backlog(t);
    }
    return *c;
}

std::string fake_nsqd::impl::new_id() {
    // nsqd's ids are 16 hex characters.
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(next_msg_id++));
    return buf;
}

void fake_nsqd::impl::put(topic& t, std::string body, milliseconds defer) {
    msg m{new_id(), std::move(body), unix_now_ns(), 0};
    ++t.message_count;
    t.message_bytes += m.body.size();
    if (t.channels.empty() || t.paused) {
        t.backlog.push_back(std::move(m));
        return;
    }
    for (auto& [n, c] : t.channels) {
        ++c->message_count;
        if (defer > milliseconds(0)) {
            c->deferred.emplace(sclock::now() + defer, m);
        } else {
            c->queue.push_back(m);
            pump(*c);
        }
    }
}

void fake_nsqd::impl::flush_backlog(topic& t) {
    if (t.channels.empty() || t.paused) return;
    while (!t.backlog.empty()) {
        for (auto& [n, c] : t.channels) {
            ++c->message_count;
            c->queue.push_back(t.backlog.front());
        }
        t.backlog.pop_front();
    }
    for (auto& [n, c] : t.channels) pump(*c);
}

void fake_nsqd::impl::pump(chan_t& c) {
    if (c.paused || c.clients.empty()) return;
    while (!c.queue.empty()) {
        client* target = nullptr;
        for (std::size_t step = 0; step < c.clients.size(); ++step) {
            auto* cl = c.clients[(c.rr + step) % c.clients.size()];
            if (cl->ready()) {
                target = cl;
                c.rr = (c.rr + step + 1) % c.clients.size();
                break;
            }
        }
        if (!target) return;
        deliver(c, *target, std::move(c.queue.front()));
        c.queue.pop_front();
    }
}

void fake_nsqd::impl::deliver(chan_t& c, client& cl, msg m) {
    ++m.attempts;
    auto now = sclock::now();
    proto::append_message_frame(cl.out, m.ts, m.attempts, m.id, m.body);
    ++cl.in_flight;
    ++cl.message_count;
    auto id = m.id;
    c.in_flight[id] = in_flight_entry{std::move(m), &cl, now + cl.msg_timeout, now};
    cl.notify();
}

void fake_nsqd::impl::scan() {
    auto now = sclock::now();
    for (auto& [tn, t] : topics) {
        for (auto& [cn, c] : t->channels) {
            for (auto it = c->in_flight.begin(); it != c->in_flight.end();) {
                if (it->second.deadline <= now) {
                    if (it->second.owner) --it->second.owner->in_flight;
                    ++c->timeout_count;
                    requeue_now(*c, std::move(it->second.m));
                    it = c->in_flight.erase(it);
                } else {
                    ++it;
                }
            }
            while (!c->deferred.empty() && c->deferred.begin()->first <= now) {
                requeue_now(*c, std::move(c->deferred.begin()->second));
                c->deferred.erase(c->deferred.begin());
            }
            pump(*c);
        }
    }
}

asio::awaitable<void> fake_nsqd::impl::scan_loop(std::shared_ptr<impl> self) {
    while (!self->stopped) {
        self->scan_timer.expires_after(self->opts.queue_scan_interval);
        auto [ec] = co_await self->scan_timer.async_wait();
        if (ec || self->stopped) co_return;
        self->scan();
    }
}

void fake_nsqd::impl::check_rdy(client& cl) {
    if (opts.ledger) opts.ledger->set(&cl, cl.state == cstate::subscribed ? cl.rdy : 0);
    if (!cl.ch) return;
    std::int64_t sum = 0;
    for (auto* o : cl.ch->clients) sum += o->state == cstate::subscribed ? o->rdy : 0;
    peak_rdy = std::max(peak_rdy, sum);
    if (opts.max_channel_rdy > 0 && sum > opts.max_channel_rdy) {
        ++violations;
        log.error("fake-nsqd: sum of RDY over the channel exceeds the limit",
                  {{"sum", sum}, {"limit", opts.max_channel_rdy}});
    }
}

void fake_nsqd::impl::remove_client(client& cl) {
    if (opts.ledger) opts.ledger->remove(&cl);
    if (!cl.ch) return;
    auto& c = *cl.ch;
    std::erase(c.clients, &cl);
    for (auto it = c.in_flight.begin(); it != c.in_flight.end();) {
        if (it->second.owner != &cl) {
            ++it;
            continue;
        }
        if (opts.requeue_on_disconnect) {
            requeue_now(c, std::move(it->second.m));
            it = c.in_flight.erase(it);
        } else {
            it->second.owner = nullptr;  // times out later, as in nsqd
            ++it;
        }
    }
    cl.ch = nullptr;
    if (c.ephemeral() && c.clients.empty() && cl.tp) {
        cl.tp->channels.erase(c.name);
    } else {
        pump(c);
    }
}

void fake_nsqd::impl::close_client(client& cl) {
    if (cl.closed) return;
    cl.closed = true;
    std::error_code ignored;
    cl.sock.shutdown(net::tcp::socket::shutdown_both, ignored);
    cl.sock.close(ignored);
    cl.wake.cancel();
    cl.hb_timer.cancel();
}

}  // namespace cg::test::nsq
