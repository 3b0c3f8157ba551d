// Cross-check of our Stripe-Signature verifier against the official Stripe Node SDK's signer: headers made
// by stripe.webhooks.generateTestHeaderString must be accepted, and a tampered body, a wrong secret, a stale
// timestamp (at the SDK's own tolerance edges), a rewritten timestamp and a rotation that dropped the signing
// secret refused. fake-stripe's own deliveries are checked against the SDK in conformance.mjs.
// Usage: node webhook-signature.mjs <webhook-verify binary>
import { spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import Stripe from 'stripe';

const [, , verifyBin] = process.argv;
const stripe = new Stripe('sk_test_webhook_crosscheck', { telemetry: false });
const secret = 'whsec_crosscheck_current';
const previous = 'whsec_crosscheck_previous';
const now = () => Math.floor(Date.now() / 1000);

// Runs our verifier; returns its status name ("ok", "mismatch", "stale", ...).
function verify(header, body, secrets, tolerance) {
  const args = tolerance === undefined ? [] : [String(tolerance)];
  const r = spawnSync(verifyBin, args, {
    input: body,
    env: { ...process.env, CG_TEST_SIGNATURE_HEADER: header, CG_TEST_WEBHOOK_SECRETS: secrets.join('\n') },
  });
  if (r.error) throw r.error;
  const status = r.stdout.toString().trim();
  assert.equal(r.status === 0, status === 'ok', `exit ${r.status} disagrees with status '${status}'`);
  return status;
}

const payload = JSON.stringify({
  id: 'evt_crosscheck_1', object: 'event', type: 'payment_intent.succeeded', created: now(), livemode: false,
  data: { object: { id: 'pi_crosscheck_1', object: 'payment_intent', amount: 1999, currency: 'eur' } },
}, null, 2);  // pretty-printed as Stripe sends it: the signature is over these exact bytes
// Non-ASCII bytes: the HMAC must be over the UTF-8 body, not a re-encoding.
const unicode = JSON.stringify({ id: 'evt_crosscheck_2', object: 'event', description: 'café – ☕' });

let passed = 0;
function check(name, fn) {
  fn();
  passed += 1;
  console.log(`ok - ${name}`);
}

check('SDK-signed payload is accepted', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() });
  assert.equal(verify(header, payload, [secret]), 'ok');
});
check('SDK-signed non-ASCII payload is accepted', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload: unicode, secret, timestamp: now() });
  assert.equal(verify(header, unicode, [secret]), 'ok');
});
check('the SDK itself accepts what it signed (the harness is sound)', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret });
  assert.equal(stripe.webhooks.constructEvent(payload, header, secret).id, 'evt_crosscheck_1');
});
check('tampered body is refused', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() });
  assert.equal(verify(header, payload.replace('1999', '1'), [secret]), 'mismatch');
});
check('wrong secret is refused', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret: 'whsec_someone_else', timestamp: now() });
  assert.equal(verify(header, payload, [secret]), 'mismatch');
});
check('stale timestamp is refused (default tolerance 300 s)', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() - 3600 });
  assert.equal(verify(header, payload, [secret]), 'stale');
  // The SDK agrees it is too old.
  assert.throws(() => stripe.webhooks.constructEvent(payload, header, secret), /Timestamp outside the tolerance zone/);
});
check('tolerance flag is honoured', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() - 3600 });
  assert.equal(verify(header, payload, [secret], 7200), 'ok');
});
check('rotation: signed under the previous secret, both configured', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret: previous, timestamp: now() });
  assert.equal(verify(header, payload, [secret, previous]), 'ok');
  assert.equal(verify(header, payload, [secret]), 'mismatch');
});
check('rotation: Stripe sends one v1 per active secret', () => {
  const t = now();
  const a = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: t });
  const b = stripe.webhooks.generateTestHeaderString({ payload, secret: previous, timestamp: t });
  const header = `${a},${b.split(',')[1]}`;
  assert.equal(verify(header, payload, [previous]), 'ok');
  assert.equal(verify(header, payload, [secret]), 'ok');
});
check('tolerance edges: 290 s old accepted, 310 s old stale (default 300 s), as the SDK decides', () => {
  const inside = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() - 290 });
  assert.equal(verify(inside, payload, [secret]), 'ok');
  assert.equal(stripe.webhooks.constructEvent(payload, inside, secret).id, 'evt_crosscheck_1');
  const outside = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() - 310 });
  assert.equal(verify(outside, payload, [secret]), 'stale');
  assert.throws(() => stripe.webhooks.constructEvent(payload, outside, secret), /Timestamp outside the tolerance zone/);
  // A shorter tolerance flag refuses what the default accepts.
  assert.equal(verify(inside, payload, [secret], 60), 'stale');
});
check('a timestamp far in the future is refused (the SDK only bounds the past; we bound both)', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now() + 3600 });
  assert.equal(stripe.webhooks.constructEvent(payload, header, secret).id, 'evt_crosscheck_1');
  assert.equal(verify(header, payload, [secret]), 'future');
});
check('a signature replayed under a rewritten t is refused', () => {
  const old = now() - 3600;
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: old });
  const rewritten = header.replace(`t=${old}`, `t=${now()}`);
  assert.equal(verify(rewritten, payload, [secret]), 'mismatch');
  assert.throws(() => stripe.webhooks.constructEvent(payload, rewritten, secret),
    (e) => e instanceof Stripe.errors.StripeSignatureVerificationError);
});
check('rotation: a forged v1 beside the real one does not spoil it; forged ones alone are refused', () => {
  const t = now();
  const good = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: t });
  const forged = `v1=${'0'.repeat(64)}`;
  assert.equal(verify(`t=${t},${forged},${good.split(',')[1]}`, payload, [secret, previous]), 'ok');
  assert.equal(verify(`t=${t},${forged},${forged.replace(/0/g, 'a')}`, payload, [secret, previous]), 'mismatch');
});
check('v0 scheme alone is not a signature', () => {
  const header = stripe.webhooks.generateTestHeaderString({ payload, secret, timestamp: now(), scheme: 'v0' });
  assert.equal(verify(header, payload, [secret]), 'no_signature');
});
check('unsigned request is refused', () => {
  assert.equal(verify('', payload, [secret]), 'missing_header');
});

console.log(`webhook signature cross-check: ${passed} checks ok`);
