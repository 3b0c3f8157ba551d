-- PaymentIntents per event (issue 12): an event with a payment_method is charged through a confirmed
-- PaymentIntent; the row records the intent's id beside the charge id (its latest_charge), so reconcile and
-- support can go from either Stripe object back to the record. NULL for events charged through /v1/charges.
ALTER TABLE billing_records ADD COLUMN payment_intent_id text;

-- Why: one PaymentIntent belongs to at most one record (a second row claiming it is a bug), and reconcile maps
-- an intent back to its record. Partial: most rows of a /v1/charges deployment have none.
CREATE UNIQUE INDEX billing_records_payment_intent_id_key ON billing_records (payment_intent_id)
    WHERE payment_intent_id IS NOT NULL;
