#include "net/offload.hpp"

namespace cg::net {

offload_pool::offload_pool(unsigned threads)
    : ctx_(static_cast<int>(threads ? threads : 1)), work_(ctx_.get_executor()) {
    if (threads == 0) threads = 1;
    threads_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { ctx_.run(); });
}

offload_pool::~offload_pool() {
    stop();
    join();
}

void offload_pool::drain() {
    work_.reset();
}

void offload_pool::stop() {
    work_.reset();
    ctx_.stop();
}

void offload_pool::join() {
    for (auto& t : threads_)
        if (t.joinable()) t.join();
}

}  // namespace cg::net
