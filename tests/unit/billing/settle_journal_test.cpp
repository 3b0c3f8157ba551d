// The memory of recent settles a failover may lose (billing/flow/settle_journal.hpp), without a database.
#include "billing/flow/settle_journal.hpp"

#include <boost/test/unit_test.hpp>

using namespace std::chrono_literals;
using namespace cg;

namespace {

billing::journal_entry entry(std::string key, std::chrono::steady_clock::time_point at) {
    billing::journal_entry e;
    e.key = std::move(key);
    e.generation = 2;
    e.first_lease = 10;
    e.last_lease = 12;  // two renewals during the call
    e.charge_id = "ch_1";
    e.at = at;
    return e;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(settle_journal)

// Entries older than `keep` and beyond `capacity` are forgotten, oldest first.
BOOST_AUTO_TEST_CASE(keeps_recent_entries_within_age_and_count) {
    const auto t0 = std::chrono::steady_clock::now();
    billing::settle_journal j(60s, 3);
    j.note(entry("a", t0));
    j.note(entry("b", t0 + 10s));
    BOOST_TEST(j.recent(t0 + 20s).size() == 2u);
    BOOST_TEST(j.recent(t0 + 65s).size() == 1u);  // a is past its minute
    j.note(entry("c", t0 + 20s));
    j.note(entry("d", t0 + 30s));
    j.note(entry("e", t0 + 40s));
    auto r = j.recent(t0 + 45s);
    BOOST_TEST_REQUIRE(r.size() == 3u);  // capacity: a and b dropped
    BOOST_TEST(r.front().key == "c");
    BOOST_TEST(r.back().key == "e");
    j.note(entry("f", t0 + 95s));  // c and d are past their minute: trimmed on note
    BOOST_TEST(j.size() == 2u);
}

// An entry comes back as it was noted: each optional set, unset, or set and empty, the others around it.
BOOST_AUTO_TEST_CASE(entries_come_back_as_noted) {
    const auto t0 = std::chrono::steady_clock::now();
    billing::settle_journal j(60s, 10);
    auto full = entry("bench:cus_1:2026-11", t0);
    full.status = billing::record_status::declined;
    full.payment_intent_id = "pi_3";
    full.last_error = "card_declined: insufficient funds";
    auto none = entry("k2", t0);
    none.charge_id.reset();
    auto empty = entry("", t0);
    empty.charge_id = "";
    empty.last_error = "";
    for (const auto& e : {full, none, empty}) j.note(e);
    auto r = j.recent(t0 + 1s);
    BOOST_TEST_REQUIRE(r.size() == 3u);
    for (std::size_t i = 0; i < r.size(); ++i) {
        const auto& want = i == 0 ? full : i == 1 ? none : empty;
        BOOST_TEST(r[i].key == want.key, i);
        BOOST_TEST((r[i].charge_id == want.charge_id), i);
        BOOST_TEST((r[i].payment_intent_id == want.payment_intent_id), i);
        BOOST_TEST((r[i].last_error == want.last_error), i);
        BOOST_TEST((r[i].status == want.status), i);
        BOOST_TEST(r[i].generation == want.generation);
        BOOST_TEST(r[i].first_lease == want.first_lease);
        BOOST_TEST(r[i].last_lease == want.last_lease);
        BOOST_TEST((r[i].at == want.at));
    }
}

// Only a pending row under the same generation and a lease epoch the delivery held is its reverted settle.
BOOST_AUTO_TEST_CASE(reverted_only_under_an_epoch_the_delivery_held) {
    const auto e = entry("k", std::chrono::steady_clock::now());
    billing::ledger_record row;
    row.key = "k";
    row.status = billing::record_status::pending;
    row.key_generation = 2;
    for (std::int64_t epoch : {10, 11, 12}) {
        row.lease_epoch = epoch;
        BOOST_TEST(billing::reverted_by_failover(e, row), epoch);
    }
    row.lease_epoch = 9;  // before the attempt
    BOOST_TEST(!billing::reverted_by_failover(e, row));
    row.lease_epoch = 13;  // someone wrote the lease since (a take, a release, a settle)
    BOOST_TEST(!billing::reverted_by_failover(e, row));
    row.lease_epoch = 11;
    row.key_generation = 3;  // a new generation: the ids are not this row's
    BOOST_TEST(!billing::reverted_by_failover(e, row));
    row.key_generation = 2;
    for (auto s : {billing::record_status::charged, billing::record_status::processing,
                   billing::record_status::declined}) {
        row.status = s;
        BOOST_TEST(!billing::reverted_by_failover(e, row));
    }
    row.status = billing::record_status::pending;
    row.key = "other";
    BOOST_TEST(!billing::reverted_by_failover(e, row));
}

BOOST_AUTO_TEST_SUITE_END()
