-- How many times a webhook event and a dead-lettered message were delivered. Beyond what an operator reads
-- from them, the count is what a redelivery writes: a redelivery that finds its event or letter already
-- recorded acknowledges it (a 2xx to Stripe, a FIN to nsqd), and only a transaction that writes waits at
-- its commit for the synchronous standby, so the acknowledgement never rests on a first commit that exists
-- on the primary only (its wait cancelled) and that a failover would lose.
ALTER TABLE stripe_webhook_events ADD COLUMN deliveries integer NOT NULL DEFAULT 1;
ALTER TABLE dead_letters ADD COLUMN deliveries integer NOT NULL DEFAULT 1;
