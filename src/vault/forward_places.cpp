// The vault proxy's places among the requests going on to the reservation and the upstream
// (proxy_config::max_forwarding, vault/proxy_state.hpp): taken at once when free, else waited for in arrival
// order until the request's deadline, handed on when dropped.
#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "vault/proxy_state.hpp"

namespace cg::vault {

// A request waiting for a place to forward (proxy::state::forward_waiters): woken by the place handed
// over, or by its deadline. Leaves the queue with its frame if neither came (the loop's shutdown).
struct forward_waiter {
    forward_waiter(proxy::state& s, std::chrono::steady_clock::time_point deadline)
        : st(s), timer(s.main, deadline) {}
    forward_waiter(const forward_waiter&) = delete;
    forward_waiter& operator=(const forward_waiter&) = delete;
    ~forward_waiter() {
        if (admitted) return;
        auto& q = st.forward_waiters;
        if (auto it = std::find(q.begin(), q.end(), this); it != q.end()) q.erase(it);
    }
    proxy::state& st;
    net::steady_timer timer;
    bool admitted = false;  // taken off the queue with the place of a request that left
};

forward_place::~forward_place() {
    if (!st_) return;
    auto& q = st_->forward_waiters;
    if (q.empty()) {
        --st_->forwarding;
        return;
    }
    forward_waiter* w = q.front();
    q.pop_front();
    w->admitted = true;  // the place passes to it: `forwarding` stays
    w->timer.cancel();
}

// A place at once when one is free and nobody waits, else the oldest waiter's turn; an empty place when
// `deadline` passed first.
net::awaitable<forward_place> enter_forwarding(std::shared_ptr<proxy::state> st,
                                               std::chrono::steady_clock::time_point deadline) {
    if (st->forwarding < st->forwarding_capacity && st->forward_waiters.empty()) {
        ++st->forwarding;
        co_return forward_place(std::move(st));
    }
    forward_waiter w(*st, deadline);
    st->forward_waiters.push_back(&w);
    co_await w.timer.async_wait();  // cancelled when admitted; else the deadline
    if (!w.admitted) co_return forward_place();
    co_return forward_place(std::move(st));
}

}  // namespace cg::vault
