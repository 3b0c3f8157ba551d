-- chargeguard: compatible-down-to 0020
-- Genuinely signed webhook deliveries the receiver refuses for what they contain (app/webhook_receiver.hpp):
-- an event that can never be stored as it is (a key twice in one object, a NUL character, a `created`
-- outside the years 1970 to 9999) or one rendered in another API version than the receiver reads. Each is
-- recorded here with its reason, once per event id (redeliveries counted), so that it is answered 400 once
-- and then acknowledged instead of failing for Stripe's three days of retries, and an operator can read
-- what was refused. The body is kept as bytes: it is, by definition, not storable as jsonb.
--
-- A table only: binaries of schema 0020 keep working (they never write it).
CREATE TABLE stripe_webhook_refusals (
    event_id     text PRIMARY KEY,                   -- evt_… (the envelope's first "id")
    type         text NOT NULL,
    reason       text NOT NULL,                      -- unstorable: …, api_version …
    api_version  text,
    body         bytea NOT NULL,                     -- the delivery as signed
    first_at     timestamptz NOT NULL DEFAULT now(),
    last_at      timestamptz NOT NULL DEFAULT now(),
    deliveries   bigint NOT NULL DEFAULT 1 CHECK (deliveries >= 1)
);
