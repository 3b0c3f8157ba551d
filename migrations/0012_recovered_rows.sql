-- Rows lost entirely: a PostgreSQL failover with asynchronous replication can lose a pre-flight insert whose
-- charge Stripe then made. The backfill (src/billing/backfill.hpp) lists the recent charges carrying this
-- sidecar's metadata and inserts the rows that are missing, settled from the charge.
--
-- Why: recovered_at marks such a row (NULL for every row the pipeline wrote), so an operator and reconcile
-- can tell a row rebuilt from Stripe from one written before its charge; the backfill also logs each one.
ALTER TABLE billing_records ADD COLUMN recovered_at timestamptz;
