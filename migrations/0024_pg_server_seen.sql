-- chargeguard: compatible-down-to 0023
-- The PostgreSQL server a sidecar's pool last saw as its primary (pg::pool, pool_options::failover_record):
-- the cluster's system identifier and the WAL timeline it wrote on, one row per record name (consume: its
-- key namespace). A pool compares each new primary connection with it and records the one it reached; a
-- change is a failover even for a sidecar started only after it, which never saw the previous server
-- (docs/operating/ha-postgres.md). Replicated with the ledger, so a promoted standby holds what its primary
-- recorded; a lost write only makes the next pool see the same failover again (one more sweep).
--
-- A new table only: binaries of schema 0023 keep working.
CREATE TABLE pg_server_seen (
    name              text PRIMARY KEY,
    system_identifier text NOT NULL,
    timeline          bigint NOT NULL,
    seen_at           timestamptz NOT NULL DEFAULT now()
);
