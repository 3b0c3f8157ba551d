#include "net/turn_budget.hpp"

#include <asio/execution_context.hpp>
#include <asio/post.hpp>

namespace cg::net {

class turn_budget_service : public asio::execution_context::service {
  public:
    static asio::execution_context::id id;
    explicit turn_budget_service(asio::execution_context& ctx) : service(ctx) {}
    // Before the scheduler's own shutdown: the queued steps' coroutine frames go while the I/O objects
    // they hold can still be destroyed.
    void shutdown() override { budget.shutdown(); }
    turn_budget budget;
};

asio::execution_context::id turn_budget_service::id;

turn_budget& turn_budget::of(const asio::any_io_executor& ex) {
    auto& ctx = asio::query(ex, asio::execution::context);
    auto& b = asio::use_service<turn_budget_service>(ctx).budget;
    if (!b.ex_) b.ex_ = ex;  // where the drain goes: any executor of this context will do
    return b;
}

void turn_budget::enqueue(std::unique_ptr<step> s) {
    waiting_.push_back(std::move(s));
    ++deferred_;
    if (on_defer_) on_defer_();
    if (!drain_posted_) {
        drain_posted_ = true;
        post_drain();
    }
}

void turn_budget::post_drain() {
    // Posted from a handler on the loop thread: runs after the next poll, i.e. on the next turn.
    asio::post(ex_, [this] { drain(); });
}

void turn_budget::drain() {
    // drain_posted_ stays set while draining: a step queued meanwhile must not post a second drain (two
    // drains a turn would each spend a budget, and each would post another).
    turn_start_ = last_ask_ = clock::now();
    while (!waiting_.empty() && clock::now() - turn_start_ < budget_) {
        auto next = std::move(waiting_.front());
        waiting_.pop_front();
        next->resume();  // resumes the step's coroutine here, until its next suspension
    }
    if (waiting_.empty())
        drain_posted_ = false;
    else
        post_drain();
}

}  // namespace cg::net
