-- Leases of a vault key's cap (docs/design.md §5, "Cap leases"). A proxy that sees a steady stream of
-- creates for a key takes a slice of the key's free room in one statement and spends it in memory, so a
-- create no longer waits for a PostgreSQL round trip before it is forwarded; the spends are written after
-- (cg_vault_lease_record, batched), and the slice is topped up before it runs out.
--
-- The cap's arithmetic: vault_keys.committed_cents still counts the reservation rows (reserved, settled,
-- uncertain), and vault_keys.leased_cents counts what open leases hold and have not yet recorded as rows
-- (the sum of granted_cents - spent_cents over the key's open leases). Every statement that adds room to
-- either checks committed_cents + leased_cents + the addition <= cap_cents under the key's row lock, so
-- what Stripe may have charged — the rows plus what any holder may have spent from its lease — never passes
-- the cap. A spend recorded from a lease moves its cents from leased_cents to committed_cents (the sum does
-- not change); a holder gives back only cents it has not spent.
--
-- A holder that dies keeps its lease open: the cents it held stay counted (it may have forwarded creates
-- whose rows it never wrote), whatever expires_at says, until an operator forfeits the lease with
-- cg_vault_lease_forfeit after checking Stripe (docs/operating/vault.md). expires_at is the holder's own
-- bound: it spends from a lease only until then (by its own clock, from before it sent the statement), so a
-- lease past its expiry with no holder renewing it is one whose holder stopped.
--
-- A binary of 0022 or later runs on this schema: its cg_vault_step (replaced below, same signature) counts
-- the leases, and it takes none.
-- chargeguard: compatible-down-to 0022

ALTER TABLE vault_keys ADD COLUMN leased_cents bigint NOT NULL DEFAULT 0 CHECK (leased_cents >= 0);

CREATE TABLE vault_leases (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    vault_key_id  text        NOT NULL REFERENCES vault_keys (id),
    -- The proxy process holding it (host, pid and a random part): a lease is spent by one process only.
    holder        text        NOT NULL CHECK (holder <> ''),
    granted_cents bigint      NOT NULL DEFAULT 0 CHECK (granted_cents >= 0),
    -- Recorded spends (rows written, or a retry past the same-key window counted without one).
    spent_cents   bigint      NOT NULL DEFAULT 0 CHECK (spent_cents >= 0 AND spent_cents <= granted_cents),
    taken_at      timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    -- Set when the holder gave back what it had not spent (or an operator forfeited it).
    closed_at     timestamptz,
    closed_by     text CHECK (closed_by IN ('holder', 'forfeit'))
);

-- Why: a key's open leases (the operator's view, the forfeit, the consistency check of leased_cents).
CREATE INDEX vault_leases_open_idx ON vault_leases (vault_key_id) WHERE closed_at IS NULL;

-- Takes a new lease (p_lease NULL) or tops up and renews one the holder has: grants
-- least(p_want, free room / 8), or nothing when that is below p_min — so near the cap no lease is granted
-- and every create goes through cg_vault_step, which reaches the cap exactly. Renews expires_at to now() +
-- p_ttl_ms either way. Returns the lease (NULL when none was taken), the cents granted now, and whether the
-- key may spend (not revoked, not expired); an unusable key gets nothing and its lease is not renewed.
CREATE FUNCTION cg_vault_lease_take(p_key text, p_lease bigint, p_holder text, p_want bigint, p_min bigint,
                                    p_ttl_ms bigint,
                                    OUT lease_id bigint, OUT granted bigint, OUT usable boolean)
LANGUAGE plpgsql AS $$
DECLARE
    k    vault_keys%ROWTYPE;
    room bigint;
BEGIN
    lease_id := p_lease;
    granted := 0;
    SELECT * INTO k FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    usable := FOUND AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now());
    IF NOT usable THEN
        RETURN;
    END IF;
    room := k.cap_cents - k.committed_cents - k.leased_cents;
    granted := least(p_want, room / 8);
    IF granted < greatest(p_min, 1) THEN
        granted := 0;
    END IF;
    IF p_lease IS NULL THEN
        IF granted = 0 THEN
            RETURN;
        END IF;
        INSERT INTO vault_leases (vault_key_id, holder, granted_cents, expires_at)
            VALUES (p_key, p_holder, granted, now() + p_ttl_ms * interval '1 millisecond')
            RETURNING id INTO lease_id;
    ELSE
        UPDATE vault_leases SET granted_cents = granted_cents + granted,
               expires_at = now() + p_ttl_ms * interval '1 millisecond'
         WHERE id = p_lease AND vault_key_id = p_key AND holder = p_holder AND closed_at IS NULL;
        IF NOT FOUND THEN
            -- Forfeited (or not this holder's): nothing more under it.
            lease_id := NULL;
            granted := 0;
            RETURN;
        END IF;
    END IF;
    IF granted > 0 THEN
        UPDATE vault_keys SET leased_cents = leased_cents + granted WHERE id = p_key;
    END IF;
END
$$;

-- Records spends made from a lease, in order, as reservation rows (state reserved, as cg_vault_step writes
-- them; the holder's settlements follow). Per element, as cg_vault_step's outcomes:
--   reserved          a new row: its cents move from the lease to the committed total
--   rereserved        a released row taken again at the new amount: likewise
--   existing          a retry of a counted row: nothing moves, the holder's lease gets the cents back
--   amount_mismatch   the key was first used with another amount (Stripe refuses the request): likewise
--   key_expired       the row is older than the same-key window, so Stripe may have charged again: the
--                     cents move to the committed total without a row (counted, never given back)
-- A spend is recorded whatever became of the key since (revoked, expired): it has been forwarded.
CREATE FUNCTION cg_vault_lease_record(p_key text, p_lease bigint, p_idems text[], p_amounts bigint[],
                                      p_paths text[], p_bodies text[], p_customers text[],
                                      p_same_key_window_s bigint)
RETURNS TABLE (ord integer, outcome text, state text)
LANGUAGE plpgsql AS $$
DECLARE
    r     vault_spend%ROWTYPE;
    i     integer;
    n     integer := coalesce(array_length(p_idems, 1), 0);
    moved bigint := 0;
BEGIN
    PERFORM 1 FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    -- This function keeps committed_cents and updated_at itself (both triggers stand aside).
    PERFORM set_config('cg.vault_reserving', 'on', true);
    FOR i IN 1 .. n LOOP
        ord := i;
        INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, request_path,
                                 request_body, customer)
            VALUES (p_key, p_idems[i], p_amounts[i], 'reserved', p_paths[i], p_bodies[i], p_customers[i])
            ON CONFLICT (vault_key_id, idempotency_key) DO NOTHING;
        IF FOUND THEN
            moved := moved + p_amounts[i];
            outcome := 'reserved';
            state := 'reserved';
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT * INTO r FROM vault_spend s WHERE s.vault_key_id = p_key AND s.idempotency_key = p_idems[i];
        state := r.state;
        IF r.state = 'released' THEN
            UPDATE vault_spend s SET state = 'reserved', amount_cents = p_amounts[i], request_path = p_paths[i],
                   request_body = p_bodies[i], customer = p_customers[i], reserved_at = now(),
                   resolve_attempts = 0, next_resolve_at = NULL, last_error = NULL, updated_at = now()
             WHERE s.vault_key_id = p_key AND s.idempotency_key = p_idems[i];
            moved := moved + p_amounts[i];
            outcome := 'rereserved';
            state := 'reserved';
        ELSIF r.amount_cents <> p_amounts[i] THEN
            outcome := 'amount_mismatch';
        ELSIF r.reserved_at < now() - p_same_key_window_s * interval '1 second' THEN
            moved := moved + p_amounts[i];
            outcome := 'key_expired';
        ELSE
            outcome := 'existing';
        END IF;
        RETURN NEXT;
    END LOOP;
    IF moved > 0 THEN
        -- Fails (spent_cents <= granted_cents, leased_cents >= 0) rather than record more than the lease held.
        UPDATE vault_leases SET spent_cents = spent_cents + moved WHERE id = p_lease AND vault_key_id = p_key;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'cg_vault_lease_record: no lease % of key %', p_lease, p_key;
        END IF;
        UPDATE vault_keys SET committed_cents = committed_cents + moved, leased_cents = leased_cents - moved
         WHERE id = p_key;
    END IF;
    PERFORM set_config('cg.vault_reserving', 'off', true);
END
$$;

-- The holder gives back p_cents it has not spent (at most what the lease still holds), and closes the lease
-- when p_close (it then has nothing in flight and nothing unrecorded under it). Returns the cents given back.
CREATE FUNCTION cg_vault_lease_return(p_key text, p_lease bigint, p_holder text, p_cents bigint,
                                      p_close boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    l    vault_leases%ROWTYPE;
    back bigint;
BEGIN
    PERFORM 1 FROM vault_keys WHERE id = p_key FOR NO KEY UPDATE;
    SELECT * INTO l FROM vault_leases
     WHERE id = p_lease AND vault_key_id = p_key AND holder = p_holder AND closed_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    back := least(greatest(p_cents, 0), l.granted_cents - l.spent_cents);
    UPDATE vault_leases SET granted_cents = granted_cents - back,
           closed_at = CASE WHEN p_close THEN now() END, closed_by = CASE WHEN p_close THEN 'holder' END
     WHERE id = p_lease;
    IF back > 0 THEN
        UPDATE vault_keys SET leased_cents = leased_cents - back WHERE id = p_key;
    END IF;
    RETURN back;
END
$$;

-- An operator's release of a dead holder's lease (docs/operating/vault.md): of what it still holds,
-- p_keep_cents — the creates the holder forwarded whose rows it never wrote, found on Stripe by their vault
-- tag — stay counted (moved to the committed total, as a record moves them) and the rest goes back to the
-- cap. Only for a lease whose holder is gone: a live holder may still have spends in flight under it.
-- Returns the cents given back (NULL: no open lease).
CREATE FUNCTION cg_vault_lease_forfeit(p_lease bigint, p_keep_cents bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    l    vault_leases%ROWTYPE;
    keep bigint;
BEGIN
    SELECT * INTO l FROM vault_leases WHERE id = p_lease;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM vault_keys WHERE id = l.vault_key_id FOR NO KEY UPDATE;
    SELECT * INTO l FROM vault_leases WHERE id = p_lease AND closed_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    keep := least(greatest(p_keep_cents, 0), l.granted_cents - l.spent_cents);
    UPDATE vault_leases SET spent_cents = spent_cents + keep, granted_cents = spent_cents + keep,
           closed_at = now(), closed_by = 'forfeit'
     WHERE id = p_lease;
    UPDATE vault_keys SET committed_cents = committed_cents + keep,
           leased_cents = leased_cents - (l.granted_cents - l.spent_cents)
     WHERE id = l.vault_key_id;
    RETURN l.granted_cents - l.spent_cents - keep;
END
$$;

-- cg_vault_step (0009) as before, with the leases' cents counted: a reservation fits when committed +
-- leased + its amount <= cap, and committed_cents in its answer includes what leases hold (the refusal and
-- the utilisation gauge speak of the whole cap).
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
        SELECT committed + coalesce(sum(a), 0) <= k.cap_cents - k.leased_cents INTO bulk
          FROM unnest(p_amounts) AS a;
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
            committed_cents := committed + k.leased_cents;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Element by element, as 0008: a new Idempotency-Key that fits is one INSERT.
        IF NOT bulk AND committed + p_amounts[i] <= k.cap_cents - k.leased_cents THEN
            INSERT INTO vault_spend (vault_key_id, idempotency_key, amount_cents, state, request_path,
                                     request_body, customer)
                VALUES (p_key, p_idems[i], p_amounts[i], 'reserved', p_paths[i], p_bodies[i], p_customers[i])
                ON CONFLICT (vault_key_id, idempotency_key) DO NOTHING;
            IF FOUND THEN
                committed := committed + p_amounts[i];
                outcome := 'reserved';
                state := 'reserved';
                committed_cents := committed + k.leased_cents;
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
                IF committed + p_amounts[i] > k.cap_cents - k.leased_cents THEN
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
        committed_cents := committed + k.leased_cents;
        RETURN NEXT;
    END LOOP;

    IF committed <> k.committed_cents THEN
        UPDATE vault_keys SET committed_cents = committed WHERE id = p_key;
    END IF;
    PERFORM set_config('cg.vault_reserving', 'off', true);
END
$$;

