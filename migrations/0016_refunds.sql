-- chargeguard: compatible-down-to 0014
-- Refunds, one by one. Stripe reports a refund twice over: charge.refunded carries the charge's cumulative
-- amount_refunded (no refund id), and refund.created / refund.updated / refund.failed /
-- charge.refund.updated carry the refund object (re_…, its amount and status). A refund can still fail or be
-- canceled after it was created; the amount then goes back to the charge (its amount_refunded drops), so
-- "the largest amount_refunded seen" overstates what was refunded. The webhook receiver therefore records
-- every refund by its id, with the furthest status it reached (pending, requires_action < succeeded <
-- failed, canceled: a final state is never undone by a late event), and the newest amount_refunded each
-- charge reported (by the event's time; the larger one within a second); the refunded amount of a payment
-- is computed from both (cg_refunded_cents), so the same
-- refund seen by its charge's event and by its own events, in any order and any number of times, counts
-- once. The ledger row (billing_records.refunded_cents) and the vault reservation (vault_spend.refunded_cents)
-- are set from it.
--
-- Tables and a function only: binaries of schema 0014 and 0015 keep working (they keep the largest
-- amount_refunded, as before).

CREATE TABLE stripe_refunds (
    id                text        PRIMARY KEY CHECK (id <> ''),
    charge_id         text        CHECK (charge_id IS NULL OR charge_id <> ''),
    payment_intent_id text        CHECK (payment_intent_id IS NULL OR payment_intent_id <> ''),
    amount_cents      bigint      NOT NULL CHECK (amount_cents >= 0),
    status            text        NOT NULL CHECK (status <> ''),
    -- The Stripe time (the event's `created`) of the newest event that reported this refund.
    status_at         timestamptz NOT NULL,
    first_seen_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stripe_refunds_names_a_payment CHECK (charge_id IS NOT NULL OR payment_intent_id IS NOT NULL)
);
-- Why: cg_refunded_cents sums a payment's refunds by its charge or its PaymentIntent.
CREATE INDEX stripe_refunds_charge_idx ON stripe_refunds (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX stripe_refunds_payment_intent_idx ON stripe_refunds (payment_intent_id)
    WHERE payment_intent_id IS NOT NULL;

-- The newest amount_refunded a charge.refunded event reported, per payment (the charge id, or the
-- PaymentIntent id for an amount carried over below without one), and the event's time.
CREATE TABLE stripe_charge_refunds (
    payment           text        PRIMARY KEY CHECK (payment <> ''),
    charge_id         text        CHECK (charge_id IS NULL OR charge_id <> ''),
    payment_intent_id text        CHECK (payment_intent_id IS NULL OR payment_intent_id <> ''),
    reported_cents    bigint      NOT NULL CHECK (reported_cents >= 0),
    reported_at       timestamptz NOT NULL
);
-- Why: as for stripe_refunds.
CREATE INDEX stripe_charge_refunds_charge_idx ON stripe_charge_refunds (charge_id) WHERE charge_id IS NOT NULL;
CREATE INDEX stripe_charge_refunds_payment_intent_idx ON stripe_charge_refunds (payment_intent_id)
    WHERE payment_intent_id IS NOT NULL;

-- The order of a refund's statuses: a later event never moves a refund back.
CREATE FUNCTION cg_refund_status_rank(status text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN status IN ('failed', 'canceled') THEN 3 WHEN status = 'succeeded' THEN 2 ELSE 1 END
$$;

-- What a payment (its charge, or its PaymentIntent) has had refunded: the refunds known by id that have not
-- failed or been canceled, or — for refunds known only through charge.refunded — the newest amount_refunded
-- reported less the refunds known by id to have failed or been canceled at or after that report, whichever
-- is larger. (A failure in the same second as the report is taken as not yet in it: an undercount at worst,
-- which the refund's own events correct.) VOLATILE: each call reads what committed before it.
CREATE FUNCTION cg_refunded_cents(p_charge text, p_intent text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    WITH r AS (
        SELECT amount_cents, cg_refund_status_rank(status) = 3 AS given_back, status_at FROM stripe_refunds
         WHERE charge_id = p_charge OR payment_intent_id = p_intent
    ), c AS (
        SELECT reported_cents, reported_at FROM stripe_charge_refunds
         WHERE charge_id = p_charge OR payment_intent_id = p_intent
         ORDER BY reported_at DESC, reported_cents DESC LIMIT 1
    )
    SELECT greatest(0,
        coalesce((SELECT sum(amount_cents) FROM r WHERE NOT given_back), 0),
        coalesce((SELECT reported_cents FROM c), 0)
          - coalesce((SELECT sum(r.amount_cents) FROM r, c WHERE r.given_back AND r.status_at >= c.reported_at),
                     0))::bigint
$$;

-- What was recorded before: the ledger's and the vault's largest amounts become reported amounts.
INSERT INTO stripe_charge_refunds (payment, charge_id, payment_intent_id, reported_cents, reported_at)
SELECT coalesce(charge_id, payment_intent_id), charge_id, payment_intent_id, refunded_cents, now()
  FROM billing_records WHERE refunded_cents > 0 AND coalesce(charge_id, payment_intent_id) IS NOT NULL
ON CONFLICT (payment) DO UPDATE SET reported_cents = greatest(stripe_charge_refunds.reported_cents,
                                                              EXCLUDED.reported_cents);
INSERT INTO stripe_charge_refunds (payment, charge_id, payment_intent_id, reported_cents, reported_at)
SELECT stripe_object_id, CASE WHEN stripe_object_id LIKE 'pi\_%' THEN NULL ELSE stripe_object_id END,
       CASE WHEN stripe_object_id LIKE 'pi\_%' THEN stripe_object_id END, refunded_cents, now()
  FROM vault_spend WHERE refunded_cents > 0 AND stripe_object_id IS NOT NULL
ON CONFLICT (payment) DO UPDATE SET reported_cents = greatest(stripe_charge_refunds.reported_cents,
                                                              EXCLUDED.reported_cents);
