-- chargeguard: compatible-down-to 0017
-- Corrections of a charged period (docs/design.md §4a). A billing event with "revision": N > 0 says "the
-- period's total is now amount_cents"; revision N applies only once N−1 has (0 is the original charge in
-- billing_records), and moves the difference between that total and the money the ledger has moved for
-- the period so far: a charge when positive, refunds when negative. Each revision is one row here (the
-- history: original, each revision, what it moved) and each Stripe call one row of
-- billing_correction_moves, planned before Stripe hears of any of them, under a key derived from the
-- original key and the revision.
--
-- New tables and functions only: binaries of schema 0017 keep working (they never read them; a revision
-- reaching one of them is an ordinary payload conflict, as before).

CREATE TABLE billing_corrections (
    -- base_key || '-r' || revision (billing/correction_ledger.hpp): the key of its first money move.
    key               text        PRIMARY KEY CHECK (key <> ''),
    -- The original's billing_records key. No foreign key (as dead_letters.billing_key): benches and the lab
    -- truncate billing_records on their own; cg_correction_admit locks the original row itself.
    base_key          text        NOT NULL CHECK (base_key <> ''),
    revision          int         NOT NULL CHECK (revision > 0),
    total_cents       bigint      NOT NULL CHECK (total_cents >= 0),
    currency          text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- total_cents less the money moved for the period before this revision started; set when it starts.
    delta_cents       bigint,
    -- waiting: seen, its predecessor not applied yet; pending: its moves are planned and being made (leased);
    -- applied: every move done; declined: its charge was declined (nothing moved); failed: Stripe refused a
    -- move as sent (dead-lettered); superseded: never applied, a later revision was (a no-op).
    status            text        NOT NULL DEFAULT 'waiting'
        CHECK (status IN ('waiting', 'pending', 'applied', 'declined', 'failed', 'superseded')),
    note              text,
    lease_until       timestamptz,
    lease_epoch       bigint      NOT NULL DEFAULT 0,
    nsq_message_id    text,
    raw_body          text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    UNIQUE (base_key, revision)
);

CREATE TABLE billing_correction_moves (
    correction_key          text        NOT NULL REFERENCES billing_corrections (key),
    part                    int         NOT NULL CHECK (part >= 1),
    kind                    text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount_cents            bigint      NOT NULL CHECK (amount_cents > 0),
    -- A refund's charge (ch_…): the payment it gives money back from.
    refund_of               text        CHECK ((kind = 'refund') = (refund_of IS NOT NULL)),
    key_generation          int         NOT NULL DEFAULT 1 CHECK (key_generation >= 1),
    -- pending → done (stripe_object_id: the charge, or the refund re_…) | declined | failed.
    status                  text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'done', 'declined', 'failed')),
    stripe_object_id        text,
    payment_intent_id       text,
    stripe_attempts         int         NOT NULL DEFAULT 0,
    first_stripe_attempt_at timestamptz,
    last_stripe_attempt_at  timestamptz,
    indeterminate_since     timestamptz,
    last_error              text,
    PRIMARY KEY (correction_key, part),
    CONSTRAINT billing_correction_moves_done_has_object CHECK (status <> 'done' OR stripe_object_id IS NOT NULL)
);
-- Why: the refund plan reads, per charge, what the period's refunds have taken from it.
CREATE INDEX billing_correction_moves_refund_of_idx ON billing_correction_moves (refund_of)
    WHERE refund_of IS NOT NULL;

-- The money the ledger has moved for a period: the original charge (when charged) plus every done charge
-- of its corrections, less every done refund.
CREATE FUNCTION cg_correction_net_cents(p_base text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT amount_cents FROM billing_records WHERE key = p_base AND status = 'charged'), 0)
         + coalesce((SELECT sum(CASE m.kind WHEN 'charge' THEN m.amount_cents ELSE -m.amount_cents END)
                       FROM billing_correction_moves m JOIN billing_corrections c ON c.key = m.correction_key
                      WHERE c.base_key = p_base AND m.status = 'done'), 0)
$$;

-- One step of a revision's delivery, atomically under the original row's lock (so two revisions of one
-- period never plan at once). Returns what the caller does:
--   wait_original     no original row yet, or it is not final (pending, processing, failed, cap_blocked, …)
--   original_declined the original was declined: nothing was charged, nothing to correct (a no-op)
--   conflict          this revision is recorded with another total or currency (dead-lettered)
--   final             the revision already ended (detail: its status): a duplicate
--   superseded        a later revision already started: this one is a no-op
--   wait_predecessor  revision N−1 has not ended yet (detail: its revision)
--   lease_held        another worker holds the revision (lease_ms: its remaining lease)
--   applied_zero      nothing to move (the total equals the money moved): applied at once
--   run               the lease is ours (epoch): make the pending moves
CREATE FUNCTION cg_correction_admit(p_key text, p_base text, p_revision int, p_total bigint, p_currency text,
                                    p_body text, p_message_id text, p_lease_ms bigint)
RETURNS TABLE (action text, detail text, epoch bigint, lease_ms bigint, delta bigint)
LANGUAGE plpgsql AS $$
DECLARE
    orig billing_records%ROWTYPE;
    c billing_corrections%ROWTYPE;
    prev_status text;
    later int;
    d bigint;
    left_cents bigint;
    part_no int := 0;
    ch record;
BEGIN
    SELECT * INTO orig FROM billing_records WHERE key = p_base FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'wait_original', 'no original charge recorded yet', 0::bigint, 0::bigint, NULL::bigint;
        RETURN;
    END IF;
    IF orig.status = 'declined' THEN
        RETURN QUERY SELECT 'original_declined', 'the original charge was declined', 0::bigint, 0::bigint,
                            NULL::bigint;
        RETURN;
    END IF;
    IF orig.status <> 'charged' THEN
        RETURN QUERY SELECT 'wait_original', 'the original charge is ' || orig.status, 0::bigint, 0::bigint,
                            NULL::bigint;
        RETURN;
    END IF;
    IF orig.currency <> p_currency THEN
        RETURN QUERY SELECT 'conflict', 'currency ' || p_currency || ' differs from the original''s ' ||
                            orig.currency, 0::bigint, 0::bigint, NULL::bigint;
        RETURN;
    END IF;

    INSERT INTO billing_corrections (key, base_key, revision, total_cents, currency, raw_body, nsq_message_id)
    VALUES (p_key, p_base, p_revision, p_total, p_currency, p_body, p_message_id)
    ON CONFLICT (key) DO NOTHING;
    SELECT * INTO c FROM billing_corrections WHERE key = p_key FOR UPDATE;

    IF c.status IN ('applied', 'declined', 'failed', 'superseded') THEN
        IF c.total_cents <> p_total THEN
            SELECT max(revision) INTO later FROM billing_corrections
             WHERE base_key = p_base AND revision > p_revision AND status <> 'waiting';
            IF later IS NOT NULL THEN
                RETURN QUERY SELECT 'superseded', 'revision ' || later || ' already started', 0::bigint,
                                    0::bigint, NULL::bigint;
                RETURN;
            END IF;
            RETURN QUERY SELECT 'conflict', 'revision recorded with total ' || c.total_cents, 0::bigint,
                                0::bigint, NULL::bigint;
            RETURN;
        END IF;
        RETURN QUERY SELECT 'final', c.status, 0::bigint, 0::bigint, c.delta_cents;
        RETURN;
    END IF;
    IF c.total_cents <> p_total THEN
        RETURN QUERY SELECT 'conflict', 'revision recorded with total ' || c.total_cents, 0::bigint, 0::bigint,
                            NULL::bigint;
        RETURN;
    END IF;

    SELECT max(revision) INTO later FROM billing_corrections
     WHERE base_key = p_base AND revision > p_revision AND status <> 'waiting';
    IF later IS NOT NULL AND c.status = 'waiting' THEN
        UPDATE billing_corrections SET status = 'superseded', note = 'revision ' || later || ' already started',
               finished_at = now() WHERE key = p_key;
        RETURN QUERY SELECT 'superseded', 'revision ' || later || ' already started', 0::bigint, 0::bigint,
                            NULL::bigint;
        RETURN;
    END IF;

    IF c.status = 'pending' THEN
        IF c.lease_until IS NOT NULL AND c.lease_until > now() THEN
            RETURN QUERY SELECT 'lease_held', 'another worker holds the revision', c.lease_epoch,
                                (extract(epoch FROM c.lease_until - now()) * 1000)::bigint, c.delta_cents;
            RETURN;
        END IF;
        UPDATE billing_corrections SET lease_until = now() + p_lease_ms * interval '1 ms',
               lease_epoch = lease_epoch + 1, nsq_message_id = p_message_id
         WHERE key = p_key RETURNING * INTO c;
        RETURN QUERY SELECT 'run', 'recover', c.lease_epoch, p_lease_ms, c.delta_cents;
        RETURN;
    END IF;

    -- waiting: its predecessor must have ended (the original, for revision 1, is charged: checked above).
    IF p_revision > 1 THEN
        SELECT status INTO prev_status FROM billing_corrections WHERE base_key = p_base AND revision = p_revision - 1;
        IF prev_status IS NULL OR prev_status IN ('waiting', 'pending') THEN
            RETURN QUERY SELECT 'wait_predecessor', (p_revision - 1)::text, 0::bigint, 0::bigint, NULL::bigint;
            RETURN;
        END IF;
    END IF;

    d := p_total - cg_correction_net_cents(p_base);
    IF d = 0 THEN
        UPDATE billing_corrections SET status = 'applied', delta_cents = 0, note = 'nothing to move',
               started_at = now(), finished_at = now() WHERE key = p_key;
        RETURN QUERY SELECT 'applied_zero', 'nothing to move', 0::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF d > 0 THEN
        INSERT INTO billing_correction_moves (correction_key, part, kind, amount_cents)
        VALUES (p_key, 1, 'charge', d);
    ELSE
        -- Refunds, newest payment first: the latest correction's charge, then earlier ones, then the
        -- original; each up to what the period's refunds have not yet taken from it.
        left_cents := -d;
        FOR ch IN
            SELECT p.charge_id, p.amount_cents - coalesce((SELECT sum(r.amount_cents) FROM billing_correction_moves r
                                                             WHERE r.refund_of = p.charge_id
                                                               AND r.status IN ('pending', 'done')), 0) AS room
              FROM (SELECT m.stripe_object_id AS charge_id, m.amount_cents, c2.revision AS rev
                      FROM billing_correction_moves m JOIN billing_corrections c2 ON c2.key = m.correction_key
                     WHERE c2.base_key = p_base AND m.kind = 'charge' AND m.status = 'done'
                    UNION ALL
                    SELECT orig.charge_id, orig.amount_cents, 0) p
             ORDER BY p.rev DESC
        LOOP
            EXIT WHEN left_cents = 0;
            CONTINUE WHEN ch.room <= 0;
            part_no := part_no + 1;
            INSERT INTO billing_correction_moves (correction_key, part, kind, amount_cents, refund_of)
            VALUES (p_key, part_no, 'refund', least(left_cents, ch.room), ch.charge_id);
            left_cents := left_cents - least(left_cents, ch.room);
        END LOOP;
        IF left_cents > 0 THEN
            RAISE EXCEPTION 'correction % refunds % more than the period''s charges hold', p_key, left_cents;
        END IF;
    END IF;
    UPDATE billing_corrections SET status = 'pending', delta_cents = d, started_at = now(),
           lease_until = now() + p_lease_ms * interval '1 ms', lease_epoch = lease_epoch + 1,
           nsq_message_id = p_message_id
     WHERE key = p_key RETURNING * INTO c;
    RETURN QUERY SELECT 'run', 'start', c.lease_epoch, p_lease_ms, d;
END
$$;
