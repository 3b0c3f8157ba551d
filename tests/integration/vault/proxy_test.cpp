// The proxy's per-request behaviour against real PostgreSQL and fake-stripe over TLS (fixture.hpp).
#include <boost/test/unit_test.hpp>
#include <set>

#include "net/tls.hpp"
#include "stripe/json.hpp"
#include "tests/integration/vault/fixture.hpp"

using namespace cg;
using namespace cg::test;
using namespace std::chrono_literals;

namespace {

std::string error_code_of(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return e ? e->code : "(no error object)";
}
std::string error_type_of(const http::response& r) {
    auto e = stripe::parse_error(r.body);
    return e ? e->type : "(no error object)";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vault_proxy)

BOOST_AUTO_TEST_CASE(two_hundred_concurrent_creates_race_a_cap_of_fifty) {
    vault_fixture f(false);
    // Up to 128 TLS handshakes at once on the test thread (the fake and both replicas share it): under ASan
    // on a loaded machine some took more than a second (502, released: the cap held, but the counts were
    // off).
    f.upstream_connect_timeout = 5s;
    f.start(f.proxy_config());
    const std::int64_t amount = 1234;
    auto k = f.issue(50 * amount);
    // Two proxy replicas on one database, half the requests each: each replica batches its own creates, so
    // only PostgreSQL (the key's row lock in cg_vault_reserve_many) stands between them and the cap.
    auto& replica = f.start_second();
    std::vector<http::request> qs;
    for (int i = 0; i < 200; ++i)
        qs.push_back(f.post(k.secret, "/v1/charges", f.charge_body(amount), "race-" + std::to_string(i)));
    auto rs = f.send_all(std::move(qs), &replica);
    int ok = 0, capped = 0, other = 0;
    std::string others;
    for (const auto& r : rs) {
        if (r.status == 200) {
            ++ok;
        } else if (r.status == 402 && error_code_of(r) == "spend_cap_exceeded") {
            ++capped;
        } else {
            ++other;
            others += std::to_string(r.status) + " " + error_code_of(r) + "; ";
        }
    }
    BOOST_TEST(ok == 50);
    BOOST_TEST(capped == 150);
    BOOST_TEST(other == 0, others);
    BOOST_TEST(f.fake_charges() == 50u);  // exactly 50 reached Stripe
    // At the database: settled never above the cap, nothing left reserved.
    f.settle_now();
    auto key = "'" + k.id + "'";
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled' AND "
                       "vault_key_id = " +
                       key) == 50 * amount);
    BOOST_TEST(
        f.count("SELECT count(*) FROM vault_spend WHERE state <> 'settled' AND vault_key_id = " + key) == 0);
    BOOST_TEST(f.count("SELECT cap_cents FROM vault_keys WHERE id = " + key) == 50 * amount);
    // The refusal is Stripe-shaped: 402, invalid_request_error, spend_cap_exceeded, no retry.
    for (const auto& r : rs)
        if (r.status == 402) {
            BOOST_TEST(error_type_of(r) == "invalid_request_error");
            BOOST_TEST(r.headers.get("Stripe-Should-Retry").value_or("") == "false");
            BOOST_TEST(r.headers.get("Request-Id").has_value());
            break;
        }
}

BOOST_AUTO_TEST_CASE(one_idempotency_key_sent_ten_times_concurrently_counts_once) {
    vault_fixture f;
    auto k = f.issue(100'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().latency_ms = 50;  // the first is still executing when the others arrive
        co_return;
    }(f.fake.get()));
    std::vector<http::request> qs;
    for (int i = 0; i < 10; ++i)
        qs.push_back(f.post(k.secret, "/v1/charges", f.charge_body(700), "same-key"));
    auto rs = f.send_all(std::move(qs));
    int ok = 0;
    for (const auto& r : rs) {
        BOOST_TEST((r.status == 200 || r.status == 409), r.status << " " << r.body);
        ok += r.status == 200;
    }
    BOOST_TEST(ok >= 1);
    // And ten more, one after another: Stripe replays; the vault still counts once.
    for (int i = 0; i < 10; ++i) {
        auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(700), "same-key"));
        BOOST_TEST(r.status == 200);
        BOOST_TEST(r.headers.get("Idempotent-Replayed").value_or("") == "true");
    }
    BOOST_TEST(f.fake_charges() == 1u);
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend") == 1);
    BOOST_TEST(f.scalar("SELECT state || ':' || amount_cents FROM vault_spend") == "settled:700");
}

BOOST_AUTO_TEST_CASE(revoked_and_expired_keys_get_401_and_nothing_is_forwarded) {
    vault_fixture f;
    auto k = f.issue(100'000);
    auto q = f.post(k.secret, "/v1/charges", f.charge_body(500), "before-revoke");
    BOOST_TEST(f.send(q).status == 200);
    BOOST_TEST(f.run(f.store->revoke(k.id)).value());
    auto before = f.fake_requests();
    auto replay = f.send(q);  // the same request, now with a revoked key
    BOOST_TEST(replay.status == 401);
    BOOST_TEST(error_type_of(replay) == "invalid_request_error");
    // Reads use the proxy's key cache (1 s): refused once it has expired.
    f.pause(1100ms);
    auto read = f.send(f.get(k.secret, "/v1/charges?customer=cus_vault"));
    BOOST_TEST(read.status == 401);

    auto e = f.issue(100'000);
    f.scalar(
        "UPDATE vault_keys SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 "
        "hour' "
        "WHERE id = '" +
        e.id + "' RETURNING id");
    auto expired = f.send(f.post(e.secret, "/v1/charges", f.charge_body(500), "expired"));
    BOOST_TEST(expired.status == 401);
    BOOST_TEST(error_type_of(expired) == "invalid_request_error");
    BOOST_TEST(f.fake_requests() == before);
}

BOOST_AUTO_TEST_CASE(unknown_wrong_and_missing_secrets_get_401) {
    vault_fixture f;
    auto k = f.issue(100'000);
    std::string wrong = k.secret;
    wrong.back() = wrong.back() == '0' ? '1' : '0';
    auto other = vault::issue_secret();
    for (const std::string& s : {wrong, other->secret, std::string("sk_test_direct"), std::string()}) {
        auto r = f.send(f.post(s, "/v1/charges", f.charge_body(500), "k"));
        BOOST_TEST(r.status == 401, s);
        BOOST_TEST(error_type_of(r) == "invalid_request_error");
    }
    BOOST_TEST(f.fake_requests() == 0u);
}

BOOST_AUTO_TEST_CASE(endpoints_outside_the_allow_list_get_403) {
    vault_fixture f;
    auto k = f.issue(100'000, "charges.create");
    for (auto q :
         {f.post(k.secret, "/v1/payment_intents", f.charge_body(500), "pi"), f.get(k.secret, "/v1/charges"),
          f.post(k.secret, "/v1/refunds", "charge=ch_1", "refund"),
          f.post(k.secret, "/v1/charges/ch_1/capture", "", "capture"), f.get(k.secret, "/v1/customers")}) {
        auto r = f.send(q);
        BOOST_TEST(r.status == 403, q.method << " " << q.target);
        BOOST_TEST(error_type_of(r) == "invalid_request_error");
    }
    BOOST_TEST(f.fake_requests() == 0u);
}

BOOST_AUTO_TEST_CASE(bad_requests_get_400_or_413_and_nothing_is_forwarded) {
    vault_fixture f;
    auto k = f.issue(100'000);
    struct row {
        http::request q;
        int status;
        const char* code;
    };
    std::vector<row> rows{
        {f.post(k.secret, "/v1/charges", f.charge_body(500), ""), 400, "idempotency_key_required"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500), std::string(256, 'k')), 400,
         "idempotency_key_required"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500, "cus_vault", "eur"), "eur"), 400,
         "currency_mismatch"},
        {f.post(k.secret, "/v1/charges", "amount=abc&currency=usd", "abc"), 400, "parameter_invalid_integer"},
        {f.post(k.secret, "/v1/charges", "currency=usd", "noamount"), 400, "parameter_missing"},
        {f.post(k.secret, "/v1/charges", "amount=%zz&currency=usd", "badform"), 400, ""},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&description=" + std::string(70 * 1024, 'x'),
                "huge"),
         413, "request_too_large"},
    };
    for (auto& r : rows) {
        auto resp = f.send(r.q);
        BOOST_TEST(resp.status == r.status, r.code);
        BOOST_TEST(error_code_of(resp) == r.code);
    }
    // Far past the listener's own limit: the HTTP layer refuses it before any handler.
    auto giant = f.send(f.post(k.secret, "/v1/charges", std::string(2 * 1024 * 1024, 'x'), "giant"));
    BOOST_TEST(giant.status == 413);
    // Same key, another amount: refused as Stripe would, without asking Stripe.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(500), "amount-once")).status == 200);
    auto before = f.fake_requests();
    auto mismatch = f.send(f.post(k.secret, "/v1/charges", f.charge_body(600), "amount-once"));
    BOOST_TEST(mismatch.status == 400);
    BOOST_TEST(error_type_of(mismatch) == "idempotency_error");
    BOOST_TEST(f.fake_requests() == before);
    BOOST_TEST(f.fake_charges() == 1u);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend") == 1);
}

BOOST_AUTO_TEST_CASE(creates_stripe_could_read_otherwise_than_the_vault_are_refused_before_stripe) {
    // Stripe executes what its own (Rack-style) parser reads, from the body and the query string alike; the
    // vault counts, tags and stores only what it parsed from the body. Anything that could differ is refused.
    vault_fixture f;
    auto k = f.issue(100'000);
    auto with_content_type = [&](std::string type, std::string idem) {
        http::request q;
        q.method = "POST";
        q.target = "/v1/charges";
        q.body = f.charge_body(500);
        q.headers.add("Authorization", "Bearer " + k.secret);
        q.headers.add("Idempotency-Key", std::move(idem));
        if (!type.empty()) q.headers.add("Content-Type", std::move(type));
        return q;
    };
    std::string fifty;
    for (int i = 0; i < 49; ++i) fifty += "&metadata[m" + std::to_string(i) + "]=v";  // + billing_key = 50
    struct row {
        http::request q;
        const char* param;
    };
    std::vector<row> rows{
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&metadata[cg_vault_idempotency_key]=other",
                "tag"),
         "metadata[cg_vault_idempotency_key]"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&metadata%5Bcg_vault_idempotency_key%5D%5D=x",
                "tag-alias"),
         "metadata[cg_vault_idempotency_key]"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + fifty, "fifty"), "metadata"},
        {f.post(k.secret, "/v1/charges?amount=99999", f.charge_body(500), "query"), ""},
        {f.post(k.secret, "/v1/charges?expand[]=customer", f.charge_body(500), "query-expand"), ""},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&amount]=99999", "amount-alias"), "amount"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&[amount=99999", "amount-alias-2"), "amount"},
        {f.post(k.secret, "/v1/charges", f.charge_body(500) + "&amount[]=99999", "amount-list"), "amount"},
        {f.post(k.secret, "/v1/payment_intents", f.charge_body(500) + "&customer[x]=cus_other",
                "customer-alias"),
         "customer"},
        {with_content_type("application/json", "json"), "Content-Type"},
        {with_content_type("text/plain; charset=utf-8", "text"), "Content-Type"},
    };
    for (auto& r : rows) {
        auto what = r.q.target + " " + r.q.body.substr(r.q.body.size() > 60 ? r.q.body.size() - 60 : 0);
        auto resp = f.send(r.q);
        BOOST_TEST(resp.status == 400, what);
        BOOST_TEST(error_type_of(resp) == "invalid_request_error", what);
        // Stripe's code for parameters it does not take where they were sent; none (Stripe's error object
        // leaves code out when no code of its list fits) for the rest.
        BOOST_TEST(
            error_code_of(resp) == (r.q.target.find('?') != std::string::npos ? "parameter_unknown" : ""),
            what);
        auto e = stripe::parse_error(resp.body);
        BOOST_TEST((e ? e->param : "(none)") == r.param, what);
    }
    BOOST_TEST(f.fake_requests() == 0u);
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend") == 0);

    // What may pass: a charset parameter, no Content-Type (the proxy adds the form type), 49 metadata keys of
    // the client's (with billing_key). Each charge carries exactly the vault's tag with its own key.
    BOOST_TEST(
        f.send(with_content_type("application/x-www-form-urlencoded; charset=utf-8", "charset")).status ==
        200);
    BOOST_TEST(f.send(with_content_type("", "none")).status == 200);
    std::string forty_nine = fifty.substr(0, fifty.rfind('&'));
    BOOST_TEST(
        f.send(f.post(k.secret, "/v1/charges", f.charge_body(500) + forty_nine, "forty-nine")).status == 200);
    auto tags = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::vector<std::string>> {
        std::vector<std::string> out;
        for (const auto& c : fk->charges()) {
            std::string t;
            for (const auto& [mk, mv] : c.metadata)
                if (mk == "cg_vault_idempotency_key") t += (t.empty() ? "" : ",") + mv;
            out.push_back(t + "/" + std::to_string(c.metadata.size()));
        }
        co_return out;
    }(f.fake.get()));
    BOOST_TEST((tags == std::vector<std::string>{"charset/2", "none/2", "forty-nine/50"}));
}

BOOST_AUTO_TEST_CASE(upstream_500_leaves_the_row_uncertain_and_counted_until_the_resolver_settles_it) {
    vault_fixture f;
    auto k = f.issue(1000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().fail_after_create =
            1;  // Stripe created the charge, then answered 500 (and saved the 500)
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(600), "five-hundred"));
    BOOST_TEST(r.status == 500);  // Stripe's answer, unchanged
    BOOST_TEST(error_type_of(r) == "api_error");
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'five-hundred'") ==
               "uncertain");
    // Still counted: 600 + 600 > 1000.
    auto over = f.send(f.post(k.secret, "/v1/charges", f.charge_body(600), "second"));
    BOOST_TEST(over.status == 402);
    // The resolver replays (Stripe answers its saved 500 again, replayed) and then finds the charge by the
    // tag.
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'five-hundred'") == "settled");
    auto charge_id = f.run([](fake::fake_stripe* fk) -> net::awaitable<std::string> {
        co_return fk->charges().at(0).id;
    }(f.fake.get()));
    BOOST_TEST(f.scalar("SELECT stripe_object_id FROM vault_spend WHERE idempotency_key = 'five-hundred'") ==
               charge_id);
    BOOST_TEST(f.fake_charges() == 1u);  // resolving never charged again
}

BOOST_AUTO_TEST_CASE(a_dropped_connection_after_the_charge_is_uncertain_then_settled_by_replay) {
    vault_fixture f;
    auto k = f.issue(10'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().drop_after_create = 1;  // charged, 200 saved, connection dropped before the answer
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(900, "cus_nocustomer_search"), "dropped"));
    BOOST_TEST(r.status == 504);
    BOOST_TEST(error_code_of(r) == "upstream_timeout");
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'dropped'") == "uncertain");
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'dropped'") == "settled");
    BOOST_TEST(f.fake_charges() == 1u);
}

BOOST_AUTO_TEST_CASE(an_upstream_stall_past_the_timeout_is_uncertain) {
    vault_fixture f(false);
    auto c = f.proxy_config();
    // The resolver's replay below runs under the same timeout: long enough for a new TLS connection under
    // ASan on a loaded machine (at 300 ms the replay timed out there and the row stayed uncertain).
    c.request_timeout = 1500ms;
    f.start(c);
    auto k = f.issue(10'000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().stall_ms = 3000;
        fk->faults().stall_count = 1;
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(900), "stalled"));
    BOOST_TEST(r.status == 504);
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'stalled'") == "uncertain");
    BOOST_TEST(
        f.count(
            "SELECT sum(amount_cents) FROM vault_spend WHERE state IN ('reserved','settled','uncertain')") ==
        900);
    // Once Stripe has finished (the stalled request completes on the fake), a replay settles it.
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (f.fake_charges() == 0 && std::chrono::steady_clock::now() < deadline) f.pause(20ms);
    BOOST_TEST_REQUIRE(f.fake_charges() == 1u);
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'stalled'") == "settled");
    BOOST_TEST(f.fake_charges() == 1u);
}

// A checked request past proxy_config::max_forwarding waits for a place before it reserves or sends
// anything. Here the one place is held by a create whose reservation waits on its key's row lock (another
// transaction holds it): a second create is answered once its request timeout passes, as a request that
// found no upstream connection in time is — 502, Stripe-Should-Retry: true — with nothing reserved and
// nothing sent for it; the first goes on once the lock is released, and the second's retry is charged.
BOOST_AUTO_TEST_CASE(a_create_past_the_forwarding_bound_waits_unreserved_and_times_out_as_502_retry) {
    vault_fixture f(false);
    auto c = f.proxy_config();
    c.max_forwarding = 1;
    c.request_timeout = 1000ms;
    f.start(c);
    auto k = f.issue(100'000);
    auto locker = f.pool_for(f.db.config(), 1);
    auto lock = f.run([](std::shared_ptr<pg::pool> p,
                         std::string id) -> net::awaitable<result<pg::pooled_connection>> {
        auto conn = co_await p->acquire();
        if (!conn) co_return conn.err();
        if (auto b = co_await (**conn).query("BEGIN"); !b) co_return b.err();
        if (auto l = co_await (**conn).query("SELECT id FROM vault_keys WHERE id = $1 FOR UPDATE", id); !l)
            co_return l.err();
        co_return std::move(*conn);
    }(locker, k.id));
    BOOST_TEST_REQUIRE(lock.has_value(), (lock ? "" : lock.err().describe()));

    struct answer {
        http::response resp;
        bool done = false;
    };
    auto send = [&f](http::request q) {
        auto a = std::make_shared<answer>();
        asio::co_spawn(f.io, vault_fixture::one(f.caller.get(), std::move(q)),
                       [a](std::exception_ptr e, http::client_result r) {
                           a->resp = e || !r.ok() ? http::response{} : std::move(r.resp);
                           a->done = true;
                       });
        return a;
    };
    auto first = send(f.post(k.secret, "/v1/charges", f.charge_body(500), "holds-the-place"));
    // The first create's reservation waits on the lock (seen from another connection): it holds the place.
    auto until = std::chrono::steady_clock::now() + 15s;
    while (f.count("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = "
                   "current_database()") == 0 &&
           std::chrono::steady_clock::now() < until)
        f.pause(5ms);
    BOOST_TEST_REQUIRE(!first->done);
    auto second = send(f.post(k.secret, "/v1/charges", f.charge_body(700), "waits-for-a-place"));
    run_until_done(f.io, second->done, 20s);
    BOOST_TEST_REQUIRE(second->done);
    BOOST_TEST(second->resp.status == 502, second->resp.status << " " << second->resp.body);
    BOOST_TEST(second->resp.headers.get("Stripe-Should-Retry").value_or("") == "true");
    BOOST_TEST(!first->done);
    BOOST_TEST(f.fake_requests() == 0u);

    auto released = f.run([](pg::pooled_connection* conn) -> net::awaitable<bool> {
        auto r = co_await (**conn).query("ROLLBACK");
        conn->release();
        co_return r.has_value();
    }(&*lock));
    BOOST_TEST(released);
    run_until_done(f.io, first->done, 20s);
    BOOST_TEST_REQUIRE(first->done);
    BOOST_TEST(first->resp.status == 200, first->resp.status << " " << first->resp.body);
    f.settle_now();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend WHERE idempotency_key = 'waits-for-a-place'") == 0);
    BOOST_TEST(f.fake_charges() == 1u);
    // The client retries as told: charged and counted once.
    auto again = f.send(f.post(k.secret, "/v1/charges", f.charge_body(700), "waits-for-a-place"));
    BOOST_TEST(again.status == 200, again.status << " " << again.body);
    f.settle_now();
    BOOST_TEST(f.count("SELECT coalesce(sum(amount_cents), 0) FROM vault_spend WHERE state = 'settled'") ==
               1200);
    BOOST_TEST(f.fake_charges() == 2u);
    f.run(locker->close());
}

// Requests for a key whose row is not cached share one read of it: with the proxy's only PostgreSQL
// connection held elsewhere, a burst of reads of an uncached key queues one acquire at the pool, not one per
// request, and every request gets the answer once the connection is free.
BOOST_AUTO_TEST_CASE(a_burst_on_an_uncached_key_reads_its_row_once) {
    vault_fixture f(false);
    auto k = f.issue(100'000);
    pg::pool_options o;
    o.server = f.db.config();
    o.size = 1;
    o.acquire_timeout = 30s;  // the test holds the connection while the burst arrives
    o.server.connect_timeout = 15s;
    auto one_conn = pg::pool::create(f.io.get_executor(), f.pool.get_executor(), std::move(o), f.log);
    auto c = f.proxy_config();
    c.gauge_interval = 1h;  // no background statement queues behind the held connection
    f.start(c, one_conn);
    auto held = f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<result<pg::pooled_connection>> {
        co_return co_await p->acquire();
    }(one_conn));
    BOOST_TEST_REQUIRE(held.has_value(), (held ? "" : held.err().describe()));
    // The proxy's background tasks' first statements (resolver, gauges) queue behind it too.
    f.pause(300ms);
    const auto background = one_conn->state().waiting;
    std::vector<http::request> qs;
    for (int i = 0; i < 6; ++i) qs.push_back(f.get(k.secret, "/v1/charges/ch_missing_" + std::to_string(i)));
    struct shared {
        std::vector<int> statuses;
        std::size_t left = 6;
        bool done = false;
    };
    auto st = std::make_shared<shared>();
    st->statuses.resize(6);
    for (std::size_t i = 0; i < qs.size(); ++i)
        asio::co_spawn(f.io, vault_fixture::one(f.caller.get(), std::move(qs[i])),
                       [st, i](std::exception_ptr e, http::client_result r) {
                           st->statuses[i] = e || !r.ok() ? 0 : r.resp.status;
                           if (--st->left == 0) st->done = true;
                       });
    auto until = std::chrono::steady_clock::now() + 15s;
    while (one_conn->state().waiting == background && std::chrono::steady_clock::now() < until) f.pause(5ms);
    BOOST_TEST_REQUIRE(one_conn->state().waiting > background);
    f.pause(300ms);  // the rest of the burst arrives
    BOOST_TEST(one_conn->state().waiting == background + 1);
    BOOST_TEST(!st->done);
    held->release();
    run_until_done(f.io, st->done, 20s);
    BOOST_TEST_REQUIRE(st->done);
    for (int status : st->statuses) BOOST_TEST(status == 404);  // fake-stripe: no such charge
    f.server->stop();
    f.run([](vault::proxy* p) -> net::awaitable<void> { co_await p->stop(); }(f.proxy.get()));
    f.proxy.reset();
    f.run(one_conn->close());
}

BOOST_AUTO_TEST_CASE(postgres_unreachable_gives_503_and_stripe_sees_nothing) {
    vault_fixture f(false);
    auto k = f.issue(10'000);
    // A pool whose server does not listen: PostgreSQL is down as far as this proxy can tell.
    auto dead = f.pool_for(server_config("host=127.0.0.1 port=1 dbname=nothing"), 2);
    f.start(f.proxy_config(), dead);
    for (auto q :
         {f.post(k.secret, "/v1/charges", f.charge_body(500), "pg-down"), f.get(k.secret, "/v1/charges")}) {
        auto r = f.send(q);
        BOOST_TEST(r.status == 503);
        BOOST_TEST(error_type_of(r) == "api_error");
        BOOST_TEST(r.headers.get("Stripe-Should-Retry").value_or("") == "true");
    }
    BOOST_TEST(f.fake_requests() == 0u);
    f.run([](std::shared_ptr<pg::pool> p) -> net::awaitable<void> { co_await p->close(); }(dead));
}

BOOST_AUTO_TEST_CASE(reads_pass_through_without_accounting_and_payment_intents_are_capped_too) {
    vault_fixture f;
    auto k = f.issue(5000);
    auto pi = f.send(f.post(
        k.secret, "/v1/payment_intents",
        f.charge_body(3000) + "&payment_method=pm_card_visa&confirm=true&off_session=true&automatic_payment_"
                              "methods[enabled]=true&automatic_payment_methods[allow_redirects]=never",
        "pi-1"));
    BOOST_TEST(pi.status == 200);
    auto pi_id = vault::object_id(pi.body).value_or("");
    BOOST_TEST(pi_id.starts_with("pi_"));
    auto read = f.send(f.get(k.secret, "/v1/payment_intents/" + pi_id));
    BOOST_TEST(read.status == 200);
    BOOST_TEST(vault::object_id(read.body).value_or("") == pi_id);
    auto list = f.send(f.get(k.secret, "/v1/charges?customer=cus_vault&limit=10"));
    BOOST_TEST(list.status == 200);
    BOOST_TEST(list.body.find("cg_vault_idempotency_key") !=
               std::string::npos);  // the proxy's tag on the charge
    BOOST_TEST(f.count("SELECT count(*) FROM vault_spend") == 1);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/payment_intents", f.charge_body(3000) + "&confirm=true", "pi-2"))
                   .status == 402);
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT stripe_object_id FROM vault_spend") == pi_id);
}

BOOST_AUTO_TEST_CASE(a_declined_charge_is_released_and_a_retry_after_release_counts_again) {
    vault_fixture f;
    auto k = f.issue(1000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->decline("cus_declined");
        co_return;
    }(f.fake.get()));
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(800, "cus_declined"), "declined"));
    BOOST_TEST(r.status == 402);
    BOOST_TEST(error_type_of(r) == "card_error");  // Stripe's own decline, relayed
    f.settle_now();
    BOOST_TEST(f.scalar("SELECT state FROM vault_spend WHERE idempotency_key = 'declined'") == "released");
    // Released spend no longer counts: another 800 fits under 1000.
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(800), "fits")).status == 200);
    // A retry of the declined key would count again (Stripe could execute it past 24 h): now over the cap.
    auto again = f.send(f.post(k.secret, "/v1/charges", f.charge_body(800, "cus_declined"), "declined"));
    BOOST_TEST(again.status == 402);
    BOOST_TEST(error_code_of(again) == "spend_cap_exceeded");
}

BOOST_AUTO_TEST_CASE(secrets_stay_out_of_responses_logs_and_audit_and_every_request_is_audited_once) {
    vault_fixture f;
    auto k = f.issue(2000);
    f.run([](fake::fake_stripe* fk) -> net::awaitable<void> {
        fk->faults().fail_after_create = 1;
        co_return;
    }(f.fake.get()));
    std::string tampered = k.secret;
    tampered.back() = tampered.back() == '0' ? '1' : '0';
    std::vector<http::request> qs{
        f.post(k.secret, "/v1/charges", f.charge_body(500), "a-1"),        // 500 → uncertain
        f.post(k.secret, "/v1/charges", f.charge_body(500), "a-2"),        // settled
        f.post(k.secret, "/v1/charges", f.charge_body(500), "a-2"),        // retry (replay)
        f.post(k.secret, "/v1/charges", f.charge_body(5000), "a-3"),       // over the cap
        f.post(k.secret, "/v1/charges", f.charge_body(500), ""),           // no key
        f.post(k.secret + "x", "/v1/charges", f.charge_body(500), "a-4"),  // not a vault secret at all
        f.post(tampered, "/v1/charges", f.charge_body(500), "a-4"),        // wrong secret for this key id
        f.post(k.secret, "/v1/refunds", "charge=ch_1", "a-5"),             // forbidden
        f.get(k.secret, "/v1/charges?customer=cus_vault"),                 // read
        f.get(k.secret, "/healthz"),                                       // not an API path
    };
    const std::size_t n = qs.size();
    for (auto& q : qs) f.send(q);
    f.settle_now();
    BOOST_TEST(f.run(f.proxy->resolve_once()) == 1u);
    f.flush_audit();
    BOOST_TEST(f.count("SELECT count(*) FROM vault_audit") == static_cast<std::int64_t>(n));
    BOOST_TEST(f.count("SELECT count(*) FROM vault_audit WHERE vault_key_id = '" + k.id + "'") ==
               static_cast<std::int64_t>(n - 2));
    BOOST_TEST(f.scalar("SELECT string_agg(outcome, ',' ORDER BY id) FROM vault_audit") ==
               "uncertain,settled,retry_forwarded,cap_exceeded,bad_request,unauthenticated,unauthenticated,"
               "forbidden,read,"
               "not_found");
    BOOST_TEST(f.count("SELECT count(*) FROM vault_audit WHERE upstream_status = 500") == 1);
    // No secret anywhere: not the real key, not the vault secret (in any row of any vault table), not in a
    // log line, not in an answer.
    auto random_part = k.secret.substr(k.secret.rfind('_') + 1);
    for (const auto& needle : {real_key, random_part}) {
        BOOST_TEST(f.count("SELECT count(*) FROM vault_audit a WHERE a::text LIKE '%" + needle + "%'") == 0);
        BOOST_TEST(f.count("SELECT count(*) FROM vault_spend s WHERE s::text LIKE '%" + needle + "%'") == 0);
        BOOST_TEST(f.count("SELECT count(*) FROM vault_keys k WHERE k::text LIKE '%" + needle + "%'") == 0);
        BOOST_TEST(!f.sink.contains(needle));
        for (const auto& s : f.seen) BOOST_TEST(s.find(needle) == std::string::npos);
    }
    BOOST_TEST(f.sink.lines().size() > 0u);  // the proxy did log (the search above looked at something)
}

BOOST_AUTO_TEST_CASE(tls_listener_serves_the_same_api) {
    vault_fixture f(false);
    auto tls = net::make_tls_server_context({cert("server.pem"), cert("server.key")});
    BOOST_TEST_REQUIRE(tls.has_value());
    auto c = f.proxy_config();
    c.upstream_on_main = true;  // and the forwarding on the main loop (--upstream-on-main)
    f.start(c, nullptr, *tls);
    auto k = f.issue(10'000);
    auto r = f.send(f.post(k.secret, "/v1/charges", f.charge_body(1500), "over-tls"));
    BOOST_TEST(r.status == 200);
    BOOST_TEST(vault::object_id(r.body).value_or("").starts_with("ch_"));
    BOOST_TEST(r.headers.get("Request-Id").value_or("").starts_with("req_"));
}

BOOST_AUTO_TEST_CASE(metrics_name_outcomes_utilisation_reservations_and_latencies) {
    vault_fixture f;
    auto k = f.issue(1000);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(909), "m-1")).status == 200);
    BOOST_TEST(f.send(f.post(k.secret, "/v1/charges", f.charge_body(909), "m-2")).status == 402);
    // The gauges refresh every 100 ms in this fixture: wait for the reservation gauge to show the settled
    // row.
    std::string text;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    do {
        f.pause(50ms);
        text = f.vreg.render();
    } while (text.find("chargeguard_vault_reservations{state=\"settled\"} 1") == std::string::npos &&
             std::chrono::steady_clock::now() < deadline);
    BOOST_TEST(text.find("chargeguard_vault_reservations{state=\"settled\"} 1") != std::string::npos, text);
    BOOST_TEST(text.find("chargeguard_vault_requests_total{outcome=\"settled\"} 1") != std::string::npos);
    BOOST_TEST(text.find("chargeguard_vault_requests_total{outcome=\"cap_exceeded\"} 1") !=
               std::string::npos);
    BOOST_TEST(
        text.find("chargeguard_vault_cap_utilisation_ratio{key=\"" + k.id + "\"} 0.909") != std::string::npos,
        text);
    BOOST_TEST(text.find("chargeguard_vault_upstream_latency_seconds_count 1") != std::string::npos);
    BOOST_TEST(text.find("chargeguard_vault_added_latency_seconds_count 1") != std::string::npos);
}

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
