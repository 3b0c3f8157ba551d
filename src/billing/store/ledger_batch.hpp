// Group commit for the ledger's hot writes: deliveries that want the same kind of statement while
// the batch slots are busy queue up, and the queued rows go as ONE statement (one transaction, one round
// trip) when a slot frees. Each caller gets its own result once the batch's statement completed, i.e. after
// the transaction holding its row committed (write-before-call holds exactly as for a single statement).
//
//  * a caller that finds a free slot goes at once, unless `linger` says to wait for company: then the slot's
//    statement leaves after that long (or as soon as `max_rows` callers queued). The pipeline sets it to a
//    small fraction of the recent Stripe call time, capped by --group-commit-linger-max, so the wait stays
//    small beside a delivery's Stripe call while it turns a trickle of single-row statements into batches;
//  * at most `max_in_flight` batches of one kind run at once, each on its own pooled connection, so batching
//    only happens when that many statements are already in flight;
//  * a batch holds at most `max_rows` callers and never two with the same key (the later one waits for the
//    next batch, so it sees the earlier one's row exactly as it would after a single statement);
//  * the runner decides each caller's result: a failed statement fails every caller in the batch with its
//    error (they requeue, as after a failed single statement);
//  * a finished batch wakes every caller at once; past the event loop's turn budget the rest resume on the
//    next turn, behind the sockets and timers (net/turn_budget.hpp).
//
// Main executor only (the pool's). A caller whose coroutine is cancelled while waiting gets errc::canceled;
// if its row was already in a batch in flight the statement still completes (its outcome is then unknown to
// the caller, as for a cancelled single statement).
#pragma once

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/log.hpp"
#include "core/result.hpp"
#include "net/tokens.hpp"
#include "net/turn_budget.hpp"
#include "pg/array_literal.hpp"
#include "pg/error.hpp"
#include "pg/pool.hpp"

namespace cg::billing {

struct batch_options {
    bool enabled = true;            // false: every call runs its single-row statement
    std::size_t max_rows = 256;     // callers per statement
    std::size_t max_in_flight = 2;  // batches of one kind running at once (pooled connections)
    // How long a statement that found a free slot waits for more callers (asked once per statement); empty
    // or zero: no wait.
    std::function<std::chrono::microseconds()> linger;
    // Called on the main executor with each batch's row count as it is sent (metrics); may be empty.
    std::function<void(std::size_t rows)> on_statement;
};

// What a batcher did so far (tests and benchmarks read it).
struct batch_counters {
    std::uint64_t statements = 0;  // batches run (each one statement, or single statements after a fallback)
    std::uint64_t rows = 0;        // callers served by them
    std::size_t queued = 0;        // callers waiting for a slot right now
};

// The batched statements' array parameters (pg/array_literal.hpp).
using pg::int_array_literal;
using pg::text_array_literal;

// Runner: a type with
//   static std::string_view key(const Req&);   // no two requests with one key go in the same batch
//   static net::awaitable<std::vector<result<Res>>> run(std::shared_ptr<pg::pool>, std::vector<Req>&);
// `run` returns exactly one result per request, in order.
template <typename Req, typename Res, typename Runner>
class group_commit : public std::enable_shared_from_this<group_commit<Req, Res, Runner>> {
  public:
    group_commit(std::shared_ptr<pg::pool> pool, batch_options opts) : pool_(std::move(pool)), opts_(opts) {
        if (opts_.max_rows == 0) opts_.max_rows = 1;
        if (opts_.max_in_flight == 0) opts_.max_in_flight = 1;
    }

    net::awaitable<result<Res>> submit(Req req) {
        auto ex = co_await asio::this_coro::executor;
        auto w = std::make_shared<waiter>(ex, std::move(req));
        queue_.push_back(w);
        // While a slot waits for company, every newcomer joins it rather than taking the other slot.
        if (in_flight_ < opts_.max_in_flight && !lingering_) {
            ++in_flight_;
            auto wait = opts_.linger ? opts_.linger() : std::chrono::microseconds(0);
            if (wait.count() > 0) lingering_ = std::make_shared<net::steady_timer>(ex, wait);
            asio::co_spawn(ex, drain(this->shared_from_this(), lingering_), [](std::exception_ptr e) {
                // drain() catches what the runner throws; anything else is a bug worth dying for.
                if (e) std::rethrow_exception(e);
            });
        }
        if (lingering_ && queue_.size() >= opts_.max_rows) lingering_->cancel();
        while (!w->out) {
            co_await w->wake.async_wait();
            if (w->out) {
                // A finished statement wakes its whole batch at once: past the loop's turn budget, the rest
                // resume on the next turn, behind the sockets and timers (net/turn_budget.hpp).
                auto& budget = turn_budget_of(ex);
                if (budget.spent()) co_await budget.next_turn();
                break;
            }
            auto cs = co_await asio::this_coro::cancellation_state;
            if (cs.cancelled() != asio::cancellation_type::none) {
                w->abandoned = true;
                co_return error(pg::errc::canceled, "cancelled while waiting for a ledger batch");
            }
        }
        co_return std::move(*w->out);
    }

    batch_counters counters() const noexcept {
        auto c = counters_;
        c.queued = queue_.size();
        return c;
    }

  private:
    net::turn_budget& turn_budget_of(const asio::any_io_executor& ex) {
        if (!budget_) budget_ = &net::turn_budget::of(ex);
        return *budget_;
    }

    struct waiter {
        waiter(const asio::any_io_executor& ex, Req&& r)
            : req(std::move(r)), wake(ex, net::steady_timer::time_point::max()) {}
        Req req;
        std::optional<result<Res>> out;
        net::steady_timer wake;
        bool abandoned = false;
    };
    using waiter_ptr = std::shared_ptr<waiter>;

    // The keys of one batch: open addressing over views of the requests' keys, sized for max_rows once
    // (a node per key in a std::unordered_set would be an allocation per row).
    class key_set {
      public:
        void reset(std::size_t max_rows) {
            std::size_t n = 16;
            while (n < 2 * max_rows) n *= 2;
            if (slots_.size() != n) slots_.assign(n, std::nullopt);
            for (auto i : used_) slots_[i].reset();
            used_.clear();
        }
        bool insert(std::string_view k) {
            auto mask = slots_.size() - 1;
            auto hash = std::hash<std::string_view>{}(k);
            for (auto i = hash & mask;; i = (i + 1) & mask) {
                if (!slots_[i]) {
                    slots_[i] = k;
                    used_.push_back(i);
                    return true;
                }
                if (*slots_[i] == k) return false;
            }
        }

      private:
        std::vector<std::optional<std::string_view>> slots_;
        std::vector<std::size_t> used_;
    };

    // The next batch: queued callers in arrival order, skipping abandoned ones and leaving a key already in
    // the batch for the next one.
    std::vector<waiter_ptr> take_batch() {
        std::vector<waiter_ptr> batch;
        batch.reserve(std::min(queue_.size(), opts_.max_rows));
        auto& keys = batch_keys_;
        keys.reset(opts_.max_rows);
        std::deque<waiter_ptr> later;
        while (!queue_.empty() && batch.size() < opts_.max_rows) {
            auto w = std::move(queue_.front());
            queue_.pop_front();
            if (w->abandoned) continue;
            if (!keys.insert(Runner::key(w->req))) {
                later.push_back(std::move(w));
                continue;
            }
            batch.push_back(std::move(w));
        }
        for (auto it = later.rbegin(); it != later.rend(); ++it) queue_.push_front(std::move(*it));
        return batch;
    }

    // `linger`: the slot was free and waits this timer for company first (cancelled once max_rows queued).
    static net::awaitable<void> drain(std::shared_ptr<group_commit> self,
                                      std::shared_ptr<net::steady_timer> linger) {
        if (linger) {
            if (self->queue_.size() < self->opts_.max_rows) co_await linger->async_wait();
            self->lingering_.reset();
        }
        for (;;) {
            auto batch = self->take_batch();
            if (batch.empty()) {
                --self->in_flight_;
                co_return;
            }
            ++self->counters_.statements;
            self->counters_.rows += batch.size();
            if (self->opts_.on_statement) self->opts_.on_statement(batch.size());
            std::vector<Req> reqs;
            reqs.reserve(batch.size());
            for (auto& w : batch) reqs.push_back(std::move(w->req));  // the waiter needs only its result now
            std::vector<result<Res>> outs;
            try {
                outs = co_await Runner::run(self->pool_, reqs);
            } catch (const std::exception& e) {
                // A broken invariant (schema and code disagree): every caller fails rather than hangs.
                outs.clear();
                for (std::size_t i = 0; i < batch.size(); ++i)
                    outs.push_back(error(pg::errc::protocol_error, std::string("ledger batch: ") + e.what()));
            }
            for (std::size_t i = 0; i < batch.size(); ++i) {
                if (i < outs.size())
                    batch[i]->out.emplace(std::move(outs[i]));
                else
                    batch[i]->out.emplace(error(pg::errc::protocol_error, "ledger batch: no result"));
            }
            // Every result is in place before the first caller resumes.
            for (auto& w : batch) w->wake.cancel();
        }
    }

    std::shared_ptr<pg::pool> pool_;
    batch_options opts_;
    std::deque<waiter_ptr> queue_;
    std::size_t in_flight_ = 0;
    std::shared_ptr<net::steady_timer> lingering_;  // the slot waiting for company, if any
    batch_counters counters_;
    net::turn_budget* budget_ = nullptr;  // the main loop's, found on first use
    key_set batch_keys_;                  // take_batch()'s, kept between batches
};

}  // namespace cg::billing
