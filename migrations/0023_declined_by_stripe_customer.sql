-- chargeguard: compatible-down-to 0022
-- The declined rows of one Stripe customer (and its pending ones, a retry under way): what
-- `chargeguard webhooks --retry-declined-on-payment-method-change` reads when Stripe says the customer's
-- payment method changed (billing/retry_store.hpp). A few rows among every row ever charged.
--
-- An index only: binaries of schema 0022 keep working.
CREATE INDEX billing_records_declined_stripe_customer_idx ON billing_records (stripe_customer_id)
    WHERE status IN ('declined', 'pending');
