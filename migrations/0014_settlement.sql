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

-- The vault follows payments that settle later too. A reservation settled with a PaymentIntent still in
-- flight (processing, requires_capture) or a charge still pending is marked by settled_status; the proxy's
-- resolver retrieves it until Stripe says how it ended, and releases it when the payment failed (the cap
-- room comes back: nothing was charged). Refunds are recorded per reservation; they give cap room back only
-- for a key with refunds_reopen_cap (reopened_cents), so committed_cents counts amount_cents − reopened_cents.
ALTER TABLE vault_spend
    ADD COLUMN settled_status       text CHECK (settled_status IS NULL OR settled_status <> ''),
    ADD COLUMN in_flight_checked_at timestamptz,
    ADD COLUMN refunded_cents       bigint NOT NULL DEFAULT 0
        CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents),
    ADD COLUMN reopened_cents       bigint NOT NULL DEFAULT 0
        CHECK (reopened_cents >= 0 AND reopened_cents <= refunded_cents);

-- Why: the resolver reads the settled reservations still in flight, least recently checked first.
CREATE INDEX vault_spend_in_flight_idx ON vault_spend (coalesce(in_flight_checked_at, reserved_at))
    WHERE state = 'settled' AND settled_status IS NOT NULL;

CREATE OR REPLACE FUNCTION cg_vault_spend_committed() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    delta bigint := 0;
BEGIN
    -- cg_vault_reserve_many keeps the counter itself, once per batch (a row updated per reservation would
    -- pile dead versions on the key's one hot row).
    IF current_setting('cg.vault_reserving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') AND NEW.state IN ('reserved', 'settled', 'uncertain') THEN
        delta := delta + NEW.amount_cents - NEW.reopened_cents;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state IN ('reserved', 'settled', 'uncertain') THEN
        delta := delta - OLD.amount_cents + OLD.reopened_cents;
    END IF;
    IF delta <> 0 THEN
        UPDATE vault_keys SET committed_cents = committed_cents + delta
         WHERE id = coalesce(NEW.vault_key_id, OLD.vault_key_id);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER vault_spend_committed ON vault_spend;
CREATE TRIGGER vault_spend_committed
    AFTER INSERT OR UPDATE OF state, amount_cents, reopened_cents OR DELETE ON vault_spend
    FOR EACH ROW EXECUTE FUNCTION cg_vault_spend_committed();
