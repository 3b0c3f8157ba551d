-- The billing ledger (DESIGN.md §4, §5): one row per (customer, billing period). The row is committed
-- before Stripe is ever called; its key is the Stripe idempotency key's base.

-- Keeps updated_at honest whatever statement touches a row (the state machine updates rows from several
-- places: charge outcome, lease renewal, recovery).
CREATE FUNCTION cg_touch_updated_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TABLE billing_records (
    -- hex(sha256(namespace ":" customer_id ":" billing_period))[:32]; the Stripe key is key or key-gN.
    key                     text        PRIMARY KEY CHECK (key ~ '^[0-9a-f]{32}$'),
    customer_id             text        NOT NULL CHECK (customer_id <> ''),
    billing_period          text        NOT NULL CHECK (billing_period <> ''),
    amount_cents            bigint      NOT NULL CHECK (amount_cents > 0),
    -- ISO 4217, lower case as Stripe writes it.
    currency                text        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    stripe_customer_id      text        NOT NULL CHECK (stripe_customer_id <> ''),
    status                  text        NOT NULL DEFAULT 'pending'
                                        CHECK (status IN ('pending', 'charged', 'declined', 'failed',
                                                          'cap_blocked', 'conflict')),
    charge_id               text,
    key_generation          integer     NOT NULL DEFAULT 1 CHECK (key_generation >= 1),
    -- Set when Stripe gave an indeterminate answer (5xx, timeout after sending); RECOVER reads it.
    indeterminate_since     timestamptz,
    last_error              text,
    -- Held by the worker charging this row; an expired lease lets another worker RECOVER it.
    lease_until             timestamptz,
    stripe_attempts         integer     NOT NULL DEFAULT 0 CHECK (stripe_attempts >= 0),
    first_stripe_attempt_at timestamptz,
    nsq_message_id          text,
    nsq_attempts            integer     NOT NULL DEFAULT 0 CHECK (nsq_attempts >= 0),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),

    -- "Exactly once" per customer and period, whatever key a producer computed.
    CONSTRAINT billing_records_customer_period_key UNIQUE (customer_id, billing_period),
    -- A charged row always says which charge: reconcile and support rely on it.
    CONSTRAINT billing_records_charged_has_charge_id CHECK (status <> 'charged' OR charge_id IS NOT NULL),
    -- Attempts are counted from the first one.
    CONSTRAINT billing_records_attempt_time CHECK (stripe_attempts = 0 OR first_stripe_attempt_at IS NOT NULL)
);

CREATE TRIGGER billing_records_touch BEFORE UPDATE ON billing_records
    FOR EACH ROW EXECUTE FUNCTION cg_touch_updated_at();

-- Why: reconcile and the recovery sweep look for "pending, lease expired" rows
-- (WHERE status = 'pending' AND lease_until < now()). Partial, so it only holds the few pending rows and
-- costs nothing for the bulk of settled history.
CREATE INDEX billing_records_pending_lease_idx ON billing_records (lease_until) WHERE status = 'pending';

-- Why: one Stripe charge belongs to at most one record (a second row claiming the same charge is a bug),
-- and reconcile maps a Stripe charge back to its record by charge_id.
CREATE UNIQUE INDEX billing_records_charge_id_key ON billing_records (charge_id) WHERE charge_id IS NOT NULL;

-- Lookups by customer (the reconcile list, "list the customer's charges" matching) use the leading column
-- of the UNIQUE (customer_id, billing_period) index; no separate index is needed.
