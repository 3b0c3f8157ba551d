// Real-client conformance: the official Stripe Node SDK against fake-stripe. Keeps the double honest:
// if fake-stripe drifts from what Stripe's own client expects (wire format, headers, error shapes),
// this fails. Usage: node conformance.mjs <fake-stripe binary> <cert dir>  (NODE_EXTRA_CA_CERTS = CA)
import { spawn } from 'node:child_process';
import http from 'node:http';
import https from 'node:https';
import assert from 'node:assert/strict';
import Stripe from 'stripe';

const [, , fakeBin, certDir] = process.argv;
const child = spawn(fakeBin, ['--listen', '127.0.0.1:0', '--cert', `${certDir}/server.pem`,
  '--key', `${certDir}/server.key`, '--decline', 'cus_declined'], { stdio: ['ignore', 'pipe', 'inherit'] });

function portOf(proc) {
  return new Promise((resolve, reject) => {
    let buf = '';
    proc.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/listening on [^\s]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    proc.on('exit', (code) => reject(new Error(`fake-stripe exited with ${code} before listening`)));
  });
}

function admin(port, path) {
  return new Promise((resolve, reject) => {
    https.get({ host: '127.0.0.1', port, path }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(JSON.parse(body)));
    }).on('error', reject);
  });
}

function adminPost(port, path, form) {
  return new Promise((resolve, reject) => {
    const body = new URLSearchParams(form).toString();
    const req = https.request({ host: '127.0.0.1', port, path, method: 'POST',
      headers: { 'Content-Type': 'application/x-www-form-urlencoded', 'Content-Length': Buffer.byteLength(body) } },
    (res) => {
      let out = '';
      res.on('data', (d) => (out += d));
      res.on('end', () => resolve(JSON.parse(out)));
    });
    req.on('error', reject);
    req.end(body);
  });
}

let failures = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

try {
  const port = await portOf(child);
  // chargeguard's pinned API version (--stripe-version): objects are read and requests checked in it.
  const stripe = new Stripe('sk_test_conformance', {
    host: '127.0.0.1', port, protocol: 'https', maxNetworkRetries: 0, telemetry: false, apiVersion: '2024-06-20',
  });
  const params = {
    amount: 4200, currency: 'usd', customer: 'cus_sdk', description: 'conformance',
    metadata: { billing_key: 'bk-sdk-1', billing_period: '2024-05' },
  };

  let first;
  await check('create charge with an idempotency key', async () => {
    first = await stripe.charges.create(params, { idempotencyKey: 'sdk-key-1' });
    assert.match(first.id, /^ch_/);
    assert.equal(first.object, 'charge');
    assert.equal(first.amount, 4200);
    assert.equal(first.status, 'succeeded');
    assert.equal(first.metadata.billing_key, 'bk-sdk-1');
    assert.match(first.lastResponse.requestId, /^req_/);
  });

  await check('replay returns the same charge, marked replayed', async () => {
    const again = await stripe.charges.create(params, { idempotencyKey: 'sdk-key-1' });
    assert.equal(again.id, first.id);
    assert.equal(again.lastResponse.headers['idempotent-replayed'], 'true');
    const posts = await admin(port, '/_admin/posts?key=sdk-key-1');
    assert.equal(posts.count, 2);
    const all = await admin(port, '/_admin/charges');
    assert.equal(all.count, 1);
  });

  await check('decline maps to StripeCardError', async () => {
    await assert.rejects(
      stripe.charges.create({ ...params, customer: 'cus_declined' }, { idempotencyKey: 'sdk-key-2' }),
      (e) => {
        assert.ok(e instanceof Stripe.errors.StripeCardError, `got ${e.constructor.name}`);
        assert.equal(e.type, 'StripeCardError');
        assert.equal(e.code, 'card_declined');
        assert.equal(e.decline_code, 'generic_decline');
        assert.equal(e.statusCode, 402);
        assert.match(e.raw.charge, /^ch_/);
        return true;
      });
  });

  await check('same key with other parameters maps to StripeIdempotencyError', async () => {
    await assert.rejects(
      stripe.charges.create({ ...params, amount: 4300 }, { idempotencyKey: 'sdk-key-1' }),
      (e) => {
        assert.ok(e instanceof Stripe.errors.StripeIdempotencyError, `got ${e.constructor.name}`);
        assert.equal(e.statusCode, 400);
        return true;
      });
  });

  await check('bad parameters map to StripeInvalidRequestError with param', async () => {
    await assert.rejects(
      stripe.charges.create({ ...params, currency: 'US' }, { idempotencyKey: 'sdk-key-3' }),
      (e) => e instanceof Stripe.errors.StripeInvalidRequestError && e.param === 'currency');
  });

  await check('list, paginate and retrieve', async () => {
    await stripe.charges.create({ ...params, metadata: { billing_key: 'bk-sdk-2' } }, { idempotencyKey: 'sdk-key-4' });
    const page = await stripe.charges.list({ customer: 'cus_sdk', limit: 1 });
    assert.equal(page.object, 'list');
    assert.equal(page.data.length, 1);
    assert.equal(page.has_more, true);
    assert.equal(page.data[0].metadata.billing_key, 'bk-sdk-2');  // newest first
    const ids = [];
    for await (const c of stripe.charges.list({ customer: 'cus_sdk', limit: 1 })) ids.push(c.id);
    assert.deepEqual(ids.length, 2);
    assert.equal(ids[1], first.id);
    const got = await stripe.charges.retrieve(first.id);
    assert.equal(got.id, first.id);
    await assert.rejects(stripe.charges.retrieve('ch_missing'),
      (e) => e instanceof Stripe.errors.StripeInvalidRequestError && e.statusCode === 404);
  });

  await check('a confirmation that may redirect needs a return_url on the pinned version', async () => {
    const request = {
      amount: 1400, currency: 'usd', customer: 'cus_sdk', payment_method: 'pm_card_visa',
      confirm: true, off_session: true, metadata: { billing_key: 'bk-sdk-pi-0' },
    };
    await assert.rejects(stripe.paymentIntents.create(request, { idempotencyKey: 'sdk-key-pi-0' }),
      (e) => {
        assert.ok(e instanceof Stripe.errors.StripeInvalidRequestError, `got ${e.constructor.name}`);
        assert.equal(e.statusCode, 400);
        assert.match(e.message, /return_url/);
        return true;
      });
    // An account on a version before automatic payment methods became the default takes the same request.
    const older = await stripe.paymentIntents.create(request,
      { idempotencyKey: 'sdk-key-pi-0-old', apiVersion: '2023-02-16' });
    assert.equal(older.status, 'succeeded');
  });

  await check('off-session PaymentIntent confirms into a charge', async () => {
    const pi = await stripe.paymentIntents.create({
      amount: 1500, currency: 'usd', customer: 'cus_sdk', payment_method: 'pm_card_visa',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
      confirm: true, off_session: true, metadata: { billing_key: 'bk-sdk-pi' },
    }, { idempotencyKey: 'sdk-key-5' });
    assert.match(pi.id, /^pi_/);
    assert.equal(pi.status, 'succeeded');
    assert.match(pi.latest_charge, /^ch_/);
    const again = await stripe.paymentIntents.retrieve(pi.id);
    assert.equal(again.latest_charge, pi.latest_charge);
  });

  await check('off-session PaymentIntent needing authentication maps to StripeCardError', async () => {
    await adminPost(port, '/_admin/declines', { customer: 'cus_sca', code: 'authentication_required' });
    await assert.rejects(
      stripe.paymentIntents.create({
        amount: 1600, currency: 'usd', customer: 'cus_sca', payment_method: 'pm_card_authenticationRequired',
        automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
        confirm: true, off_session: true, metadata: { billing_key: 'bk-sdk-sca' },
      }, { idempotencyKey: 'sdk-key-6' }),
      (e) => {
        assert.ok(e instanceof Stripe.errors.StripeCardError, `got ${e.constructor.name}`);
        assert.equal(e.code, 'authentication_required');
        assert.equal(e.statusCode, 402);
        assert.equal(e.payment_intent.object, 'payment_intent');
        assert.equal(e.payment_intent.status, 'requires_payment_method');
        assert.equal(e.payment_intent.last_payment_error.code, 'authentication_required');
        assert.match(e.payment_intent.latest_charge, /^ch_/);
        return true;
      });
  });

  await check('on-session PaymentIntent needing authentication stops at requires_action', async () => {
    const pi = await stripe.paymentIntents.create({
      amount: 1700, currency: 'usd', customer: 'cus_sca', payment_method: 'pm_card_authenticationRequired',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
      confirm: true, metadata: { billing_key: 'bk-sdk-sca-2' },
    }, { idempotencyKey: 'sdk-key-7' });
    assert.equal(pi.status, 'requires_action');
    assert.equal(pi.next_action.type, 'use_stripe_sdk');
    assert.equal(pi.latest_charge, null);
  });

  await check('list and paginate PaymentIntents by customer', async () => {
    const page = await stripe.paymentIntents.list({ customer: 'cus_sca', limit: 1 });
    assert.equal(page.object, 'list');
    assert.equal(page.has_more, true);
    assert.equal(page.data[0].metadata.billing_key, 'bk-sdk-sca-2');  // newest first
    const keys = [];
    for await (const pi of stripe.paymentIntents.list({ customer: 'cus_sca', limit: 1 })) keys.push(pi.metadata.billing_key);
    assert.deepEqual(keys, ['bk-sdk-sca-2', 'bk-sdk-sca']);
  });

  await check('rate limiter answers 429 the way Stripe does (StripeRateLimitError, should-retry)', async () => {
    await adminPost(port, '/_admin/limits', { endpoint_rps: '1', burst_s: '1' });
    try {
      await stripe.charges.list({ customer: 'cus_sdk', limit: 1 });
      await assert.rejects(stripe.charges.list({ customer: 'cus_sdk', limit: 1 }), (e) => {
        assert.ok(e instanceof Stripe.errors.StripeRateLimitError, `got ${e.constructor.name}`);
        assert.equal(e.statusCode, 429);
        assert.equal(e.code, 'rate_limit');
        assert.equal(e.type, 'StripeRateLimitError');
        assert.equal(e.headers['stripe-should-retry'], 'true');
        return true;
      });
      // Another endpoint has its own bucket.
      await stripe.paymentIntents.list({ customer: 'cus_sdk', limit: 1 });
    } finally {
      await adminPost(port, '/_admin/limits', { endpoint_rps: '0' });
    }
  });

  // A webhook endpoint in this process: records each delivery's raw body and Stripe-Signature.
  const deliveries = [];
  const hookServer = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (d) => chunks.push(d));
    req.on('end', () => {
      deliveries.push({ headers: req.headers, raw: Buffer.concat(chunks) });
      res.writeHead(200).end();
    });
  });
  await new Promise((resolve) => hookServer.listen(0, '127.0.0.1', resolve));
  const hookSecret = 'whsec_conformance_current';
  const hookPrevious = 'whsec_conformance_previous';
  await adminPost(port, '/_admin/webhooks', {
    url: `http://127.0.0.1:${hookServer.address().port}/hooks`, secrets: `${hookSecret},${hookPrevious}`,
  });
  await adminPost(port, '/_admin/async', { settle_after_ms: '50' });

  let bankIntent;
  await check('a bank debit (pm_usBankAccount_success) answers processing, then succeeds', async () => {
    bankIntent = await stripe.paymentIntents.create({
      amount: 2500, currency: 'usd', customer: 'cus_sdk', payment_method: 'pm_usBankAccount_success',
      payment_method_types: ['us_bank_account'], confirm: true, off_session: true,
      metadata: { billing_key: 'bk-sdk-ach' },
    }, { idempotencyKey: 'sdk-key-ach' });
    assert.equal(bankIntent.status, 'processing');
    const charge = await stripe.charges.retrieve(bankIntent.latest_charge);
    assert.equal(charge.status, 'pending');
    const waited = await admin(port, '/_admin/webhooks/wait?idle=1&timeout_ms=10000');
    assert.equal(waited.outstanding, 0);
    const later = await stripe.paymentIntents.retrieve(bankIntent.id);
    assert.equal(later.status, 'succeeded');
    assert.equal((await stripe.charges.retrieve(later.latest_charge)).paid, true);
  });

  await check("fake-stripe's deliveries pass stripe.webhooks.constructEvent (either secret of a rotation)", async () => {
    const types = [];
    assert.ok(deliveries.length >= 5, `only ${deliveries.length} deliveries`);
    for (const d of deliveries) {
      assert.equal(d.headers['content-type'], 'application/json; charset=utf-8');
      const ev = stripe.webhooks.constructEvent(d.raw, d.headers['stripe-signature'], hookSecret);
      assert.equal(stripe.webhooks.constructEvent(d.raw, d.headers['stripe-signature'], hookPrevious).id, ev.id);
      assert.throws(() => stripe.webhooks.constructEvent(d.raw, d.headers['stripe-signature'], 'whsec_other'),
        (e) => e instanceof Stripe.errors.StripeSignatureVerificationError);
      types.push(ev.type);
      // GET /v1/events/{id} (the SDK's events.retrieve) serves the event that was delivered.
      assert.equal((await stripe.events.retrieve(ev.id)).type, ev.type);
    }
    assert.ok(types.includes('payment_intent.processing'), types.join(' '));
    assert.equal(types[types.length - 1], 'payment_intent.succeeded');
    const tampered = Buffer.from(deliveries[0].raw.toString().replace('"livemode": false', '"livemode": true'));
    assert.throws(() => stripe.webhooks.constructEvent(tampered, deliveries[0].headers['stripe-signature'], hookSecret),
      (e) => e instanceof Stripe.errors.StripeSignatureVerificationError);
  });

  await check('a failing bank debit ends payment_failed with the bank code', async () => {
    const pi = await stripe.paymentIntents.create({
      amount: 2600, currency: 'usd', customer: 'cus_sdk', payment_method: 'pm_usBankAccount_insufficientFunds',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
      confirm: true, off_session: true, metadata: { billing_key: 'bk-sdk-ach-nsf' },
    }, { idempotencyKey: 'sdk-key-ach-nsf' });
    assert.equal(pi.status, 'processing');
    await admin(port, '/_admin/webhooks/wait?idle=1&timeout_ms=10000');
    const later = await stripe.paymentIntents.retrieve(pi.id);
    assert.equal(later.status, 'requires_payment_method');
    assert.equal(later.last_payment_error.code, 'insufficient_funds');
    const charge = await stripe.charges.retrieve(later.latest_charge);
    assert.equal(charge.status, 'failed');
    assert.equal(charge.failure_code, 'insufficient_funds');
  });

  await check('refunds: partial, replayed, too large, the rest, then already refunded', async () => {
    const charge = bankIntent.latest_charge;
    const r1 = await stripe.refunds.create({ charge, amount: 1000 }, { idempotencyKey: 'sdk-refund-1' });
    assert.equal(r1.object, 'refund');
    assert.equal(r1.amount, 1000);
    const again = await stripe.refunds.create({ charge, amount: 1000 }, { idempotencyKey: 'sdk-refund-1' });
    assert.equal(again.id, r1.id);
    assert.equal(again.lastResponse.headers['idempotent-replayed'], 'true');
    await assert.rejects(stripe.refunds.create({ charge, amount: 9999 }, { idempotencyKey: 'sdk-refund-2' }), (e) => {
      assert.ok(e instanceof Stripe.errors.StripeInvalidRequestError, `got ${e.constructor.name}`);
      assert.equal(e.code, 'amount_too_large');
      assert.equal(e.param, 'amount');
      assert.equal(e.message, 'Refund amount ($99.99) is greater than unrefunded amount on charge ($15.00)');
      return true;
    });
    const rest = await stripe.refunds.create({ payment_intent: bankIntent.id }, { idempotencyKey: 'sdk-refund-3' });
    assert.equal(rest.amount, 1500);
    const after = await stripe.charges.retrieve(charge);
    assert.equal(after.amount_refunded, 2500);
    assert.equal(after.refunded, true);
    await assert.rejects(stripe.refunds.create({ charge }, { idempotencyKey: 'sdk-refund-4' }),
      (e) => e instanceof Stripe.errors.StripeInvalidRequestError && e.code === 'charge_already_refunded');
    assert.equal((await stripe.refunds.retrieve(r1.id)).amount, 1000);
  });

  await check('a dispute opened on a charge blocks its refund', async () => {
    const pi = await stripe.paymentIntents.create({
      amount: 2700, currency: 'usd', customer: 'cus_sdk', payment_method: 'pm_card_visa',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
      confirm: true, off_session: true, metadata: { billing_key: 'bk-sdk-dispute' },
    }, { idempotencyKey: 'sdk-key-dispute' });
    const dp = await adminPost(port, '/_admin/disputes', { charge: pi.latest_charge });
    assert.match(dp.id, /^dp_/);
    assert.equal((await stripe.disputes.retrieve(dp.id)).status, 'needs_response');
    assert.equal((await stripe.charges.retrieve(pi.latest_charge)).disputed, true);
    await assert.rejects(stripe.refunds.create({ charge: pi.latest_charge }, { idempotencyKey: 'sdk-refund-5' }),
      (e) => e instanceof Stripe.errors.StripeInvalidRequestError && e.code === 'charge_disputed');
    const closed = await adminPost(port, '/_admin/disputes/close', { dispute: dp.id, status: 'won' });
    assert.equal(closed.status, 'won');
    await admin(port, '/_admin/webhooks/wait?idle=1&timeout_ms=10000');
    const types = deliveries.map((d) => JSON.parse(d.raw.toString()).type);
    assert.ok(types.includes('charge.dispute.created') && types.includes('charge.dispute.closed'), types.join(' '));
  });
  hookServer.close();

  await check('bad API key maps to StripeAuthenticationError', async () => {
    const wrong = new Stripe('pk_test_not_a_secret', { host: '127.0.0.1', port, protocol: 'https', telemetry: false });
    await assert.rejects(wrong.charges.list({ limit: 1 }), (e) => e instanceof Stripe.errors.StripeAuthenticationError);
  });
} catch (e) {
  failures++;
  console.log(`FAIL setup: ${e.stack || e}`);
} finally {
  child.kill('SIGTERM');
}
console.log(failures ? `${failures} conformance check(s) failed` : 'all conformance checks passed');
process.exit(failures ? 1 : 0);
