-- Stripe Connect: a billing event may charge on behalf of a connected account (its `stripe_account`,
-- sent as the Stripe-Account header). Each account has its own objects, so the same customer id and
-- period on two accounts are two charges: the row records the account, and "exactly once" holds per
-- (customer, period, account). NULL is the platform's own account; NULLS NOT DISTINCT keeps platform rows
-- unique per (customer, period) exactly as before. Everything that works from a row (recovery's search,
-- the sweeper, the processing poll, reconcile, explain) calls Stripe in the row's account.
--
-- No compatible-down-to line: a binary of schema 0016 does not know the field, would read a connected
-- account's event as the platform's and charge it there, so it must not start on this schema.
ALTER TABLE billing_records
    ADD COLUMN stripe_account text CHECK (stripe_account IS NULL OR stripe_account ~ '^acct_[A-Za-z0-9]+$');

-- The new uniqueness first, then the old one goes: the table is never without one. The leading columns stay
-- (customer_id, billing_period), which the lookups by customer use.
ALTER TABLE billing_records
    ADD CONSTRAINT billing_records_customer_period_account_key
        UNIQUE NULLS NOT DISTINCT (customer_id, billing_period, stripe_account);
ALTER TABLE billing_records DROP CONSTRAINT billing_records_customer_period_key;

-- A vault key may be scoped to one connected account: the proxy then forwards requests carrying exactly
-- that Stripe-Account and refuses any other (or none); a key without one spends the platform's own account
-- and refuses every Stripe-Account. One account per key, not a list: the cap is one account's spend for the
-- period, and a key's reservations (vault_key_id, idempotency_key) stay unique where Stripe's idempotency
-- keys are per account.
ALTER TABLE vault_keys
    ADD COLUMN stripe_account text CHECK (stripe_account IS NULL OR stripe_account ~ '^acct_[A-Za-z0-9]+$');

-- Why: the backfill lists each connected account the ledger knows, read by a loose scan of this index (one
-- probe per account). Partial: platform rows (NULL) take no room.
CREATE INDEX billing_records_stripe_account_idx ON billing_records (stripe_account)
    WHERE stripe_account IS NOT NULL;
