// The settlement step (billing/machine/settlement.hpp) linking a fact to a ledger row: every pairing of the
// ids a row and a fact can carry, and a foreign charge carrying the row's metadata, which moves nothing.
#include <boost/test/unit_test.hpp>

#include "billing/machine/settlement.hpp"
#include "settlement_support.hpp"

using namespace cg::billing;

namespace {

using namespace cg::test::settlement_support;

// "" none, "mine" the row's own id, "theirs" another of the same kind.
std::optional<std::string> row_id(std::string_view which, std::string_view mine) {
    if (which.empty()) return std::nullopt;
    return std::string(which == "mine" ? mine : std::string_view("x_other"));
}
std::string fact_id(std::string_view which, std::string_view mine) {
    if (which.empty()) return {};
    return std::string(which == "mine" ? mine : (mine.starts_with("pi_") ? "pi_other" : "ch_other"));
}

}  // namespace

// Every pairing of the ids a row may hold (none, its PaymentIntent, its charge, both) with the ids a fact
// may link (none, the row's, another, for the intent and the charge), in one account: metadata is never
// among them, so a row without ids is only ever `unproven`.
BOOST_AUTO_TEST_CASE(link_payment_every_pairing_of_ids) {
    struct row_case {
        const char* pi;
        const char* ch;
        const char* fpi;
        const char* fch;
        payment_link want;
    };
    using L = payment_link;
    const row_case table[] = {
        // The row holds its PaymentIntent only (processing: the bank has not answered).
        {"mine", "", "", "", L::other},
        {"mine", "", "", "mine", L::other},  // a charge naming no intent: not one of this intent's
        {"mine", "", "", "theirs", L::other},
        {"mine", "", "mine", "", L::same},
        {"mine", "", "mine", "mine", L::same},
        {"mine", "", "mine", "theirs", L::same},  // another attempt of the same intent
        {"mine", "", "theirs", "", L::other},
        {"mine", "", "theirs", "mine", L::other},
        {"mine", "", "theirs", "theirs", L::other},
        // The row holds its charge only (a /v1/charges payment).
        {"", "mine", "", "", L::other},
        {"", "mine", "", "mine", L::same},
        {"", "mine", "", "theirs", L::other},
        {"", "mine", "mine", "", L::other},  // an intent the row never named, no charge linked
        {"", "mine", "mine", "mine", L::same},
        {"", "mine", "mine", "theirs", L::other},
        {"", "mine", "theirs", "", L::other},
        {"", "mine", "theirs", "mine", L::same},
        {"", "mine", "theirs", "theirs", L::other},
        // Both (charged).
        {"mine", "mine", "", "", L::other},
        {"mine", "mine", "", "mine", L::same},  // a dispute or refund naming the charge only
        {"mine", "mine", "", "theirs", L::other},
        {"mine", "mine", "mine", "", L::same},
        {"mine", "mine", "mine", "mine", L::same},
        {"mine", "mine", "mine", "theirs", L::same},
        {"mine", "mine", "theirs", "", L::other},
        {"mine", "mine", "theirs", "mine", L::other},
        {"mine", "mine", "theirs", "theirs", L::other},
        // Neither: only metadata can have found the row.
        {"", "", "", "", L::unproven},
        {"", "", "", "mine", L::unproven},
        {"", "", "", "theirs", L::unproven},
        {"", "", "mine", "", L::unproven},
        {"", "", "mine", "mine", L::unproven},
        {"", "", "mine", "theirs", L::unproven},
        {"", "", "theirs", "", L::unproven},
        {"", "", "theirs", "mine", L::unproven},
        {"", "", "theirs", "theirs", L::unproven},
    };
    // The accounts: (row, fact). Equal ones keep the table's answer; different ones are always `other`.
    const std::pair<const char*, const char*> accounts[] = {
        {"", ""}, {"acct_A", "acct_A"}, {"", "acct_A"}, {"acct_A", ""}, {"acct_A", "acct_B"}};
    for (const auto& t : table) {
        for (const auto& [ra, fa] : accounts) {
            settlement_row r = row(record_status::processing);
            r.payment_intent_id = row_id(t.pi, "pi_1");
            r.charge_id = row_id(t.ch, "ch_1");
            r.stripe_account = ra;
            auto f = fact(fact_kind::failed, "failed");
            f.payment_intent_id = fact_id(t.fpi, "pi_1");
            f.charge_id = fact_id(t.fch, "ch_1");
            f.billing_key = "the-rows-key";  // metadata: proves nothing
            f.account = fa;
            const auto want = std::string_view(ra) == fa ? t.want : L::other;
            BOOST_TEST(link_payment(r, f) == want, "row " << t.pi << "/" << t.ch << "@" << ra << " fact "
                                                          << t.fpi << "/" << t.fch << "@" << fa);
            // The step follows the link: only `same` moves a processing row.
            auto c = apply_fact(r, f);
            if (want == L::same) {
                BOOST_TEST(c.row.status == record_status::failed_after_processing);
            } else {
                BOOST_TEST((c.row == r));
                BOOST_TEST(!c.failed_now);
                BOOST_TEST(c.result ==
                           (want == L::other ? settle_result::other_payment : settle_result::unconfirmed));
            }
        }
    }
}

// The two cases seen on a shared Stripe account: a charge made outside chargeguard that carries the row's
// billing_key, with no PaymentIntent (a charge made by hand) or another one (a second integration).
BOOST_AUTO_TEST_CASE(a_foreign_charge_carrying_the_rows_metadata_moves_nothing) {
    auto p = row(record_status::processing);  // pi_1, no charge yet
    for (const std::string foreign_pi : {"", "pi_foreign"}) {
        auto failed = fact(fact_kind::failed, "failed");
        failed.source = "charge.failed";
        failed.payment_intent_id = foreign_pi;
        failed.charge_id = "ch_foreign";
        failed.billing_key = "the-rows-key";
        auto c = apply_fact(p, failed);
        BOOST_TEST(c.result == settle_result::other_payment);
        BOOST_TEST(!c.failed_now);
        BOOST_TEST((c.row == p));

        auto succeeded = failed;
        succeeded.kind = fact_kind::succeeded;
        succeeded.source = "charge.succeeded";
        succeeded.status = "succeeded";
        c = apply_fact(p, succeeded);
        BOOST_TEST(c.result == settle_result::other_payment);
        BOOST_TEST(!c.charged_now);
        BOOST_TEST(!c.row.charge_id.has_value());
        // The row's own failure afterwards still applies.
        auto own = fold(p, {succeeded, fact(fact_kind::failed, "requires_payment_method")});
        BOOST_TEST(own.status == record_status::failed_after_processing);
    }
    // A row holding no Stripe id yet: pending defers (the pipeline records the ids, then applies by them);
    // any other state is never moved on metadata.
    settlement_row bare = row(record_status::pending);
    bare.payment_intent_id.reset();
    auto s = fact(fact_kind::succeeded, "succeeded");
    BOOST_TEST(apply_fact(bare, s).result == settle_result::deferred);
    bare.status = record_status::declined;
    auto c = apply_fact(bare, s);
    BOOST_TEST(c.result == settle_result::unconfirmed);
    BOOST_TEST((c.row == bare));
    BOOST_TEST(!c.anomaly);
}
