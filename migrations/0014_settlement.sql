-- chargeguard: compatible-down-to 0014
-- Payments that settle later. A PaymentIntent (or a charge) Stripe answers `processing` — a bank debit —
-- has not moved money yet and can still fail days later; a charged payment can be refunded or disputed.
-- The ledger follows the money to its end: `processing` until Stripe says how it ended (by webhook, or by
-- the poll of rows left processing), then `charged` or `failed_after_processing` (with a dead letter whose
-- replay charges again under a new key generation); refunded and disputed amounts are recorded on the row.
--
-- Not compatible with older binaries: they decode `status` strictly (an unknown value is a broken
-- invariant), and they count `processing` as charged, the very fault this migration exists to remove.
-- A binary of schema 0013 therefore refuses a database at 0014 (the schema gate) instead of misreading it.
ALTER TABLE billing_records DROP CONSTRAINT billing_records_status_check;
ALTER TABLE billing_records ADD CONSTRAINT billing_records_status_check
    CHECK (status IN ('pending', 'processing', 'charged', 'failed_after_processing', 'declined', 'failed',
                      'cap_blocked', 'conflict'));

ALTER TABLE billing_records
    -- Cumulative amounts, as Stripe reports them (charge.amount_refunded, dispute.amount): they only grow.
    ADD COLUMN refunded_cents   bigint NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0),
    ADD COLUMN disputed_cents   bigint NOT NULL DEFAULT 0 CHECK (disputed_cents >= 0),
    -- The dispute's status (needs_response, under_review, won, lost, …); NULL: never disputed.
    ADD COLUMN dispute_status   text CHECK (dispute_status IS NULL OR dispute_status <> ''),
    -- The Stripe status last seen for the row's payment (from an answer, a webhook or a poll) and when.
    ADD COLUMN stripe_status    text CHECK (stripe_status IS NULL OR stripe_status <> ''),
    ADD COLUMN stripe_status_at timestamptz,
    -- When the row became `processing`, and when the poll last asked Stripe about it.
    ADD COLUMN processing_since timestamptz,
    ADD COLUMN polled_at        timestamptz,
    -- The delivery that left the row processing: what its dead letter carries if the payment fails later,
    -- so a replay re-publishes the same message to the same topic.
    ADD COLUMN nsq_topic        text CHECK (nsq_topic IS NULL OR nsq_topic <> ''),
    ADD COLUMN nsq_channel      text CHECK (nsq_channel IS NULL OR nsq_channel <> ''),
    ADD COLUMN raw_body         bytea;

-- A processing row names the payment it waits for (the poll retrieves it by id), knows since when, and can
-- write its dead letter.
ALTER TABLE billing_records ADD CONSTRAINT billing_records_processing_has_payment
    CHECK (status <> 'processing' OR ((payment_intent_id IS NOT NULL OR charge_id IS NOT NULL)
                                      AND processing_since IS NOT NULL AND raw_body IS NOT NULL
                                      AND nsq_topic IS NOT NULL AND nsq_channel IS NOT NULL));
-- The charged row's charge_id constraint (0001) stays as it is: a charged row always says which charge.

-- Why: the poll reads the rows still processing, oldest first; partial, so it holds only those.
CREATE INDEX billing_records_processing_idx ON billing_records (coalesce(polled_at, processing_since))
    WHERE status = 'processing';

-- Why: a webhook event names a charge (ch_…), a PaymentIntent (pi_…) or a dispute's charge; the receiver
-- finds the ledger row by them. charge_id has its unique index (0001); payment_intent_id its own (0006).

-- What the receiver learned of each event besides its envelope: the ids it names (so the pipeline, once it
-- leaves a row processing, applies the events that arrived first) and what applying it did.
ALTER TABLE stripe_webhook_events
    ADD COLUMN payment_intent_id text,
    ADD COLUMN charge_id         text,
    ADD COLUMN billing_key       text,
    -- applied, ignored (stale, duplicate fact, other attempt), unknown_type, unknown_object, deferred
    -- (the row was pending: the pipeline applies it when it settles the row)
    ADD COLUMN outcome           text,
    ADD COLUMN applied_to        text;  -- billing_records.key
-- Why: the pipeline, leaving a row processing, reads the events recorded for its payment.
CREATE INDEX stripe_webhook_events_payment_intent_idx ON stripe_webhook_events (payment_intent_id)
    WHERE payment_intent_id IS NOT NULL;
CREATE INDEX stripe_webhook_events_charge_idx ON stripe_webhook_events (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX stripe_webhook_events_billing_key_idx ON stripe_webhook_events (billing_key)
    WHERE billing_key IS NOT NULL;

-- The vault's policy for refunds: by default a refund does not give the key's cap its room back (the cap
-- bounds what was charged, and a refund is not an undo); a key issued with refunds_reopen_cap lets it.
ALTER TABLE vault_keys ADD COLUMN refunds_reopen_cap boolean NOT NULL DEFAULT false;
