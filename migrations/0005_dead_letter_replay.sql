-- Replaying dead letters (`chargeguard dead-letters replay`): who re-published a letter and when. A letter is
-- replayed once; replaying it again needs --force and bumps replay_count, so the history stays visible.
ALTER TABLE dead_letters
    ADD COLUMN replayed_at  timestamptz,
    ADD COLUMN replayed_by  text CHECK (replayed_by IS NULL OR replayed_by <> ''),
    ADD COLUMN replay_count integer NOT NULL DEFAULT 0 CHECK (replay_count >= 0),
    ADD CONSTRAINT dead_letters_replay_who_when
        CHECK ((replayed_at IS NULL) = (replayed_by IS NULL) AND (replayed_at IS NULL) = (replay_count = 0));

-- Why: `dead-letters list` and `replay --reason R` read the letters not replayed yet, by reason, and the
-- dead-letter alert counts them; partial, so replayed history costs nothing.
CREATE INDEX dead_letters_open_reason_idx ON dead_letters (reason, id) WHERE replayed_at IS NULL;
