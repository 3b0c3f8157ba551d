-- The vault proxy's per-key step (issue 9, benchmark work): what used to be one round trip to reserve before
-- forwarding plus one more to settle before answering is now one round trip per batch. A proxy answers its
-- client first and queues the reservation's settlement (settled / released / uncertain); the queued
-- settlements of a key ride along with that key's next reservation batch, applied first, in order, under the
-- same key-row lock (so a release frees room for the reservations that follow it), or go alone shortly after
-- when no reservation comes. A proxy that dies between its answer and the settlement leaves the row
-- `reserved`: still counted against the cap, and the resolver takes it up once it is `--stale-reserved` old.
--
-- cg_vault_step(key, settlements…, reservations…, window):
--   settlements (p_s_*): for each i, the row (key, p_s_idems[i]) moves to p_s_states[i]:
--     settled    from reserved / uncertain (no change to the committed total) or from released (a retry's
--                2xx after the owner's 4xx: Stripe did charge it, so it counts again)
--     released   from reserved / uncertain (no longer counted)
--     uncertain  from reserved, due for the resolver after p_s_delays_ms[i]
--   any other transition is a no-op (the row moved on: the resolver or another replica got there first).
--   Settlements apply even when the key has been revoked or has expired since.
--   reservations (p_idems …): exactly as cg_vault_reserve_many (0004), after the settlements.
-- Returns one row per reservation (ord, outcome, state, committed_cents, cap_cents), none for settlements.
CREATE FUNCTION cg_vault_step(p_key text,
                              p_s_idems text[], p_s_states text[], p_s_objects text[], p_s_errors text[],
                              p_s_delays_ms bigint[],
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
    old_state text;
BEGIN
    -- The key's row first, as cg_vault_reserve_many: serialises every step of one key (NO KEY UPDATE does
    -- not block the KEY SHARE locks of the foreign keys of vault_spend / vault_audit inserts).
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
    -- This function keeps vault_keys.committed_cents itself, once per call (the trigger stands aside).
    PERFORM set_config('cg.vault_reserving', 'on', true);

    -- Settlements, row by row in order. Each statement is a lookup by primary key only: with a state in the
    -- WHERE the planner may pick vault_spend_counted_idx (0003, on vault_key_id only, its predicate implied)
    -- and walk every counted row of the key (a settle got slower as the period filled); and a set-based
    -- statement's cached plan (made while the table was small) could hash-join over the whole table.
    FOR i IN 1 .. m LOOP
        SELECT s.state, s.amount_cents INTO old_state, amt FROM vault_spend s
         WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i] FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        IF p_s_states[i] = 'settled' THEN
            CONTINUE WHEN old_state = 'settled';
            UPDATE vault_spend s SET state = 'settled', stripe_object_id = p_s_objects[i], next_resolve_at = NULL
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i];
            IF old_state = 'released' THEN
                committed := committed + amt;
            END IF;
        ELSIF p_s_states[i] = 'released' THEN
            CONTINUE WHEN old_state NOT IN ('reserved', 'uncertain');
            UPDATE vault_spend s SET state = 'released', last_error = p_s_errors[i], next_resolve_at = NULL
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i];
            committed := committed - amt;
        ELSIF p_s_states[i] = 'uncertain' THEN
            CONTINUE WHEN old_state <> 'reserved';
            UPDATE vault_spend s SET state = 'uncertain', last_error = p_s_errors[i],
                   next_resolve_at = now() + p_s_delays_ms[i] * interval '1 millisecond'
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_s_idems[i];
        ELSE
            RAISE EXCEPTION 'cg_vault_step: unknown settlement state %', p_s_states[i];
        END IF;
    END LOOP;

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
        -- The common case first: a new Idempotency-Key that fits is one INSERT.
        IF committed + p_amounts[i] <= k.cap_cents THEN
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
                           reserved_at = now(), resolve_attempts = 0, next_resolve_at = NULL, last_error = NULL
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

-- The committed-total trigger stands aside inside cg_vault_step / cg_vault_reserve_many (they keep the total
-- themselves); with the condition in WHEN, PostgreSQL does not even queue the trigger event for their rows.
DROP TRIGGER vault_spend_committed ON vault_spend;
CREATE TRIGGER vault_spend_committed AFTER INSERT OR UPDATE OF state, amount_cents OR DELETE ON vault_spend
    FOR EACH ROW WHEN (current_setting('cg.vault_reserving', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION cg_vault_spend_committed();

-- One implementation of the reservation step: cg_vault_reserve_many (0004; cg_vault_reserve calls it) is now a
-- step without settlements.
CREATE OR REPLACE FUNCTION cg_vault_reserve_many(p_key text, p_idems text[], p_amounts bigint[], p_paths text[],
                                                 p_bodies text[], p_customers text[], p_same_key_window_s bigint)
RETURNS TABLE (ord integer, outcome text, state text, committed_cents bigint, cap_cents bigint)
LANGUAGE sql AS $$
    SELECT * FROM cg_vault_step(p_key, '{}', '{}', '{}', '{}', '{}', p_idems, p_amounts, p_paths, p_bodies,
                                p_customers, p_same_key_window_s)
$$;
