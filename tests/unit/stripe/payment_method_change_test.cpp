// The two events that say a customer's payment method changed, as API version 2024-06-20 renders them
// (fake-stripe's bodies, trimmed to what is read), and the ones that look alike and say nothing of the kind.
#include "stripe/payment_method_change.hpp"

#include <boost/test/unit_test.hpp>
#include <string>

using namespace cg::stripe;

namespace {

std::string event(const std::string& type, const std::string& data, const std::string& account = {}) {
    return R"({"id":"evt_1","object":"event",)" +
           (account.empty() ? "" : R"("account":")" + account + R"(",)") +
           R"("api_version":"2024-06-20","created":1719000000,"data":)" + data +
           R"(,"livemode":false,"pending_webhooks":1,"request":{"id":null,"idempotency_key":null},"type":")" +
           type + R"("})";
}

const std::string customer_with_pm2 =
    R"({"id":"cus_9","object":"customer","invoice_settings":{"custom_fields":null,"default_payment_method":"pm_2",)"
    R"("footer":null,"rendering_options":null},"metadata":{}})";

}  // namespace

BOOST_AUTO_TEST_SUITE(payment_method_change_events)

BOOST_AUTO_TEST_CASE(a_payment_method_attached_to_a_customer) {
    auto c = read_payment_method_change(event(
        "payment_method.attached",
        R"({"object":{"id":"pm_1","object":"payment_method","customer":"cus_9","type":"card","metadata":{}}})",
        "acct_1Conn"));
    BOOST_TEST(c.customer == "cus_9");
    BOOST_TEST(c.payment_method == "pm_1");
    BOOST_TEST(c.account == "acct_1Conn");
    BOOST_TEST(names_payment_method_change("payment_method.attached"));
    auto none = read_payment_method_change(event(
        "payment_method.attached", R"({"object":{"id":"pm_1","object":"payment_method","customer":null}})"));
    BOOST_TEST(none.customer.empty());
    BOOST_TEST(!none.why_not.empty());
}

BOOST_AUTO_TEST_CASE(a_customer_whose_default_payment_method_changed) {
    auto c = read_payment_method_change(
        event("customer.updated",
              R"({"object":)" + customer_with_pm2 +
                  R"(,"previous_attributes":{"invoice_settings":{"default_payment_method":null}}})"));
    BOOST_TEST(c.customer == "cus_9");
    BOOST_TEST(c.payment_method == "pm_2");
    BOOST_TEST(c.account.empty());
    auto from_pm1 = read_payment_method_change(
        event("customer.updated",
              R"({"object":)" + customer_with_pm2 +
                  R"(,"previous_attributes":{"invoice_settings":{"default_payment_method":"pm_1"}}})"));
    BOOST_TEST(from_pm1.customer == "cus_9");
}

BOOST_AUTO_TEST_CASE(updates_that_change_no_payment_method) {
    // Another attribute.
    auto email = read_payment_method_change(
        event("customer.updated",
              R"({"object":)" + customer_with_pm2 + R"(,"previous_attributes":{"email":"a@b.c"}})"));
    BOOST_TEST(email.customer.empty());
    // invoice_settings changed, but not its default payment method.
    auto footer = read_payment_method_change(
        event("customer.updated", R"({"object":)" + customer_with_pm2 +
                                      R"(,"previous_attributes":{"invoice_settings":{"footer":"x"}}})"));
    BOOST_TEST(footer.customer.empty());
    // The default removed.
    auto removed = read_payment_method_change(event(
        "customer.updated",
        R"({"object":{"id":"cus_9","object":"customer","invoice_settings":{"default_payment_method":null}},)"
        R"("previous_attributes":{"invoice_settings":{"default_payment_method":"pm_1"}}})"));
    BOOST_TEST(removed.customer.empty());
    // No previous_attributes at all, another type, not JSON.
    BOOST_TEST(
        read_payment_method_change(event("customer.updated", R"({"object":)" + customer_with_pm2 + "}"))
            .customer.empty());
    BOOST_TEST(!names_payment_method_change("customer.created"));
    BOOST_TEST(
        read_payment_method_change(event("customer.created", R"({"object":)" + customer_with_pm2 + "}"))
            .customer.empty());
    BOOST_TEST(read_payment_method_change("not json").customer.empty());
}

BOOST_AUTO_TEST_SUITE_END()
