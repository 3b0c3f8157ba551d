-- chargeguard: compatible-down-to 0020
-- The whole life of a billing key after its first answer (docs/operating/runbook.md).
--
-- Retries of declined rows (`chargeguard retry-declined`): a `declined` row goes back to pending under a new
-- key generation once the customer's payment method is fixed. One row here per retry, written in the same
-- statement that reopens the ledger row (so a retry is never without its record, nor a record without its
-- retry): who asked, why and when, the generation it charges under, and how the attempt before it ended — its
-- payment ids, which the recovery search then never reads as the new generation's answer. UNIQUE (key,
-- generation): two retries of one row at once reopen it once.
CREATE TABLE billing_retries (
    id                         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key                        text        NOT NULL,
    generation                 integer     NOT NULL CHECK (generation >= 2),
    requested_at               timestamptz NOT NULL DEFAULT now(),
    requested_by               text        NOT NULL CHECK (requested_by <> ''),
    reason                     text        NOT NULL CHECK (reason <> ''),
    previous_status            text        NOT NULL,
    previous_charge_id         text,
    previous_payment_intent_id text,
    previous_error             text,
    UNIQUE (key, generation)
);

-- Closing dead letters: a letter is open until it is replayed or dismissed. `dead-letters dismiss` records
-- who closed it and why; `dead-letters replay --event FILE` publishes the operator's corrected event instead
-- of the stored body, and keeps it here beside the original.
ALTER TABLE dead_letters
    ADD COLUMN dismissed_at   timestamptz,
    ADD COLUMN dismissed_by   text CHECK (dismissed_by IS NULL OR dismissed_by <> ''),
    ADD COLUMN dismiss_reason text CHECK (dismiss_reason IS NULL OR dismiss_reason <> ''),
    ADD COLUMN corrected_body bytea,
    ADD CONSTRAINT dead_letters_dismiss_who_why
        CHECK ((dismissed_at IS NULL) = (dismissed_by IS NULL) AND (dismissed_at IS NULL) = (dismiss_reason IS NULL));

-- Why: `dead-letters list`, the open-letters gauge and its alert read the letters neither replayed nor
-- dismissed, by reason.
CREATE INDEX dead_letters_unresolved_idx ON dead_letters (reason, id)
    WHERE replayed_at IS NULL AND dismissed_at IS NULL;
