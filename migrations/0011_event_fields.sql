-- The ledger heals itself: a pending row nobody works on any more (its message lost with a PostgreSQL
-- failover, or dropped by an operator) is resolved by the sweeper, which runs it through the same machine a
-- redelivery would, without the message. So the row holds every field the charge needs, and the key
-- namespace that computed its key (the sweeper of a sidecar works only the rows of its own namespace).
-- Rows written before this migration have key_namespace NULL: the sweeper leaves them to reconcile, since it
-- cannot tell which of these fields their event carried.
--
-- Why: description, payment_method and off_session go to Stripe with the charge (payment_method makes it a
-- confirmed PaymentIntent); key_namespace selects a sidecar's rows without recomputing every key.
-- Binaries of schema 0010 keep working: they write none of these columns (their rows read as
-- written before this migration).
-- chargeguard: compatible-down-to 0010
ALTER TABLE billing_records
    ADD COLUMN description    text,
    ADD COLUMN payment_method text CHECK (payment_method IS NULL OR payment_method <> ''),
    ADD COLUMN off_session    boolean,
    ADD COLUMN key_namespace  text CHECK (key_namespace IS NULL OR key_namespace <> '');
