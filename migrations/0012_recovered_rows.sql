-- Rows lost entirely: a PostgreSQL failover with asynchronous replication can lose a pre-flight insert whose
-- charge Stripe then made. The backfill (src/billing/backfill.hpp) lists the recent charges carrying this
-- sidecar's metadata and inserts the rows that are missing, settled from the charge.
--
-- Why: recovered_at marks such a row (NULL for every row the pipeline wrote), so an operator and reconcile
-- can tell a row rebuilt from Stripe from one written before its charge; the backfill also logs each one.
-- Binaries of schema 0010 keep working: they write none of these columns (their rows read as
-- written before this migration).
-- chargeguard: compatible-down-to 0010
ALTER TABLE billing_records ADD COLUMN recovered_at timestamptz;
