-- A new key generation waits out every call under the old one. A recovery search that finds no charge may
-- run while a call under the current key is still in flight — its worker's lease lapsed (renewals failing,
-- or a renewal's reply lost), or Stripe is still executing a request our client timed out on — and a new
-- generation taken then would let both calls charge. last_stripe_attempt_at is when a call under the current
-- generation last showed life: set when an attempt is recorded (the pre-flight insert, record_attempt) and on
-- every lease renewal while the call is awaited — also by a worker that lost its lease, which keeps saying
-- "in flight" for its generation. The bump refuses until it is older than consume's --new-key-quiet.
ALTER TABLE billing_records ADD COLUMN last_stripe_attempt_at timestamptz;
-- Rows open now: their first attempt is the best known; settled rows never bump, so they stay NULL.
UPDATE billing_records SET last_stripe_attempt_at = first_stripe_attempt_at WHERE status = 'pending';
