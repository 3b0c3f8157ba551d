-- The spend-cap vault (DESIGN.md §5, §6): keys handed to callers instead of the real Stripe key, what each
-- key has spent, and an audit trail of every proxied call.

CREATE TABLE vault_keys (
    id                text        PRIMARY KEY CHECK (id <> ''),
    name              text        NOT NULL CHECK (name <> ''),
    -- Hash of the secret (the secret itself is printed once by `vault issue` and never stored).
    secret_hash       bytea       NOT NULL CHECK (octet_length(secret_hash) >= 32),
    billing_period    text        NOT NULL CHECK (billing_period <> ''),
    cap_cents         bigint      NOT NULL CHECK (cap_cents >= 0),
    currency          text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- e.g. {"POST /v1/charges","GET /v1/charges"}; empty means nothing is allowed.
    allowed_endpoints text[]      NOT NULL DEFAULT '{}',
    expires_at        timestamptz,
    revoked_at        timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT vault_keys_expiry_after_creation CHECK (expires_at IS NULL OR expires_at > created_at)
);

-- Why: every proxied request authenticates by looking the presented secret's hash up; unique because two
-- keys with one secret would make spend attribution ambiguous.
CREATE UNIQUE INDEX vault_keys_secret_hash_key ON vault_keys (secret_hash);

CREATE TABLE vault_spend (
    vault_key_id     text        NOT NULL REFERENCES vault_keys (id),
    idempotency_key  text        NOT NULL CHECK (idempotency_key <> ''),
    amount_cents     bigint      NOT NULL CHECK (amount_cents > 0),
    -- reserved: counted against the cap, request in flight; settled: Stripe charged; released: Stripe
    -- refused, no longer counted; uncertain: no answer from Stripe, still counted until resolved.
    state            text        NOT NULL DEFAULT 'reserved'
                                 CHECK (state IN ('reserved', 'settled', 'released', 'uncertain')),
    stripe_object_id text,
    reserved_at      timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- A retry with the same idempotency key finds this row (INSERT … ON CONFLICT DO NOTHING) and never counts
    -- against the cap twice.
    PRIMARY KEY (vault_key_id, idempotency_key),
    CONSTRAINT vault_spend_settled_has_object CHECK (state <> 'settled' OR stripe_object_id IS NOT NULL)
);

CREATE TRIGGER vault_spend_touch BEFORE UPDATE ON vault_spend
    FOR EACH ROW EXECUTE FUNCTION cg_touch_updated_at();

-- Why: the atomic "check cap + reserve" statement sums what a key has committed
-- (SUM(amount_cents) WHERE vault_key_id = $1 AND state IN ('reserved','settled','uncertain')) while holding
-- the key's row lock (SELECT … FROM vault_keys WHERE id = $1 FOR UPDATE serialises reservations per key).
-- Partial and covering, so the sum is an index-only scan over the rows that count.
CREATE INDEX vault_spend_counted_idx ON vault_spend (vault_key_id) INCLUDE (amount_cents)
    WHERE state IN ('reserved', 'settled', 'uncertain');

-- Why: the sweeper resolves reservations left reserved/uncertain (proxy crashed, Stripe timed out), oldest
-- first.
CREATE INDEX vault_spend_unresolved_idx ON vault_spend (updated_at) WHERE state IN ('reserved', 'uncertain');

CREATE TABLE vault_audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    -- NULL when the presented key was unknown (the attempt is audited too). Never the secret.
    vault_key_id    text        REFERENCES vault_keys (id),
    method          text        NOT NULL CHECK (method <> ''),
    path            text        NOT NULL CHECK (path <> ''),
    amount_cents    bigint      CHECK (amount_cents IS NULL OR amount_cents >= 0),
    idempotency_key text,
    -- NULL when the call was not forwarded (cap exceeded, unauthorised) or Stripe never answered.
    upstream_status integer     CHECK (upstream_status IS NULL OR upstream_status BETWEEN 100 AND 599),
    outcome         text        NOT NULL CHECK (outcome <> ''),
    latency_ms      double precision NOT NULL CHECK (latency_ms >= 0)
);

-- Why: `vault show` lists one key's recent calls (WHERE vault_key_id = $1 ORDER BY at DESC).
CREATE INDEX vault_audit_key_at_idx ON vault_audit (vault_key_id, at);

-- Why: time-range reads across keys and the retention job (DELETE … WHERE at < …).
CREATE INDEX vault_audit_at_idx ON vault_audit (at);
