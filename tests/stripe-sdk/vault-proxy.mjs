// The official Stripe Node SDK (pinned in package.json) as a vault-key holder: pointed at `chargeguard proxy`,
// which forwards to fake-stripe with the real key. Creates charges and PaymentIntents, gets a replay, and
// receives the cap refusal as a StripeError with code 'spend_cap_exceeded'.
// Usage: node vault-proxy.mjs <chargeguard> <fake-stripe> <cert dir>  (PG* = a fresh database; NODE_EXTRA_CA_CERTS)
import { spawn, execFileSync } from 'node:child_process';
import https from 'node:https';
import assert from 'node:assert/strict';
import Stripe from 'stripe';

const [, , cgBin, fakeBin, certDir] = process.argv;
const realKey = 'sk_test_vault_sdk_REAL_KEY';
const children = [];

function waitFor(proc, stream, re, what) {
  return new Promise((resolve, reject) => {
    let buf = '';
    proc[stream].on('data', (d) => {
      buf += d;
      const m = buf.match(re);
      if (m) resolve({ match: m, output: () => buf });
    });
    proc.on('exit', (code) => reject(new Error(`${what} exited with ${code} before it was ready:\n${buf}`)));
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

let proxyLog = () => '';
try {
  const fake = spawn(fakeBin, ['--listen', '127.0.0.1:0', '--cert', `${certDir}/server.pem`,
    '--key', `${certDir}/server.key`], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(fake);
  const fakePort = Number((await waitFor(fake, 'stdout', /listening on [^\s]+:(\d+)/, 'fake-stripe')).match[1]);

  execFileSync(cgBin, ['migrate'], { stdio: ['ignore', 'ignore', 'inherit'] });
  const secret = execFileSync(cgBin, ['vault', 'issue', '--name', 'sdk', '--period', '2026-11', '--currency', 'usd',
    '--expected-total-cents', '6000', '--headroom', '1.25'], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim();
  assert.match(secret, /^cgvk_[0-9a-f]{16}_[0-9a-f]{64}$/);

  const proxy = spawn(cgBin, ['proxy', '--listen', '127.0.0.1:0', '--upstream', `https://127.0.0.1:${fakePort}`,
    '--stripe-ca-file', `${certDir}/ca.pem`, '--health-listen', '127.0.0.1:0', '--resolve-interval', '1h'],
  { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, STRIPE_API_KEY: realKey } });
  children.push(proxy);
  const ready = await waitFor(proxy, 'stderr', /"msg":"vault proxy listening"[^\n]*"port":(\d+)/, 'chargeguard proxy');
  proxyLog = ready.output;
  const port = Number(ready.match[1]);

  // Cap: floor(6000 × 1.25) = 7500.
  const stripe = new Stripe(secret, { host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 0, telemetry: false });
  const params = { amount: 3000, currency: 'usd', customer: 'cus_sdk_vault', metadata: { billing_key: 'bk-vault-1' } };

  let first;
  await check('charges.create through the proxy', async () => {
    first = await stripe.charges.create(params, { idempotencyKey: 'vault-sdk-1' });
    assert.match(first.id, /^ch_/);
    assert.equal(first.amount, 3000);
    assert.equal(first.metadata.billing_key, 'bk-vault-1');
    assert.match(first.lastResponse.requestId, /^req_/);
  });

  await check('a retry with the same key is replayed and not counted twice', async () => {
    const again = await stripe.charges.create(params, { idempotencyKey: 'vault-sdk-1' });
    assert.equal(again.id, first.id);
    assert.equal(again.lastResponse.headers['idempotent-replayed'], 'true');
    assert.equal((await admin(fakePort, '/_admin/charges')).count, 1);
  });

  await check('paymentIntents.create (off-session, confirmed) through the proxy', async () => {
    const pi = await stripe.paymentIntents.create({
      amount: 4000, currency: 'usd', customer: 'cus_sdk_vault', payment_method: 'pm_card_visa',
      automatic_payment_methods: { enabled: true, allow_redirects: 'never' }, confirm: true, off_session: true,
    }, { idempotencyKey: 'vault-sdk-pi' });
    assert.match(pi.id, /^pi_/);
    assert.equal(pi.status, 'succeeded');
    const got = await stripe.paymentIntents.retrieve(pi.id);
    assert.equal(got.id, pi.id);
  });

  await check('the cap refusal is a StripeError with code spend_cap_exceeded, and Stripe never saw it', async () => {
    const before = (await admin(fakePort, '/_admin/charges')).count;
    await assert.rejects(
      stripe.charges.create({ ...params, amount: 600 }, { idempotencyKey: 'vault-sdk-over' }),
      (e) => {
        assert.ok(e instanceof Stripe.errors.StripeError, `got ${e.constructor.name}`);
        assert.equal(e.code, 'spend_cap_exceeded');
        assert.equal(e.statusCode, 402);
        assert.equal(e.rawType, 'invalid_request_error');
        assert.match(e.message, /cap/);
        return true;
      });
    assert.equal((await admin(fakePort, '/_admin/charges')).count, before);
    assert.equal((await admin(fakePort, '/_admin/posts?key=vault-sdk-over')).count, 0);
  });

  await check('reads pass through; other endpoints are a StripePermissionError; a wrong key a StripeAuthenticationError', async () => {
    const got = await stripe.charges.retrieve(first.id);
    assert.equal(got.id, first.id);
    await assert.rejects(stripe.refunds.create({ charge: first.id }),
      (e) => e instanceof Stripe.errors.StripePermissionError && e.statusCode === 403);
    const wrong = new Stripe(secret.slice(0, -1) + (secret.endsWith('0') ? '1' : '0'),
      { host: '127.0.0.1', port, protocol: 'http', maxNetworkRetries: 0, telemetry: false });
    await assert.rejects(wrong.charges.list({ limit: 1 }), (e) => e instanceof Stripe.errors.StripeAuthenticationError);
  });

  await check('vault list shows 7000 settled of a 7500 cap; no secret in the proxy log', async () => {
    const keys = JSON.parse(execFileSync(cgBin, ['vault', 'list', '--json']).toString());
    assert.equal(keys.length, 1);
    assert.equal(keys[0].cap_cents, 7500);
    assert.equal(keys[0].settled_cents, 7000);
    assert.equal(keys[0].reserved_cents + keys[0].uncertain_cents, 0);
    assert.ok(!proxyLog().includes(realKey));
    assert.ok(!proxyLog().includes(secret.slice(22)));
  });
} catch (e) {
  failures++;
  console.log(`FAIL setup: ${e.stack || e}`);
} finally {
  for (const c of children) c.kill('SIGTERM');
}
console.log(failures ? `${failures} vault SDK check(s) failed` : 'all vault SDK checks passed');
process.exit(failures ? 1 : 0);
