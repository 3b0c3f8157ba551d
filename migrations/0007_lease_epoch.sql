-- The lease token as an integer (issue 14): a worker holds a row's lease while the row's lease_epoch is the
-- value it last read back. Every statement that writes lease_until (insert, take, renew, record an attempt,
-- release, settle) also moves the epoch forward by one, so equality never depends on timestamp precision or
-- formatting, and two leases written within the same microsecond still differ. lease_until stays the lease's
-- expiry. Existing rows start at 0; the next statement that touches their lease moves them on.
ALTER TABLE billing_records ADD COLUMN lease_epoch bigint NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0);
