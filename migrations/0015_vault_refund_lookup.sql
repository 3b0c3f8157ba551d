-- chargeguard: compatible-down-to 0014
-- The webhook receiver applies a charge.refunded event to the vault reservation that settled the charge or
-- its PaymentIntent, looked up by the Stripe object id the reservation settled with. An index only: a
-- binary of schema 0014 keeps working on it.

-- Why: `chargeguard webhooks` finds the reservation of a refunded charge by stripe_object_id (the charge id
-- or its PaymentIntent id) for every charge.refunded delivery; without it each refund scans vault_spend.
CREATE INDEX vault_spend_object_idx ON vault_spend (stripe_object_id) WHERE stripe_object_id IS NOT NULL;
