-- chargeguard: compatible-down-to 0018
-- Shared pacing of Stripe calls (billing/pace_peers.hpp, stripe/rate_control.hpp): every running `consume`
-- heartbeats one row per Stripe account it paces (the platform's is ''), saying what its pacer is at, and
-- reads the rows of its peers on the same accounts, so the sidecars sharing an account run one rate law
-- for it instead of one each. Nothing else reads the table and charging never waits on it: a sidecar that
-- cannot reach it paces on its own. Rows past expires_at are ignored and deleted by any peer.
--
-- A new table only: binaries of schema 0018 keep working (they never read it).
CREATE TABLE stripe_pace_peers (
    account text NOT NULL,                    -- the Stripe-Account paced, '' for the platform's own
    peer text NOT NULL,                       -- one running consume (random per process)
    pressed boolean NOT NULL,                 -- a request of its had to wait since its last heartbeat
    sent_rps double precision NOT NULL,       -- what it sent lately, requests/s
    account_limit double precision NOT NULL,  -- the account's limit its law is at (may be 'Infinity')
    episodes bigint NOT NULL,                 -- 429 episodes started by its own 429s
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (account, peer)
);
