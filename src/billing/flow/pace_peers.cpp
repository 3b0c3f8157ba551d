#include "billing/flow/pace_peers.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <random>

#include "net/stoppable_task.hpp"
#include "pg/array_literal.hpp"

namespace cg::billing {

namespace {

// $1 peer, $2 accounts, $3 pressed, $4 sent_rps, $5 account_limit, $6 episodes (arrays, one element per
// account), $7 expiry in ms. The SELECT sees the table as it was before the statement: this process's own
// rows are not among the answers (the caller adds itself).
const std::string exchange_sql =
    "WITH mine AS (SELECT * FROM unnest($2::text[], $3::text[]::boolean[], $4::text[]::float8[], "
    "$5::text[]::float8[], $6::int8[]) AS m(account, pressed, sent_rps, account_limit, episodes)), "
    "up AS (INSERT INTO stripe_pace_peers AS p (account, peer, pressed, sent_rps, account_limit, episodes, "
    "expires_at) SELECT account, $1, pressed, sent_rps, account_limit, episodes, "
    "now() + $7::int8 * interval '1 millisecond' FROM mine "
    "ON CONFLICT (account, peer) DO UPDATE SET pressed = excluded.pressed, sent_rps = excluded.sent_rps, "
    "account_limit = excluded.account_limit, episodes = excluded.episodes, expires_at = excluded.expires_at "
    "RETURNING 1), "
    "gone AS (DELETE FROM stripe_pace_peers WHERE expires_at < now() RETURNING 1) "
    "SELECT p.account, p.peer, p.pressed, p.sent_rps::text, p.account_limit::text, p.episodes "
    "FROM stripe_pace_peers p JOIN mine m USING (account) WHERE p.peer <> $1 AND p.expires_at >= now()";

std::string number(double v) {
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    if (std::isnan(v)) return "0";
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc() ? std::string(buf, end) : std::string("0");
}

double parse_number(std::string_view s) {
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    double v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() ? v : 0;
}

}  // namespace

pace_peers::pace_peers(std::shared_ptr<pg::pool> pool, std::string peer, std::chrono::milliseconds expiry,
                       std::chrono::milliseconds acquire_within)
    : pool_(std::move(pool)), peer_(std::move(peer)), expiry_(expiry), acquire_within_(acquire_within) {}

std::string pace_peers::random_id() {
    std::random_device rd;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    return buf;
}

net::awaitable<result<std::vector<stripe::client::pace_view>>> pace_peers::exchange(
    std::vector<stripe::client::pace_report> mine) {
    std::vector<std::string> accounts, pressed, sent, limits;
    std::vector<std::int64_t> episodes;
    for (auto& m : mine) {
        accounts.push_back(m.account);
        pressed.push_back(m.report.load.pressed ? "t" : "f");
        sent.push_back(number(m.report.load.sent_rps));
        limits.push_back(number(m.report.account_limit));
        episodes.push_back(static_cast<std::int64_t>(m.report.episodes));
    }
    std::vector<stripe::client::pace_view> out;
    if (mine.empty()) co_return out;
    auto c = co_await pool_->acquire_until(pg::acquire_mode::fail_fast,
                                           std::chrono::steady_clock::now() + acquire_within_);
    if (!c) co_return c.err();
    auto r = co_await (*c)->query_with(
        exchange_sql,
        pg::params(peer_, pg::text_array_literal(accounts), pg::text_array_literal(pressed),
                   pg::text_array_literal(sent), pg::text_array_literal(limits),
                   pg::int_array_literal(episodes), static_cast<std::int64_t>(expiry_.count())),
        expiry_);
    if (!r) co_return r.err();
    // Every account this process paces, its peers and itself in the order of their ids.
    std::map<std::string, std::map<std::string, stripe::peer_view>> by_account;
    for (auto& m : mine) by_account[m.account][peer_] = {m.report.load, m.report.account_limit, false};
    for (std::size_t i = 0; i < r->size(); ++i) {
        auto row = (*r)[i];
        auto account = row.get<std::string>(0);
        auto peer = row.get<std::string>(1);
        stripe::peer_view v;
        v.load.pressed = row.get<bool>(2);
        v.load.sent_rps = parse_number(row.get<std::string_view>(3));
        v.account_limit = parse_number(row.get<std::string_view>(4));
        auto ep = row.get<std::int64_t>(5);
        auto& seen = seen_[{account, peer}];
        v.throttled_since = ep > seen;
        seen = ep;
        by_account[account][peer] = v;
    }
    for (auto& [account, peers] : by_account) {
        stripe::client::pace_view view;
        view.account = account;
        for (auto& [id, v] : peers) {
            if (id == peer_) view.self = view.peers.size();
            view.peers.push_back(v);
        }
        out.push_back(std::move(view));
    }
    co_return out;
}

net::awaitable<result<void>> pace_peers::leave() {
    auto c = co_await pool_->acquire_until(pg::acquire_mode::fail_fast,
                                           std::chrono::steady_clock::now() + acquire_within_);
    if (!c) co_return c.err();
    auto r = co_await (*c)->query_with("DELETE FROM stripe_pace_peers WHERE peer = $1", pg::params(peer_),
                                       expiry_);
    if (!r) co_return r.err();
    co_return result<void>{};
}

struct pace_peers_loop::state {
    pace_peers peers;
    stripe::client* client;
    logger log;
    std::chrono::milliseconds interval, expiry;
    std::chrono::steady_clock::time_point last_ok = std::chrono::steady_clock::now();
    bool alone = true;    // each pacer on its own law
    bool warned = false;  // the failed exchange was logged
    net::stoppable_task task;
    state(std::shared_ptr<pg::pool> pool, stripe::client& c, logger l, std::chrono::milliseconds i,
          std::chrono::milliseconds e)
        : peers(std::move(pool), pace_peers::random_id(), e, i),
          client(&c),
          log(std::move(l)),
          interval(i),
          expiry(e) {}
};

namespace {

// One exchange with the peers: their reports applied to this sidecar's pacers, or each pacer on its own law
// once no exchange has worked for the expiry.
net::awaitable<bool> pace_pass(std::shared_ptr<pace_peers_loop::state> st) {
    using clock = std::chrono::steady_clock;
    auto started = clock::now();
    auto mine = co_await st->client->pace_reports();
    auto views = co_await st->peers.exchange(std::move(mine));
    auto now = clock::now();
    if (views && now - started <= st->expiry) {
        st->last_ok = now;
        st->alone = false;
        st->warned = false;
        co_await st->client->apply_pace(std::move(*views));
    } else if (now - st->last_ok > st->expiry) {
        if (!st->alone) co_await st->client->apply_pace({});  // each pacer on its own law
        st->alone = true;
        if (!st->warned) {
            st->log.warn(
                "stripe pace peers: no exchange, pacing alone",
                {{"error", views ? std::string("exchange slower than the expiry") : views.err().describe()}});
            st->warned = true;
        }
    }
    co_return true;
}

}  // namespace

std::shared_ptr<pace_peers_loop> pace_peers_loop::start(asio::any_io_executor ex,
                                                        std::shared_ptr<pg::pool> pool,
                                                        stripe::client& client, logger log,
                                                        std::chrono::milliseconds interval,
                                                        std::chrono::milliseconds expiry) {
    auto l = std::shared_ptr<pace_peers_loop>(new pace_peers_loop());
    l->st_ = std::make_shared<state>(std::move(pool), client, log, interval, expiry);
    net::job_spec job;
    job.name = "stripe pace peers";
    job.interval = interval;
    job.first_after = std::chrono::milliseconds(0);
    l->st_->task.start_job(
        std::move(ex), l->st_, std::move(job), [st = l->st_] { return pace_pass(st); }, std::move(log));
    return l;
}

pace_peers_loop::~pace_peers_loop() {
    if (st_) st_->task.request_stop();
}

net::awaitable<void> pace_peers_loop::stop() {
    auto st = st_;
    co_await st->task.stop();
    // Leaving at once spares the peers an expiry of sharing with a sidecar that is gone.
    (void)co_await st->peers.leave();
}

}  // namespace cg::billing
