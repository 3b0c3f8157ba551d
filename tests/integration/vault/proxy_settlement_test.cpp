// How the proxy writes what Stripe answered (fixture.hpp): after the answer went back, with the key's next
// reservation batch, and at stop; rows left reserved resolved once stale; and the store's cg_vault_step and
// cg_vault_settle_many statements in any order, whole or element by element.
#include <boost/test/unit_test.hpp>
#include <set>

#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(vault_proxy)

BOOST_AUTO_TEST_CASE(the_answer_goes_back_before_the_settlement_is_written_and_stop_writes_it) {
    vault_fixture f(false);
    auto c = f.proxy_config();
    c.settle_linger = 1h;  // no create comes to carry it: only stop() (or a flush) writes it
    f.start(c);
    auto k = f.issue(10'000);
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(700), "answered-first"));
    BOOST_TEST(r.status == 200);
    // The client has its charge; the row still says reserved (and counts against the cap as much as settled).
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'answered-first'") ==
               "reserved");
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 700);
    f.run(f.proxy->stop());  // shutdown (SIGTERM) writes what is queued
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'answered-first'") ==
               "settled");
    BOOST_TEST(f.scalar("SELECT stripe_object_id FROM vault_spend WHERE idempotency_key = 'answered-first'")
                   .starts_with("ch_"));
}

BOOST_AUTO_TEST_CASE(a_release_rides_with_the_next_reservation_of_its_key_and_frees_room_for_it) {
    vault_fixture f(false);
    auto c = f.proxy_config();
    c.settle_linger = 1h;  // the release can only reach PostgreSQL with the next create's batch
    f.start(c);
    auto k = f.issue(1000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_declined");
        co_return;
    }(f.fake.get()));
    BOOST_TEST(
        f.send(f.post(k.secret, "/v1/charges", f.charge_body(800, "cus_declined"), "declined")).status ==
        402);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'declined'") == "reserved");
    // 800 more fits under 1000 only if the release is applied first, in the same step.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(800), "fits")).status == 200);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'declined'") == "released");
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 800);
}

BOOST_AUTO_TEST_CASE(rows_left_reserved_after_the_answer_are_counted_then_resolved_once_stale) {
    // A proxy answers its clients, then loses PostgreSQL before it can write what the answers mean (the same
    // rows a proxy killed between its answer and its settlement leaves behind): they stay `reserved`, keep
    // counting against the cap, and the resolver of any proxy settles or releases them once they are stale.
    vault_fixture f(false);
    auto lost = f.pool_for(f.db.config(), 2);
    auto c = f.proxy_config();
    c.settle_linger = 1h;  // nothing written before PostgreSQL goes away
    f.start(c, lost);
    auto k = f.issue(1000);
    auto k2 = f.issue(1000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_declined");
        co_return;
    }(f.fake.get()));
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(900, "cus_charged"), "charged")).status ==
               200);
    BOOST_TEST(
        f.send(f.post(k2.secret, "/v1/charges", f.charge_body(900, "cus_declined"), "declined")).status ==
        402);
    f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<void> { co_await p->close(); }(lost));
    f.server->stop();
    BOOST_TEST(!f.run(f.proxy->flush_settlements()));  // cannot: PostgreSQL is gone
    f.run(f.proxy->stop());                            // gives up after settle_attempts; rows stay reserved
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE state = 'reserved'") == 2);
    auto dropped = f.vreg.render();
    BOOST_TEST(dropped.find("chargeguard_vault_settlements_dropped_total 2") != std::string::npos, dropped);

    // Another proxy on the same database. Until the rows are resolved they count: 900 + 200 > 1000. The rows'
    // age starts now (the steps above may take longer than the staleness on a loaded machine, and then this
    // proxy's resolver would resolve them before the two requests below could see them counted).
    BOOST_TEST(f.count("WITH t AS (UPDATE vault_spend SET updated_at = now() WHERE state = 'reserved' "
                       "RETURNING 1) SELECT count(*) FROM t") == 2);
    auto c2 = f.proxy_config();
    c2.stale_reserved = 1s;
    f.start(c2);
    auto over = f.send(f.post(k.secret, "/v1/charges", f.charge_body(200), "third"));
    BOOST_TEST(over.status == 402);
    BOOST_TEST(error_code_of(over) == "spend_cap_exceeded");
    BOOST_TEST(f.send(f.post(k2.secret, "/v1/charges", f.charge_body(200), "k2-over")).status == 402);
    // Stale after 1 s: the resolver looks them up on Stripe (both named a customer and carry the tag).
    // The proxy's own background resolver may get to them before the explicit passes below do, so the
    // database says when they are resolved, not the passes' counts.
    auto unresolved = [&f] {
        return f.count(
            "SELECT count(*) FROM vault_spend WHERE idempotency_key IN ('charged', 'declined') AND state = "
            "'reserved'");
    };
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (unresolved() > 0 && std::chrono::steady_clock::now() < deadline) {
        f.pause(50ms);
        f.run(f.proxy->resolve_once());
    }
    BOOST_TEST(unresolved() == 0);
    auto charge_id = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::string> {
        for (const auto& ch : fk->charges())
            if (ch.customer == "cus_charged") co_return ch.id;
        co_return std::string();
    }(f.fake.get()));
    BOOST_TEST(!charge_id.empty());
    BOOST_TEST(f.scalar("SELECT state || ':' || coalesce(stripe_object_id, '') FROM vault_spend WHERE "
                        "idempotency_key = 'charged'") == "settled:" + charge_id);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'declined'") == "released");
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'") == 900);
    BOOST_TEST(f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k2.id + "'") == 0);
    // The room the release freed is usable, and resolving charged nobody again.
    BOOST_TEST(f.send(f.post(k2.secret, "/v1/charges", f.charge_body(900), "k2-fits")).status == 200);
    std::size_t charged = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::size_t> {
        std::size_t n = 0;
        for (const auto& ch : fk->charges()) n += ch.customer == "cus_charged";
        co_return n;
    }(f.fake.get()));
    BOOST_TEST(charged == 1u);
}

BOOST_AUTO_TEST_CASE(step_applies_settlements_in_any_order_with_settled_final_and_counts_exactly) {
    // cg_vault_step straight from the store: a batch may carry an owner's release and a retry's settle of one
    // row in either order; settled wins (Stripe charged it), and committed_cents follows every move.
    vault_fixture f(false);
    auto k = f.issue(10'000);
    auto reserve = [&](std::vector<std::string> idems) {
        std::vector<vault::reserve_request> rs;
        for (auto& i : idems) {
            vault::reserve_request r;
            r.key_id = k.id;
            r.idempotency_key = i;
            r.amount_cents = 1000;
            r.path = "/v1/charges";
            r.body = "amount=1000&currency=usd";
            rs.push_back(r);
        }
        return f.run(f.store->step(k.id, {}, std::move(rs)));
    };
    auto settle = [](std::string idem, std::string state) {
        vault::settlement_request s;
        s.idempotency_key = std::move(idem);
        s.state = std::move(state);
        if (s.state == "settled") s.object_id = "ch_" + s.idempotency_key;
        return s;
    };
    auto committed = [&] {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + k.id + "'");
    };
    auto state_of = [&](const std::string& i) {
        return f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = '" + i + "'");
    };
    auto r = reserve({"a", "b", "c", "d"});
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    BOOST_TEST(committed() == 4000);
    // a: release then settle; b: settle then release; c: released alone; d: uncertain.
    auto s1 =
        f.run(f.store->step(k.id,
                            {settle("a", "released"), settle("a", "settled"), settle("b", "settled"),
                             settle("b", "released"), settle("c", "released"), settle("d", "uncertain")},
                            {}));
    BOOST_TEST_REQUIRE(s1.has_value(), (s1 ? "" : s1.err().describe()));
    BOOST_TEST(state_of("a") == "settled");
    BOOST_TEST(state_of("b") == "settled");
    BOOST_TEST(state_of("c") == "released");
    BOOST_TEST(state_of("d") == "uncertain");
    BOOST_TEST(committed() == 3000);  // a, b settled, d uncertain; c no longer counts
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE stripe_object_id = 'ch_a'") == 1);
    // A retry's 2xx for the released c (Stripe charged it after all): settled, and it counts again. Then an
    // uncertain for a settled row does nothing.
    auto s2 = f.run(f.store->step(k.id, {settle("c", "settled"), settle("a", "uncertain")}, {}));
    BOOST_TEST_REQUIRE(s2.has_value());
    BOOST_TEST(state_of("c") == "settled");
    BOOST_TEST(state_of("a") == "settled");
    BOOST_TEST(committed() == 4000);
    // The counter always equals what the rows say.
    BOOST_TEST(committed() == f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state IN "
                                      "('reserved', 'settled', 'uncertain')"));
}

BOOST_AUTO_TEST_CASE(step_reserves_a_batch_in_order_whether_it_fits_whole_or_element_by_element) {
    // cg_vault_step (0009) inserts a batch that fits under the cap even if every element counted with one
    // statement, and takes the rest (retries, repeats inside the batch) element by element; near the cap the
    // whole batch goes element by element. Either way each outcome and running total is the in-order one.
    vault_fixture f(false);
    using o = vault::reserve_outcome;
    auto req = [](const std::string& key, std::string idem, std::int64_t amount) {
        vault::reserve_request r;
        r.key_id = key;
        r.idempotency_key = std::move(idem);
        r.amount_cents = amount;
        r.path = "/v1/charges";
        r.body = "amount=" + std::to_string(amount) + "&currency=usd";
        return r;
    };
    auto committed = [&](const std::string& key) {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + key + "'");
    };
    auto counted = [&](const std::string& key) {
        return f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE vault_key_id = '" + key +
                       "' AND state IN ('reserved', 'settled', 'uncertain')");
    };
    {
        // Far from the cap: one earlier row still reserved ("old") and one released ("gone").
        auto k = f.issue(100'000);
        auto pre = f.run(f.store->step(k.id, {}, {req(k.id, "old", 1000), req(k.id, "gone", 1000)}));
        BOOST_TEST_REQUIRE(pre.has_value());
        vault::settlement_request rel;
        rel.idempotency_key = "gone";
        rel.state = "released";
        rel.why = "HTTP 402";
        auto r =
            f.run(f.store->step(k.id, {rel},
                                {req(k.id, "n1", 1000), req(k.id, "n2", 1000), req(k.id, "n1", 1000),
                                 req(k.id, "old", 1000), req(k.id, "n1", 2000), req(k.id, "gone", 1500)}));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        BOOST_TEST_REQUIRE(r->size() == 6u);
        std::vector<o> want{o::reserved, o::reserved,        o::existing,
                            o::existing, o::amount_mismatch, o::rereserved};
        std::vector<std::int64_t> totals{2000, 3000, 3000, 3000, 3000, 4500};
        for (std::size_t i = 0; i < 6; ++i) {
            BOOST_TEST((int)(*r)[i].outcome == (int)want[i], "element " << i);
            BOOST_TEST((*r)[i].committed_cents == totals[i], "element " << i);
        }
        BOOST_TEST(committed(k.id) == 4500);
        BOOST_TEST(counted(k.id) == 4500);
        BOOST_TEST(
            f.count("SELECT amount_cents FROM vault_spend WHERE idempotency_key = 'n1' AND vault_key_id = '" +
                    k.id + "'") == 1000);
    }
    {
        // Near the cap: 1000 committed, cap 3500, a batch of four 1000s (one a retry of the existing row).
        auto k = f.issue(3500);
        auto pre = f.run(f.store->step(k.id, {}, {req(k.id, "old", 1000)}));
        BOOST_TEST_REQUIRE(pre.has_value());
        auto r = f.run(f.store->step(
            k.id, {},
            {req(k.id, "x", 1000), req(k.id, "y", 1000), req(k.id, "old", 1000), req(k.id, "z", 1000)}));
        BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
        BOOST_TEST_REQUIRE(r->size() == 4u);
        std::vector<o> want{o::reserved, o::reserved, o::existing, o::cap_exceeded};
        for (std::size_t i = 0; i < 4; ++i) BOOST_TEST((int)(*r)[i].outcome == (int)want[i], "element " << i);
        BOOST_TEST(committed(k.id) == 3000);
        BOOST_TEST(counted(k.id) == 3000);
        BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE vault_key_id = '" + k.id + "'") == 3);
    }
}

BOOST_AUTO_TEST_CASE(settle_many_settles_reserved_and_uncertain_rows_of_any_keys_and_returns_the_rest) {
    // cg_vault_settle_many (0009): the answers that leave the committed total as it is, for rows of several
    // keys, without any key's lock. A released row (a retry's 2xx after the owner's 4xx must count again) or
    // a settled one is not touched and comes back, for the key's step.
    vault_fixture f(false);
    auto k1 = f.issue(10'000);
    auto k2 = f.issue(10'000);
    auto req = [](const std::string& key, std::string idem) {
        vault::reserve_request r;
        r.key_id = key;
        r.idempotency_key = std::move(idem);
        r.amount_cents = 1000;
        r.path = "/v1/charges";
        r.body = "amount=1000&currency=usd";
        return r;
    };
    auto set = [](std::string idem, std::string state) {
        vault::settlement_request s;
        s.idempotency_key = std::move(idem);
        s.state = std::move(state);
        if (s.state == "settled") s.object_id = "ch_first";
        return s;
    };
    BOOST_TEST_REQUIRE(
        f.run(f.store->step(k1.id, {}, {req(k1.id, "a"), req(k1.id, "b"), req(k1.id, "c")})).has_value());
    BOOST_TEST_REQUIRE(f.run(f.store->step(k2.id, {}, {req(k2.id, "a"), req(k2.id, "d")})).has_value());
    BOOST_TEST_REQUIRE(
        f.run(f.store->step(k1.id, {set("b", "uncertain"), set("c", "released")}, {})).has_value());
    BOOST_TEST_REQUIRE(f.run(f.store->step(k2.id, {set("d", "settled")}, {})).has_value());
    auto committed = [&](const std::string& key) {
        return f.count("SELECT committed_cents FROM vault_keys WHERE id = '" + key + "'");
    };
    BOOST_TEST(committed(k1.id) == 2000);
    BOOST_TEST(committed(k2.id) == 2000);
    std::vector<vault::store::keyed_settlement> s{{k2.id, "d", "ch_k2d"},
                                                  {k1.id, "c", "ch_k1c"},
                                                  {k1.id, "a", "ch_k1a"},
                                                  {k2.id, "a", "ch_k2a"},
                                                  {k1.id, "b", "ch_k1b"}};
    auto r = f.run(f.store->settle_many(s));
    BOOST_TEST_REQUIRE(r.has_value(), (r ? "" : r.err().describe()));
    std::set<std::string> back;
    for (auto i : *r) back.insert(s[i].key_id + "/" + s[i].idempotency_key);
    BOOST_TEST((back == std::set<std::string>{k1.id + "/c", k2.id + "/d"}));
    auto row = [&](const std::string& key, const std::string& idem) {
        return f.scalar(
            "SELECT state || ':' || coalesce(stripe_object_id, '') FROM vault_spend WHERE vault_key_id = '" +
            key + "' AND idempotency_key = '" + idem + "'");
    };
    BOOST_TEST(row(k1.id, "a") == "settled:ch_k1a");
    BOOST_TEST(row(k1.id, "b") == "settled:ch_k1b");
    BOOST_TEST(row(k1.id, "c") == "released:");
    BOOST_TEST(row(k2.id, "a") == "settled:ch_k2a");
    BOOST_TEST(row(k2.id, "d") == "settled:ch_first");
    // Nothing moved in or out of the counted states: the totals stand and still equal the rows.
    BOOST_TEST(committed(k1.id) == 2000);
    BOOST_TEST(committed(k2.id) == 2000);
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_spend WHERE state = 'settled' AND next_resolve_at IS NOT NULL") ==
        0);
    BOOST_TEST(committed(k1.id) + committed(k2.id) ==
               f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state IN ('reserved', "
                       "'settled', 'uncertain')"));
}

BOOST_AUTO_TEST_SUITE_END()
