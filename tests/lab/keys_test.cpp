// The lab's key policies: which redelivery changes which key. The content key must survive every one of
// them; each unsafe key must change under the event its scenario stages (or the scenario would show nothing).
#define BOOST_TEST_MODULE lab
#include "lab/keys.hpp"

#include <boost/test/unit_test.hpp>
#include <set>

#include "billing/machine/key.hpp"
#include "lab/report.hpp"
#include "lab/scenario.hpp"

using namespace cg::lab;

namespace {
key_inputs first_delivery() {
    key_inputs in;
    in.key_namespace = "lab";
    in.customer_id = "cust-1";
    in.billing_period = "2026-11";
    in.attempts = 1;
    in.connection_uuid = "2b1f0c4e-0000-4000-8000-000000000001";
    in.nsqd_address = "127.0.0.1:4150";
    in.call_time_ns = 1'000'000'000;
    in.message_id = "0b1c2d3e4f5a6b7c";
    return in;
}

// The redeliveries the scenarios stage, as changes to what a consumer sees.
key_inputs redelivered(key_inputs in) {
    return ++in.attempts, in.call_time_ns += 1'500'000'000, in;
}
key_inputs restarted(key_inputs in) {
    return in.connection_uuid = random_uuid(), in;
}
key_inputs other_broker(key_inputs in) {
    return in.nsqd_address = "127.0.0.1:4250", in;
}
key_inputs republished(key_inputs in) {
    return in.message_id = "0b1c2d3e4f5a6b7d", in.attempts = 1, in;
}
}  // namespace

BOOST_AUTO_TEST_CASE(content_key_is_the_pipelines_key_and_survives_every_redelivery) {
    auto a = first_delivery();
    auto k = make_key(key_policy::content, a);
    BOOST_TEST(k == cg::billing::base_key("lab", "cust-1", "2026-11"));
    for (const auto& b : {redelivered(a), restarted(a), other_broker(a), republished(a)})
        BOOST_TEST(make_key(key_policy::content, b) == k);
}

BOOST_AUTO_TEST_CASE(each_unsafe_key_changes_under_its_scenario) {
    auto a = first_delivery();
    BOOST_TEST(make_key(key_policy::attempts, redelivered(a)) != make_key(key_policy::attempts, a));
    BOOST_TEST(make_key(key_policy::connection, restarted(a)) != make_key(key_policy::connection, a));
    BOOST_TEST(make_key(key_policy::nsqd_address, other_broker(a)) != make_key(key_policy::nsqd_address, a));
    BOOST_TEST(make_key(key_policy::call_time, redelivered(a)) != make_key(key_policy::call_time, a));
    BOOST_TEST(make_key(key_policy::message_id, republished(a)) != make_key(key_policy::message_id, a));
    // …and only under it: a key that changed on every delivery would not be the mistake the scenario names.
    BOOST_TEST(make_key(key_policy::connection, redelivered(a)) == make_key(key_policy::connection, a));
    BOOST_TEST(make_key(key_policy::nsqd_address, restarted(a)) == make_key(key_policy::nsqd_address, a));
    BOOST_TEST(make_key(key_policy::message_id, redelivered(a)) == make_key(key_policy::message_id, a));
}

BOOST_AUTO_TEST_CASE(keys_fit_stripe_and_uuids_are_v4) {
    auto a = first_delivery();
    for (auto p : {key_policy::content, key_policy::attempts, key_policy::connection,
                   key_policy::nsqd_address, key_policy::call_time, key_policy::message_id}) {
        BOOST_TEST(make_key(p, a).size() <= 255u);
        BOOST_TEST((parse_key_policy(to_string(p)) == p));
    }
    auto u = random_uuid();
    BOOST_TEST(u.size() == 36u);
    BOOST_TEST(u[14] == '4');
    BOOST_TEST(random_uuid() != u);
}

BOOST_AUTO_TEST_CASE(scenarios_are_named_once_and_json_has_exactly_the_table_fields) {
    std::set<std::string> names;
    for (const auto& s : all_scenarios()) BOOST_TEST(names.insert(s.name).second, s.name);
    BOOST_TEST(find_scenario("FM3") != nullptr);
    BOOST_TEST(find_scenario("nope") == nullptr);
    row r;
    r.scenario = "FM1";
    r.variant = "unsafe";
    r.duplicate_charges = 5;
    r.disconnects = 7;  // a note, not a field
    BOOST_TEST(render_json({r}) ==
               "[\n {\"scenario\":\"FM1\",\"variant\":\"unsafe\",\"deliveries\":0,\"stripe_posts\":0,"
               "\"charges_created\":0,\"duplicate_charges\":5,\"customers_uncharged\":0,\"nsqd_timeouts\":0,"
               "\"e_fin_failed\":0}\n]\n");
}
