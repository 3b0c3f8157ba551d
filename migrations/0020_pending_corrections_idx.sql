-- chargeguard: compatible-down-to 0019
-- The correction revisions in state pending (billing/sweeper.cpp, billing/pending_age.cpp): a handful at any
-- time among every revision ever applied, read by the sweeper and the pending-age gauges on every round.
--
-- An index only: binaries of schema 0019 keep working.
CREATE INDEX billing_corrections_pending_idx ON billing_corrections (started_at) WHERE status = 'pending';
