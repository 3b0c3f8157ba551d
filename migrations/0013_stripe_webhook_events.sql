-- chargeguard: compatible-down-to 0010
-- A new table nothing older reads: binaries from 0010 on keep working once it exists.
-- Why: Stripe delivers each webhook event at least once, in any order, retrying for days. Recording every
-- event by its id once is what makes a redelivery harmless: the receiver inserts with ON CONFLICT (id) DO
-- NOTHING and acknowledges a duplicate without acting on it again. The receiver answers 2xx only after
-- this insert committed, so an acknowledged event is never lost.
CREATE TABLE stripe_webhook_events (
    id text PRIMARY KEY,               -- evt_…
    type text NOT NULL,                -- payment_intent.succeeded, charge.refunded, …
    created timestamptz NOT NULL,      -- when Stripe created the event
    livemode boolean NOT NULL,
    object_id text,                    -- data.object.id (pi_…, ch_…, dp_…), when it has one
    received_at timestamptz NOT NULL DEFAULT now(),  -- the first delivery we recorded
    payload jsonb NOT NULL             -- the whole event, for applying it to the ledger and for audits
);
-- Why: applying events to the ledger looks them up by the object they concern.
CREATE INDEX stripe_webhook_events_object_id ON stripe_webhook_events (object_id);
