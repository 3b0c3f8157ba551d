-- The vault proxy (issue 9) learned what 0003 left open: a reservation must remember the request it stands
-- for, so a row left `uncertain` (5xx, timeout, disconnect) can be resolved later by replaying it under the
-- same Idempotency-Key, or by searching the customer's charges for it; and the cap check plus the
-- reservation is one server-side function, so it is one round trip and one atomic step.

COMMENT ON COLUMN vault_keys.allowed_endpoints IS
    'operations the key may call: charges.create, payment_intents.create, charges.read, payment_intents.read';

ALTER TABLE vault_spend
    -- The forwarded request (never the Authorization header): what the resolver replays.
    ADD COLUMN request_path    text,
    ADD COLUMN request_body    text,
    -- The Stripe customer of the request, when it named one: what the resolver searches past Stripe's 24 h.
    ADD COLUMN customer        text,
    -- The resolver's bookkeeping: how often it tried, when it may try again, and what it last learned.
    ADD COLUMN resolve_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN next_resolve_at  timestamptz,
    ADD COLUMN last_error       text;

ALTER TABLE vault_audit
    -- Stripe's Request-Id of the forwarded call, to match an audit row with Stripe's request log.
    ADD COLUMN request_id text;

-- Why: the resolver's loop picks rows due for another look (uncertain, or reserved and stale after a proxy
-- crash), oldest due first. Replaces the 0003 index on updated_at, which the resolver no longer orders by.
DROP INDEX vault_spend_unresolved_idx;
CREATE INDEX vault_spend_unresolved_idx ON vault_spend (next_resolve_at, updated_at)
    WHERE state IN ('reserved', 'uncertain');

-- What each key has committed (reserved + settled + uncertain), kept by a trigger on vault_spend so the cap
-- check reads one locked row instead of summing every reservation the key ever made (that sum grew with the
-- period and became the proxy's bottleneck: thousands of rows per key under load).
ALTER TABLE vault_keys ADD COLUMN committed_cents bigint NOT NULL DEFAULT 0 CHECK (committed_cents >= 0);
UPDATE vault_keys k SET committed_cents = coalesce((SELECT sum(s.amount_cents) FROM vault_spend s
    WHERE s.vault_key_id = k.id AND s.state IN ('reserved', 'settled', 'uncertain')), 0);

CREATE FUNCTION cg_vault_spend_committed() RETURNS trigger
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
        delta := delta + NEW.amount_cents;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') AND OLD.state IN ('reserved', 'settled', 'uncertain') THEN
        delta := delta - OLD.amount_cents;
    END IF;
    IF delta <> 0 THEN
        UPDATE vault_keys SET committed_cents = committed_cents + delta
         WHERE id = coalesce(NEW.vault_key_id, OLD.vault_key_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER vault_spend_committed AFTER INSERT OR UPDATE OF state, amount_cents OR DELETE ON vault_spend
    FOR EACH ROW EXECUTE FUNCTION cg_vault_spend_committed();

-- The atomic "find or reserve" step, for a batch of requests of one key (the proxy sends the creates that
-- arrive while a batch is in flight together), processed in order: element i sees elements < i. Locks the
-- key's row first (FOR NO KEY UPDATE serialises every batch of one key, and every release, whose trigger
-- updates the same row); the locking SELECT returns the row's latest committed version, so committed_cents
-- includes every reservation committed before the lock was granted, and later statements (READ COMMITTED)
-- see the key's spend rows as of then: the cap can never be overshot by a race, and a retry always finds its
-- row. The counter is written once per batch.
--
-- outcome, per element:
--   reserved          a new row, counted now (the caller owns it: settle / release / uncertain)
--   rereserved        a released row for this key taken again at the new amount, counted again (the
--                     caller owns it)
--   existing          a reserved / settled / uncertain row: a retry, not counted again (state returned)
--   cap_exceeded      committed + amount > cap; nothing written
--   amount_mismatch   the key was first used with another amount (Stripe would answer idempotency_error)
--   key_expired       the row is older than `same_key_window_s`: Stripe may have pruned the key, so
--                     forwarding could charge again without counting; refused
--   key_unusable      the key is unknown, revoked or expired (it may have been revoked since auth)
-- committed_cents and cap_cents describe the key after the element (for the utilisation gauge).
CREATE FUNCTION cg_vault_reserve_many(p_key text, p_idems text[], p_amounts bigint[], p_paths text[],
                                      p_bodies text[], p_customers text[], p_same_key_window_s bigint)
RETURNS TABLE (ord integer, outcome text, state text, committed_cents bigint, cap_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    k         vault_keys%ROWTYPE;
    r         vault_spend%ROWTYPE;
    i         integer;
    n         integer := coalesce(array_length(p_idems, 1), 0);
    committed bigint;
    usable    boolean;
BEGIN
    -- NO KEY UPDATE, not UPDATE: it serialises reservations just the same, but does not block the KEY SHARE
    -- locks that inserts into vault_spend / vault_audit take on the key through their foreign keys.
    SELECT * INTO k FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    usable := FOUND AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now());
    committed := coalesce(k.committed_cents, 0);
    PERFORM set_config('cg.vault_reserving', 'on', true);
    FOR i IN 1 .. n LOOP
        ord := i;
        state := NULL;
        cap_cents := k.cap_cents;
        IF NOT usable THEN
            outcome := 'key_unusable';
            committed_cents := NULL;
            cap_cents := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT * INTO r FROM vault_spend s WHERE s.vault_key_id = p_key AND s.idempotency_key = p_idems[i];
        IF FOUND THEN
            state := r.state;
            IF r.state = 'released' THEN
                -- Stripe refused it (or never saw it): a retry may execute, so it counts again, at its own amount.
                IF committed + p_amounts[i] > k.cap_cents THEN
                    outcome := 'cap_exceeded';
                ELSE
                    UPDATE vault_spend s SET state = 'reserved', amount_cents = p_amounts[i], request_path = p_paths[i],
                           request_body = p_bodies[i], customer = p_customers[i], reserved_at = now(),
                           resolve_attempts = 0, next_resolve_at = NULL, last_error = NULL
                     WHERE s.vault_key_id = p_key AND s.idempotency_key = p_idems[i];
                    committed := committed + p_amounts[i];
                    outcome := 'rereserved';
                    state := 'reserved';
                END IF;
            ELSIF r.amount_cents <> p_amounts[i] THEN
                outcome := 'amount_mismatch';
            ELSIF r.reserved_at < now() - p_same_key_window_s * interval '1 second' THEN
                outcome := 'key_expired';
            ELSE
                outcome := 'existing';
            END IF;
        ELSIF committed + p_amounts[i] > k.cap_cents THEN
            outcome := 'cap_exceeded';
        ELSE
            INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, request_path, request_body,
                                     customer)
                VALUES (p_key, p_idems[i], p_amounts[i], 'reserved', p_paths[i], p_bodies[i], p_customers[i]);
            committed := committed + p_amounts[i];
            outcome := 'reserved';
            state := 'reserved';
        END IF;
        committed_cents := committed;
        RETURN NEXT;
    END LOOP;
    IF usable AND committed <> k.committed_cents THEN
        UPDATE vault_keys SET committed_cents = committed WHERE id = p_key;
    END IF;
    PERFORM set_config('cg.vault_reserving', 'off', true);
END
$$;

-- One request: a batch of one.
CREATE FUNCTION cg_vault_reserve(p_key text, p_idem text, p_amount bigint, p_path text, p_body text,
                                 p_customer text, p_same_key_window_s bigint,
                                 OUT outcome text, OUT state text, OUT committed_cents bigint,
                                 OUT cap_cents bigint)
LANGUAGE sql AS $$
    SELECT m.outcome, m.state, m.committed_cents, m.cap_cents
      FROM cg_vault_reserve_many(p_key, ARRAY[p_idem], ARRAY[p_amount], ARRAY[p_path], ARRAY[p_body],
                                 ARRAY[p_customer], p_same_key_window_s) m
$$;
