-- Messages the billing pipeline could not process (invalid payload, payload conflicting with the ledger,
-- Stripe idempotency errors), kept verbatim for an operator (DESIGN.md §4, §5).
CREATE TABLE dead_letters (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    received_at    timestamptz NOT NULL DEFAULT now(),
    topic          text        NOT NULL CHECK (topic <> ''),
    channel        text        NOT NULL CHECK (channel <> ''),
    nsq_message_id text        NOT NULL CHECK (nsq_message_id <> ''),
    attempts       integer     NOT NULL CHECK (attempts >= 0),
    raw_body       bytea       NOT NULL,
    reason         text        NOT NULL CHECK (reason <> ''),
    -- The ledger row involved, when there is one (reason "conflict"); no foreign key: a dead letter must be
    -- storable even when the ledger row is not.
    billing_key    text
);

-- Why: operators and the retention job read dead letters by time ("what failed in the last hour",
-- DELETE … WHERE received_at < now() - interval '90 days').
CREATE INDEX dead_letters_received_at_idx ON dead_letters (received_at);

-- Why: "has this message already been dead-lettered?" when NSQ redelivers it (the FIN after the insert was
-- lost), so the pipeline can avoid a duplicate letter.
CREATE INDEX dead_letters_message_idx ON dead_letters (nsq_message_id);
