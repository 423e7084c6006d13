import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { receiptPath } from '../../src/commerce/receipts.ts';
import { loadConfig } from '../../src/config.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { MAX_WALLET_BALANCE_UNITS, parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('checkout sessions on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect, { env: { PUBLIC_BASE_URL: 'https://pay.example.com/tollgate' } });
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const create = (payload: Record<string, unknown>) =>
    t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload: { origin_url: 'https://shop.example.com/cart?x=1', ...payload } });
  const secretOf = (token: string) => JSON.parse(Buffer.from(token, 'base64').toString()) as { secret: string; base: string };
  const pay = (token: string, form: Record<string, string>) =>
    t.app.inject({ method: 'POST', url: '/checkout/pay', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: new URLSearchParams({ token, ...form }).toString() });

  it('creates an onboarding session in the older vocabulary: token {secret, base} with the configured public URL, hashed at rest', async () => {
    const res = await create({ checkout_mode: 'onboarding', reference_id: 'user-1' });
    expect(res.statusCode, res.body).toBe(201);
    const session = res.json();
    expect(session).toMatchObject({ checkout_mode: 'onboarding', origin_url: 'https://shop.example.com/cart?x=1', reference_id: 'user-1', connection_id: null, completed_at: null, receipt_url: null });
    expect(session.checkout_session_id).toMatch(/^cs_/);
    const token = secretOf(session.checkout_session_token);
    expect(token).toEqual({ secret: expect.stringMatching(/^css_/), base: 'https://pay.example.com/tollgate/' });
    expect(session.checkout_url).toBe(`https://pay.example.com/tollgate/checkout?token=${encodeURIComponent(session.checkout_session_token)}`);
    const row = await t.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', session.checkout_session_id).executeTakeFirstOrThrow();
    expect(JSON.stringify(row)).not.toContain(token.secret);
    expect(new Date(row.expires_at).getTime() - new Date(row.created_at).getTime()).toBe(60 * 60_000);

    const listed = (await t.app.inject({ method: 'GET', url: '/v1/checkout_sessions', headers: t.auth() })).json();
    expect(listed.data[0]).toMatchObject({ checkout_session_id: session.checkout_session_id, checkout_session_token: null });
  });

  it('checks what each mode needs, in both vocabularies', async () => {
    const { customerId } = await createCustomer(t);
    const plan = await createPlan(t, { name: 'P', period_amount: '1', billing_interval: 'month', credit_bundles: [{ name: 'B', cost: '2', credit_amount: '3' }] });
    const code = async (payload: Record<string, unknown>) => {
      const res = await create(payload);
      return res.statusCode === 201 ? 201 : [res.statusCode, res.json().error.code, res.json().error.issues?.[0]?.path?.join('.')];
    };
    expect(await code({ checkout_mode: 'topup' })).toEqual([400, 'validation_error', 'connection_id']);
    expect(await code({ checkout_mode: 'topup', connection_id: customerId })).toBe(201);
    expect(await code({ checkout_mode: 'topup', customer_id: 'con_nope' })).toEqual([400, 'validation_error', 'customer_id']);
    expect(await code({ checkout_mode: 'subscription' })).toEqual([400, 'validation_error', 'plan_id']);
    expect(await code({ checkout_mode: 'subscription', subscription_config_id: plan.plan_id })).toBe(201);
    expect(await code({ checkout_mode: 'credit_bundle', customer_id: customerId })).toEqual([400, 'validation_error', 'credit_bundle_id']);
    const bundleId = plan.credit_bundles[0].credit_bundle_id;
    expect(await code({ checkout_mode: 'credit_bundle', customer_id: customerId, credit_bundle_id: bundleId })).toEqual([400, 'validation_error', 'credit_bundle_id']);
    expect(await code({ checkout_mode: 'topup', customer_id: customerId, origin_url: 'javascript:alert(1)' })).toEqual([400, 'validation_error', 'origin_url']);
    expect(await code({ checkout_mode: 'gift' })).toEqual([400, 'validation_error', 'checkout_mode']);
  });

  it('a credit bundle checkout paid on the page credits the bundle bucket once; the token then opens nothing', async () => {
    const free = await createPlan(t, { name: 'Free', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'Ten', cost: '8', credit_amount: '10' }] });
    const { customerId, walletId } = await createCustomer(t);
    await subscribe(t, customerId, free.plan_id);
    expect((await create({ checkout_mode: 'subscription', plan_id: free.plan_id, customer_id: customerId })).json().error.code).toBe('subscription_exists');
    const session = (await create({ checkout_mode: 'credit_bundle', customer_id: customerId, credit_bundle_id: free.credit_bundles[0].credit_bundle_id })).json();

    const opened = await t.app.inject({ method: 'GET', url: `/checkout?token=${encodeURIComponent(session.checkout_session_token)}` });
    expect(opened.statusCode).toBe(200);
    expect(opened.body).toContain('Buy Ten');
    expect(opened.headers['content-security-policy']).toContain('frame-ancestors https://shop.example.com;');
    // The shared page shell (src/web/layout.ts): its stylesheet and skip link; framable by the session's origin only.
    expect(opened.headers['x-frame-options']).toBeUndefined();
    expect(opened.body).toContain('href="/assets/tollgate.css"');
    expect(opened.body).toContain('class="skip"');
    const unknown = await t.app.inject({ method: 'GET', url: '/checkout?token=nope' });
    expect(unknown.statusCode).toBe(404);
    expect(unknown.headers['content-security-policy']).toContain("frame-ancestors 'none'");
    expect(unknown.headers['x-frame-options']).toBe('DENY');

    const paid = await pay(session.checkout_session_token, { card_number: '4242424242424242' });
    expect(paid.statusCode, paid.body).toBe(200);
    expect(paid.body).toContain('Payment received');
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ bundle: parseMoney('10'), prepaid: 0n });
    const again = await pay(session.checkout_session_token, { card_number: '4242424242424242' });
    expect(again.statusCode).toBe(410);
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('10'));
    const completed = (await eventsOfType(t.storage, 'checkout.completed')).filter((e) => e.data.checkout_session_id === session.checkout_session_id);
    expect(completed).toHaveLength(1);
  });

  it('a top-up or bundle that would take the wallet above its maximum balance is refused before the customer pays', async () => {
    const plan = await createPlan(t, { name: 'Near max', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'Nine', cost: '8', credit_amount: '9' }] });
    const { customerId, walletId } = await createCustomer(t);
    await subscribe(t, customerId, plan.plan_id);
    await creditWallet(t.storage, walletId, MAX_WALLET_BALANCE_UNITS - parseMoney('8'), new Date().toISOString());
    const charges = t.payments.charges.length;
    const bundle = (await create({ checkout_mode: 'credit_bundle', customer_id: customerId, credit_bundle_id: plan.credit_bundles[0].credit_bundle_id })).json();
    const refusedBundle = await pay(bundle.checkout_session_token, { card_number: '4242424242424242' });
    expect(refusedBundle.statusCode).toBe(402);
    expect(refusedBundle.body).toContain('above the most a wallet may hold');
    const topUp = (await create({ checkout_mode: 'topup', customer_id: customerId })).json();
    expect((await pay(topUp.checkout_session_token, { amount: '8.0000000001', card_number: '4242424242424242' })).statusCode).toBe(402);
    expect(t.payments.charges.length).toBe(charges);
    // Up to the maximum exactly is fine.
    const paid = await pay(topUp.checkout_session_token, { amount: '8', card_number: '4242424242424242' });
    expect(paid.statusCode, paid.body).toBe(200);
    const buckets = await walletBuckets(t.storage, walletId);
    expect(buckets.cycle + buckets.bundle + buckets.prepaid).toBe(MAX_WALLET_BALANCE_UNITS);
  });

  it('an onboarding checkout creates the customer with its wallet funded', async () => {
    const session = (await create({ checkout_mode: 'onboarding', reference_id: 'onb-1' })).json();
    const bad = await pay(session.checkout_session_token, { amount: '-3', card_number: '4242424242424242' });
    expect(bad.statusCode).toBe(400);
    expect(bad.body).toContain('role="alert"');
    const paid = await pay(session.checkout_session_token, { amount: '12.5', name: 'Ada', card_number: '4242424242424242' });
    expect(paid.statusCode, paid.body).toBe(200);
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    expect(shown.connection_id).toMatch(/^con_/);
    const customer = (await t.app.inject({ method: 'GET', url: `/v1/customers/${shown.connection_id}`, headers: t.auth() })).json();
    expect(customer).toMatchObject({ reference_id: 'onb-1', wallet: { balance: '12.5000000000' }, contact: { first_name: 'Ada' } });
  });

  it('the page shows the configured currency (USD by default) on every amount, and keeps the typed amount, name and email after a decline', async () => {
    const plan = await createPlan(t, { name: 'Team', period_amount: '9.99', included_credit: '12', billing_interval: 'month' });
    const sub = (await create({ checkout_mode: 'subscription', plan_id: plan.plan_id })).json();
    const opened = await t.app.inject({ method: 'GET', url: `/checkout?token=${encodeURIComponent(sub.checkout_session_token)}` });
    expect(opened.body).toContain('9.99 USD per month');
    expect(opened.body).toContain('12.00 USD');
    expect(opened.body).toContain('Pay 9.99 USD');

    const topup = (await create({ checkout_mode: 'onboarding' })).json();
    const declined = await pay(topup.checkout_session_token, { amount: '23.45', name: 'Ada L', email: 'ada@example.com', card_number: TEST_CARDS.declined });
    expect(declined.statusCode).toBe(402);
    expect(declined.body).toContain('Amount (USD)');
    expect(declined.body).toMatch(/id="amount" name="amount"[^>]* value="23.45"/);
    expect(declined.body).toMatch(/id="name" name="name"[^>]* value="Ada L"/);
    expect(declined.body).toMatch(/id="email" name="email"[^>]* value="ada@example.com"/);
    expect(declined.body).not.toContain(TEST_CARDS.declined);

    // The confirmation step carries the amount: a top-up that needs it completes.
    const stepped = await pay(topup.checkout_session_token, { amount: '23.45', card_number: TEST_CARDS.requiresAction });
    expect(stepped.statusCode).toBe(200);
    const paymentId = /name="payment_id" value="([^"]+)"/.exec(stepped.body)![1]!;
    expect(stepped.body).toContain('name="amount" value="23.45"');
    const confirmed = await t.app.inject({
      method: 'POST',
      url: '/checkout/confirm',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      payload: new URLSearchParams({ token: topup.checkout_session_token, payment_id: paymentId, amount: '23.45' }).toString(),
    });
    expect(confirmed.statusCode, confirmed.body).toBe(200);
    expect(confirmed.body).toMatch(/<dt>Paid<\/dt><dd>23.45 USD<\/dd>/);
  });

  it('a completed checkout recaps what was paid and credited, links a stable receipt (also in the API) and returns to the exact origin_url', async () => {
    const free = await createPlan(t, { name: 'Basic', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'Ten', cost: '8', credit_amount: '10' }] });
    const { customerId } = await createCustomer(t);
    await subscribe(t, customerId, free.plan_id);
    const session = (await create({ checkout_mode: 'credit_bundle', customer_id: customerId, credit_bundle_id: free.credit_bundles[0].credit_bundle_id, origin_url: 'https://shop.example.com/account/billing?tab=credits&x=%C3%A9' })).json();
    expect(session.origin_url).toBe('https://shop.example.com/account/billing?tab=credits&x=%C3%A9');
    const paid = await pay(session.checkout_session_token, { card_number: TEST_CARDS.succeeds });
    expect(paid.statusCode, paid.body).toBe(200);
    const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', '=', session.checkout_session_id).executeTakeFirstOrThrow();
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    const recap = (body: string) => {
      expect(body).toMatch(/<dt>Paid<\/dt><dd>8.00 USD<\/dd>/);
      expect(body).toMatch(/<dt>Credited<\/dt><dd>10.00 USD bundle credit<\/dd>/);
      expect(body).toContain(`<time datetime="${shown.completed_at}">${shown.completed_at.slice(0, 10)} ${shown.completed_at.slice(11, 16)} UTC</time>`);
      expect(body).toContain(`<dd>${payment.id}</dd>`);
    };
    recap(paid.body);
    expect(paid.body).toContain('href="https://shop.example.com/account/billing?tab=credits&amp;x=%C3%A9"');
    // The receipt: linked from the page, in the API with this Tollgate's public URL, stable, unguessable.
    const key = new URL(shown.receipt_url).searchParams.get('key')!;
    expect(shown.receipt_url).toBe(`https://pay.example.com/tollgate/checkout/receipt?session=${session.checkout_session_id}&key=${key}`);
    expect(key).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(paid.body).toContain(`href="/checkout/receipt?session=${session.checkout_session_id}&amp;key=${key}"`);
    const listed = (await t.app.inject({ method: 'GET', url: '/v1/checkout_sessions', headers: t.auth() })).json();
    expect(listed.data.find((s: { checkout_session_id: string }) => s.checkout_session_id === session.checkout_session_id).receipt_url).toBe(shown.receipt_url);
    const path = `/checkout/receipt?session=${session.checkout_session_id}&key=${key}`;
    for (let i = 0; i < 2; i++) {
      const receipt = await t.app.inject({ method: 'GET', url: path });
      expect(receipt.statusCode).toBe(200);
      expect(receipt.body).toContain('Paid to Acme');
      recap(receipt.body);
      expect(receipt.headers['x-frame-options']).toBe('DENY');
    }
    t.clock.advance(2 * 60 * 60_000);
    expect((await t.app.inject({ method: 'GET', url: path })).statusCode).toBe(200);
    const wrongKey = `${key.slice(0, -1)}${key.endsWith('A') ? 'B' : 'A'}`;
    for (const url of [`/checkout/receipt?session=${session.checkout_session_id}&key=${wrongKey}`, `/checkout/receipt?session=${session.checkout_session_id}`, '/checkout/receipt?session=cs_nope&key=x']) {
      const refused = await t.app.inject({ method: 'GET', url });
      expect(refused.statusCode, url).toBe(404);
      expect(refused.body).not.toContain(payment.id);
    }
    // An open session has no receipt yet, even with the right key.
    const open = (await create({ checkout_mode: 'onboarding' })).json();
    expect(open.receipt_url).toBeNull();
    const row = await t.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', open.checkout_session_id).executeTakeFirstOrThrow();
    expect((await t.app.inject({ method: 'GET', url: `/${receiptPath(row)}` })).statusCode).toBe(404);
  });

  it('the currency comes from CURRENCY, and STRIPE_CURRENCY must agree with it', async () => {
    expect(loadConfig({ CURRENCY: 'eur' }).currency).toBe('EUR');
    expect(loadConfig({}).currency).toBe('USD');
    expect(loadConfig({ STRIPE_CURRENCY: 'gbp' }).currency).toBe('GBP');
    expect(() => loadConfig({ CURRENCY: 'EUR', STRIPE_CURRENCY: 'usd' })).toThrow(/STRIPE_CURRENCY \(usd\) differs from CURRENCY \(EUR\)/);
    expect(() => loadConfig({ CURRENCY: 'euro' })).toThrow(/CURRENCY: must be an ISO 4217 currency code/);
    const eur = await startTestApp(dialect, { env: { CURRENCY: 'EUR' } });
    try {
      const { customerId } = await createCustomer(eur);
      const s = (await eur.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: eur.auth(), payload: { checkout_mode: 'topup', customer_id: customerId, origin_url: 'https://shop.example.com' } })).json();
      const form = new URLSearchParams({ token: s.checkout_session_token, amount: '5', card_number: TEST_CARDS.succeeds }).toString();
      const paid = await eur.app.inject({ method: 'POST', url: '/checkout/pay', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: form });
      expect(paid.body).toMatch(/<dt>Paid<\/dt><dd>5.00 EUR<\/dd>/);
      expect(paid.body).not.toContain('USD');
    } finally {
      await eur.close();
    }
  });
});
