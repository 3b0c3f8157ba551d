-- Cheaper rows for cg_vault_step (issue 9, benchmark work). With `pg_stat_statements.track = all` the
-- proxy's statement spent, per request, about 50 µs in the reservation INSERT and 50 µs in the settlement
-- (a SELECT … FOR UPDATE then an UPDATE, each row firing the plpgsql touch trigger), on a 2-core machine
-- shared with the proxy, the client and Stripe's double. This migration:
--   * drops vault_spend_counted_idx: nothing reads it since 0004 keeps vault_keys.committed_cents, yet every
--     reservation and every settlement maintained it (and it was the index a cached settle plan wandered
--     into, walking every counted row of the key);
--   * lets the touch trigger stand aside inside cg_vault_step, which sets updated_at itself;
--   * settles each row with one UPDATE (its state condition in the WHERE) instead of a locking SELECT and
--     an UPDATE;
--   * reserves a whole batch with one INSERT … SELECT FROM unnest(…) when the batch fits under the cap even
--     if every element counted (the common case: far from the cap). Elements it did not insert (a retry of
--     an existing Idempotency-Key, a repeat inside the batch) then take the per-element path of 0008, in
--     order; because the whole batch fits, each outcome is the one the in-order loop gives. Near the cap the
--     batch goes element by element exactly as before;
--   * adds cg_vault_settle_many: the settlements that leave the committed total as it is (reserved or
--     uncertain → settled, what almost every answer is) of any keys, in one statement that takes no key's
--     lock, so they no longer ride with (and lengthen) the next reservation batch of their key.
DROP INDEX vault_spend_counted_idx;

DROP TRIGGER vault_spend_touch ON vault_spend;
CREATE TRIGGER vault_spend_touch BEFORE UPDATE ON vault_spend
    FOR EACH ROW WHEN (current_setting('cg.vault_reserving', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION cg_touch_updated_at();

CREATE OR REPLACE FUNCTION cg_vault_step(p_key text,
                                         p_s_idems text[], p_s_states text[], p_s_objects text[],
                                         p_s_errors text[], p_s_delays_ms bigint[],
                                         p_idems text[], p_amounts bigint[], p_paths text[], p_bodies text[],
                                         p_customers text[], p_same_key_window_s bigint)
RETURNS TABLE (ord integer, outcome text, state text, committed_cents bigint, cap_cents bigint)
LANGUAGE plpgsql AS $$
DECLARE
    k         vault_keys%ROWTYPE;
    r         vault_spend%ROWTYPE;
    i         integer;
    n         integer := coalesce(array_length(p_idems, 1), 0);
    m         integer := coalesce(array_length(p_s_idems, 1), 0);
    committed bigint;
    usable    boolean;
    amt       bigint;
    bulk      boolean := false;
    inserted  text[] := '{}';
BEGIN
    -- The key's row first: serialises every step of one key (NO KEY UPDATE does not block the KEY SHARE
    -- locks of the foreign keys of vault_spend / vault_audit inserts).
    SELECT * INTO k FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        FOR i IN 1 .. n LOOP
            ord := i; outcome := 'key_unusable'; state := NULL; committed_cents := NULL; cap_cents := NULL;
            RETURN NEXT;
        END LOOP;
        RETURN;
    END IF;
    usable := k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now());
    committed := k.committed_cents;
    -- This function keeps vault_keys.committed_cents and updated_at itself (both triggers stand aside).
    PERFORM set_config('cg.vault_reserving', 'on', true);

    -- Settlements, in order, each one UPDATE by primary key whose WHERE names the states it may move from
    -- (the transitions of 0008; any other is a no-op: the row moved on).
    FOR i IN 1 .. m LOOP
        IF p_s_states[i] = 'settled' THEN
            UPDATE vault_spend s SET state = 'settled', stripe_object_id = p_s_objects[i], next_resolve_at = NULL,
                   updated_at = now()
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i]
               AND s.state IN ('reserved', 'uncertain');
            IF NOT FOUND THEN
                -- A retry's 2xx after the owner's 4xx: Stripe did charge it, so it counts again.
                UPDATE vault_spend s SET state = 'settled', stripe_object_id = p_s_objects[i],
                       next_resolve_at = NULL, updated_at = now()
                 WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i] AND s.state = 'released'
                RETURNING s.amount_cents INTO amt;
                IF FOUND THEN
                    committed := committed + amt;
                END IF;
            END IF;
        ELSIF p_s_states[i] = 'released' THEN
            UPDATE vault_spend s SET state = 'released', last_error = p_s_errors[i], next_resolve_at = NULL,
                   updated_at = now()
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i]
               AND s.state IN ('reserved', 'uncertain')
            RETURNING s.amount_cents INTO amt;
            IF FOUND THEN
                committed := committed - amt;
            END IF;
        ELSIF p_s_states[i] = 'uncertain' THEN
            UPDATE vault_spend s SET state = 'uncertain', last_error = p_s_errors[i],
                   next_resolve_at = now() + p_s_delays_ms[i] * interval '1 millisecond', updated_at = now()
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i] AND s.state = 'reserved';
        ELSE
            RAISE EXCEPTION 'cg_vault_step: unknown settlement state %', p_s_states[i];
        END IF;
    END LOOP;

    -- The whole batch in one INSERT when it fits even if every element counted. DISTINCT ON keeps the first
    -- element of each Idempotency-Key (the one the in-order loop would reserve).
    IF usable AND n > 0 THEN
        SELECT committed + coalesce(sum(a), 0) <= k.cap_cents INTO bulk FROM unnest(p_amounts) AS a;
    END IF;
    IF bulk THEN
        WITH ins AS (
            INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, request_path,
                                     request_body, customer)
            SELECT DISTINCT ON (u.idem) p_key, u.idem, u.amount, 'reserved', u.path, u.body, u.customer
              FROM unnest(p_idems, p_amounts, p_paths, p_bodies, p_customers)
                   WITH ORDINALITY AS u(idem, amount, path, body, customer, o)
             ORDER BY u.idem, u.o
            ON CONFLICT (vault_key_id, idempotency_key) DO NOTHING
            RETURNING idempotency_key)
        SELECT coalesce(array_agg(ins.idempotency_key), '{}') INTO inserted FROM ins;
    END IF;

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
        IF bulk AND p_idems[i] = ANY (inserted) THEN
            inserted := array_remove(inserted, p_idems[i]);  -- a repeat later in the batch finds the row
            committed := committed + p_amounts[i];
            outcome := 'reserved';
            state := 'reserved';
            committed_cents := committed;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Element by element, as 0008: a new Idempotency-Key that fits is one INSERT.
        IF NOT bulk AND committed + p_amounts[i] <= k.cap_cents THEN
            INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, request_path,
                                     request_body, customer)
                VALUES (p_key, p_idems[i], p_amounts[i], 'reserved', p_paths[i], p_bodies[i], p_customers[i])
                ON CONFLICT (vault_key_id, idempotency_key) DO NOTHING;
            IF FOUND THEN
                committed := committed + p_amounts[i];
                outcome := 'reserved';
                state := 'reserved';
                committed_cents := committed;
                RETURN NEXT;
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO r FROM vault_spend s WHERE s.vault_key_id = p_key AND s.idempotency_key = p_idems[i];
        IF FOUND THEN
            state := r.state;
            IF r.state = 'released' THEN
                -- Stripe refused it (or never saw it): a retry may execute, so it counts again, at its own
                -- amount.
                IF committed + p_amounts[i] > k.cap_cents THEN
                    outcome := 'cap_exceeded';
                ELSE
                    UPDATE vault_spend s SET state = 'reserved', amount_cents = p_amounts[i],
                           request_path = p_paths[i], request_body = p_bodies[i], customer = p_customers[i],
                           reserved_at = now(), resolve_attempts = 0, next_resolve_at = NULL, last_error = NULL,
                           updated_at = now()
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
        ELSE
            outcome := 'cap_exceeded';
        END IF;
        committed_cents := committed;
        RETURN NEXT;
    END LOOP;

    IF committed <> k.committed_cents THEN
        UPDATE vault_keys SET committed_cents = committed WHERE id = p_key;
    END IF;
    PERFORM set_config('cg.vault_reserving', 'off', true);
END
$$;

-- Settles (reserved / uncertain → settled) rows of any keys: element i is (p_keys[i], p_idems[i]) with Stripe's
-- object p_objects[i]. The committed total does not change (both states count), so no key's lock is taken and
-- no reservation batch waits for it. Returns the elements it did not apply because the row was in another
-- state: settled already (a no-op through cg_vault_step too) or released (a retry's 2xx after the owner's 4xx,
-- which counts again and so goes through cg_vault_step under the key's lock). Callers send the elements sorted
-- by (key, Idempotency-Key), so two concurrent calls lock rows in one order.
CREATE FUNCTION cg_vault_settle_many(p_keys text[], p_idems text[], p_objects text[])
RETURNS TABLE (ord integer)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    n integer := coalesce(array_length(p_idems, 1), 0);
BEGIN
    -- The committed-total trigger (its delta is zero here) and the touch trigger stand aside.
    PERFORM set_config('cg.vault_reserving', 'on', true);
    FOR i IN 1 .. n LOOP
        UPDATE vault_spend s SET state = 'settled', stripe_object_id = p_objects[i], next_resolve_at = NULL,
               updated_at = now()
         WHERE s.vault_key_id = p_keys[i] AND s.idempotency_key = p_idems[i]
           AND s.state IN ('reserved', 'uncertain');
        IF NOT FOUND THEN
            ord := i;
            RETURN NEXT;
        END IF;
    END LOOP;
    PERFORM set_config('cg.vault_reserving', 'off', true);
END
$$;
