import type { AddressInfo } from 'node:net';
import Stripe from 'stripe';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config.ts';
import { parseMoney } from '../../src/domain/money.ts';
import type { App } from '../../src/http/types.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { createPaymentProvider } from '../../src/payments/index.ts';
import { StripePaymentProvider } from '../../src/payments/stripe.ts';
import { TestPaymentProvider } from '../../src/payments/test-provider.ts';
import type { Storage } from '../../src/storage/db.ts';
import { refusedBeforeUpload } from '../helpers/uploads.ts';
import { TestClock } from '../helpers/clock.ts';
import { eventsOfType, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { closeStripeApp, startAppOnStripeStandIn, type StripeApp } from '../helpers/stripe-app.ts';
import type { StripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * The Stripe adapter on the real `stripe` package, pointed at a local stand-in for Stripe's API
 * (which checks what the package sends), and Stripe's webhook events signed with the package's own
 * test-header helper: checkout paid, declined, confirmed later by Stripe; off-session charges of
 * the saved method; events delivered twice, out of order, unsigned or stale.
 */
const SECRET_KEY = 'sk_test_tollgate_standin';
const WEBHOOK_SECRET = 'whsec_tollgate_standin';
const ORIGIN = 'https://shop.example.com';

describe('Stripe provider selection', () => {
  it('STRIPE_SECRET_KEY with STRIPE_WEBHOOK_SECRET selects Stripe; neither keeps the test provider; one alone is refused', () => {
    const base = { DATABASE_URL: 'sqlite::memory:' };
    expect(createPaymentProvider(loadConfig({ ...base, STRIPE_SECRET_KEY: SECRET_KEY, STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET }))).toBeInstanceOf(StripePaymentProvider);
    expect(createPaymentProvider(loadConfig(base))).toBeInstanceOf(TestPaymentProvider);
    expect(() => loadConfig({ ...base, STRIPE_SECRET_KEY: SECRET_KEY })).toThrow(ConfigError);
    expect(() => loadConfig({ ...base, STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET })).toThrow(/go together/);
    expect(() => loadConfig({ ...base, STRIPE_SECRET_KEY: 'pk_live_nope', STRIPE_WEBHOOK_SECRET: WEBHOOK_SECRET })).toThrow(/STRIPE_SECRET_KEY/);
  });
});

describe.each(databasesUnderTest())('Stripe adapter on %s', (dialect) => {
  let stripeApi: StripeStandIn;
  let app: App;
  let storage: Storage;
  let secretKey: string;
  const clock = new TestClock();
  const auth = () => ({ authorization: `Bearer ${secretKey}` });

  let started: StripeApp | undefined;

  beforeAll(async () => {
    started = await startAppOnStripeStandIn(dialect, clock, { apiKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET });
    ({ stripeApi, storage, app, secretKey } = started);
  });
  afterEach(async () => {
    expect(stripeApi.problems).toEqual([]);
    expect((await verifyLedger(storage)).problems).toEqual([]);
  });
  afterAll(() => closeStripeApp(started));

  async function session(payload: Record<string, unknown>): Promise<{ id: string; token: string }> {
    const res = await app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: auth(), payload: { origin_url: ORIGIN, ...payload } });
    expect(res.statusCode, res.body).toBe(201);
    return { id: res.json().checkout_session_id, token: res.json().checkout_session_token };
  }
  const pay = (token: string, form: Record<string, string>) =>
    app.inject({ method: 'POST', url: '/checkout/pay', headers: { 'content-type': 'application/x-www-form-urlencoded' }, payload: new URLSearchParams({ token, ...form }).toString() });
  const checkoutPayment = (sessionId: string) => storage.db.selectFrom('payments').selectAll().where('reference', '=', sessionId).executeTakeFirst();
  const walletOfSession = async (sessionId: string) => {
    const row = await storage.db
      .selectFrom('checkout_sessions')
      .innerJoin('connections', 'connections.id', 'checkout_sessions.connection_id')
      .select(['connections.wallet_id', 'connections.id', 'checkout_sessions.completed_at'])
      .where('checkout_sessions.id', '=', sessionId)
      .executeTakeFirst();
    return row;
  };

  /** A Stripe event about a PaymentIntent, as Stripe would deliver it, signed at the app's time. */
  function signedEvent(id: string, type: string, intentId: string, opts: { secret?: string; ageSeconds?: number } = {}) {
    const payload = JSON.stringify({ id, object: 'event', type, api_version: Stripe.API_VERSION, created: Math.floor(clock.now() / 1000), data: { object: { id: intentId, object: 'payment_intent' } } });
    return signedBody(payload, opts);
  }
  /** Any body, signed as Stripe signs a delivery (`ageSeconds` below 0: dated in the future). */
  function signedBody(payload: string, opts: { secret?: string; ageSeconds?: number } = {}) {
    const header = Stripe.webhooks.generateTestHeaderString({ payload, secret: opts.secret ?? WEBHOOK_SECRET, timestamp: Math.floor(clock.now() / 1000) - (opts.ageSeconds ?? 0) });
    return { payload, header };
  }
  const deliver = (event: { payload: string; header: string }) =>
    app.inject({ method: 'POST', url: '/v1/payments/stripe/webhook', headers: { 'content-type': 'application/json', 'stripe-signature': event.header }, payload: event.payload });

  it('a checkout paid with a card: one PaymentIntent as the package sends it, confirmed by Stripe, then credited and the method saved', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const before = stripeApi.requests.length;
    const res = await pay(s.token, { amount: '20', payment_method: 'pm_card_visa', name: 'Ada Lovelace' });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.body).toContain('Payment received');

    const payment = (await checkoutPayment(s.id))!;
    expect(payment).toMatchObject({ provider: 'stripe', status: 'succeeded', amount: parseMoney('20') });
    const sent = stripeApi.requests.slice(before);
    expect(sent.map((r) => `${r.method} ${r.path}`)).toEqual(['POST /v1/customers', 'POST /v1/payment_intents']);
    expect(sent[1]!.params).toMatchObject({
      amount: '2000',
      currency: 'usd',
      payment_method: 'pm_card_visa',
      confirm: 'true',
      setup_future_usage: 'off_session',
      'automatic_payment_methods[enabled]': 'true',
      'automatic_payment_methods[allow_redirects]': 'never',
      'metadata[tollgate_payment_id]': payment.id,
      customer: expect.stringMatching(/^cus_/),
    });
    expect(sent[1]!.idempotencyKey).toBe(payment.id);
    expect(payment.provider_ref).toMatch(/^pi_/);

    const customer = (await walletOfSession(s.id))!;
    expect((await walletBuckets(storage, customer.wallet_id)).prepaid).toBe(parseMoney('20'));
    const method = await storage.db.selectFrom('payment_methods').selectAll().where('connection_id', '=', customer.id).executeTakeFirstOrThrow();
    expect(method).toMatchObject({ provider: 'stripe', provider_ref: 'pm_card_visa', provider_customer_ref: sent[1]!.params.customer, label: 'Visa ending 4242' });

    // Renewals and auto top-ups charge that method off-session: a paid plan started by the API.
    const plan = (await app.inject({ method: 'POST', url: '/v1/plans', headers: auth(), payload: { name: 'Pro', period_amount: '12.5', billing_interval: 'month' } })).json();
    const mark = stripeApi.requests.length;
    const started = await app.inject({ method: 'POST', url: '/v1/subscriptions', headers: auth(), payload: { customer_id: customer.id, plan_id: plan.plan_id } });
    expect(started.statusCode, started.body).toBe(201);
    const offSession = stripeApi.requests.slice(mark);
    expect(offSession).toHaveLength(1);
    expect(offSession[0]!.params).toMatchObject({ amount: '1250', off_session: 'true', confirm: 'true', customer: method.provider_customer_ref, payment_method: 'pm_card_visa' });
    expect((await walletBuckets(storage, customer.wallet_id)).cycle).toBe(parseMoney('12.5'));
  });

  it('a declined card credits nothing and the session can be paid again; an amount with a fraction of a cent is never sent', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const declined = await pay(s.token, { amount: '5', payment_method: 'pm_card_chargeDeclined' });
    expect(declined.statusCode).toBe(402);
    expect(declined.body).toContain('Your card was declined.');
    expect(await walletOfSession(s.id)).toBeUndefined();

    const before = stripeApi.requests.length;
    const fraction = await pay(s.token, { amount: '5.001', payment_method: 'pm_card_visa' });
    expect(fraction.statusCode).toBe(402);
    expect(fraction.body).toContain('whole cents');
    expect(stripeApi.requests.slice(before).filter((r) => r.path === '/v1/payment_intents')).toEqual([]);

    expect((await pay(s.token, { amount: '5', payment_method: 'pm_card_visa' })).statusCode).toBe(200);
    expect((await walletBuckets(storage, (await walletOfSession(s.id))!.wallet_id)).prepaid).toBe(parseMoney('5'));
  });

  it('a payment that needs the customer at Stripe is credited once by its webhook event: duplicate and out-of-order deliveries change nothing', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const res = await pay(s.token, { amount: '30', payment_method: 'pm_card_authenticationRequired' });
    expect(res.body).toContain('Confirm your payment');
    const payment = (await checkoutPayment(s.id))!;
    expect(payment.status).toBe('requires_action');
    expect(await walletOfSession(s.id)).toBeUndefined();

    // Before Stripe confirms it, an event changes nothing: the intent still needs the customer.
    expect((await deliver(signedEvent('evt_early', 'payment_intent.requires_action', payment.provider_ref!))).json()).toEqual({ received: true, result: 'unchanged' });

    stripeApi.setIntentStatus(payment.provider_ref!, 'succeeded');
    const succeeded = signedEvent('evt_succeeded', 'payment_intent.succeeded', payment.provider_ref!);
    expect((await deliver(succeeded)).json()).toEqual({ received: true, result: 'credited' });
    const customer = (await walletOfSession(s.id))!;
    expect(customer.completed_at).not.toBeNull();
    expect((await walletBuckets(storage, customer.wallet_id)).prepaid).toBe(parseMoney('30'));
    expect((await eventsOfType(storage, 'checkout.completed')).filter((e) => e.data.checkout_session_id === s.id)).toHaveLength(1);

    // Stripe delivers the same event again, and an older failure of the same intent arrives late.
    expect((await deliver(succeeded)).json()).toEqual({ received: true, result: 'duplicate' });
    expect((await deliver(signedEvent('evt_older_failure', 'payment_intent.payment_failed', payment.provider_ref!))).json()).toEqual({ received: true, result: 'unchanged' });
    expect((await checkoutPayment(s.id))!.status).toBe('succeeded');
    expect((await walletBuckets(storage, customer.wallet_id)).prepaid).toBe(parseMoney('30'));
    const recorded = await storage.db.selectFrom('provider_events').select(['event_id', 'type']).where('event_id', 'like', 'evt_%').orderBy('event_id').execute();
    expect(recorded.map((r) => r.event_id)).toEqual(expect.arrayContaining(['evt_early', 'evt_older_failure', 'evt_succeeded']));
    // The page's own confirmation comes too late: the token is spent.
    const confirm = await app.inject({
      method: 'POST',
      url: '/checkout/confirm',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      payload: new URLSearchParams({ token: s.token, payment_id: payment.id }).toString(),
    });
    expect(confirm.statusCode).toBe(410);
  });

  it('a customer created by a checkout the webhook completes has the contact details the page took, as one the page completes', async () => {
    const form = { amount: '4', name: 'Grace Brewster Hopper', email: 'grace@example.com' };
    const onPage = await session({ checkout_mode: 'onboarding' });
    expect((await pay(onPage.token, { ...form, payment_method: 'pm_card_visa' })).statusCode).toBe(200);
    const byWebhook = await session({ checkout_mode: 'onboarding' });
    expect((await pay(byWebhook.token, { ...form, payment_method: 'pm_card_authenticationRequired' })).body).toContain('Confirm your payment');
    const payment = (await checkoutPayment(byWebhook.id))!;
    stripeApi.setIntentStatus(payment.provider_ref!, 'succeeded');
    const delivered = await deliver(signedEvent('evt_contact_kept', 'payment_intent.succeeded', payment.provider_ref!));
    expect(delivered.json().result, delivered.body).toBe('credited');

    const customerOf = async (sessionId: string) => {
      const id = (await walletOfSession(sessionId))!.id;
      const res = await app.inject({ method: 'GET', url: `/v1/customers/${id}`, headers: auth() });
      const { customer_id: _id, connection_id: _cid, connection_secret: _secret, wallet: _wallet, created_at: _at, ...fields } = res.json();
      return fields;
    };
    const viaPage = await customerOf(onPage.id);
    expect(viaPage.contact).toEqual({ first_name: 'Grace', last_name: 'Brewster Hopper', email: 'grace@example.com', phone: null });
    expect(await customerOf(byWebhook.id)).toEqual(viaPage);
    // And so does its customer.created event.
    const webhookCustomer = (await walletOfSession(byWebhook.id))!.id;
    const created = (await eventsOfType(storage, 'customer.created')).find((e) => e.data.customer_id === webhookCustomer);
    expect(created?.data.contact).toEqual(viaPage.contact);
  });

  it('events out of order: a failure event read while the intent has succeeded credits; a real failure frees the session for another card', async () => {
    const late = await session({ checkout_mode: 'onboarding' });
    await pay(late.token, { amount: '7', payment_method: 'pm_card_authenticationRequired' });
    const latePayment = (await checkoutPayment(late.id))!;
    stripeApi.setIntentStatus(latePayment.provider_ref!, 'succeeded');
    // The failure of a first attempt arrives after the customer succeeded with Stripe: the intent's state decides.
    expect((await deliver(signedEvent('evt_failed_first', 'payment_intent.payment_failed', latePayment.provider_ref!))).json().result).toBe('credited');
    expect((await deliver(signedEvent('evt_succeeded_second', 'payment_intent.succeeded', latePayment.provider_ref!))).json().result).toBe('unchanged');
    expect((await walletBuckets(storage, (await walletOfSession(late.id))!.wallet_id)).prepaid).toBe(parseMoney('7'));

    const failing = await session({ checkout_mode: 'onboarding' });
    await pay(failing.token, { amount: '9', payment_method: 'pm_card_authenticationRequired' });
    const failingPayment = (await checkoutPayment(failing.id))!;
    stripeApi.setIntentStatus(failingPayment.provider_ref!, 'requires_payment_method', 'The customer failed authentication.');
    expect((await deliver(signedEvent('evt_auth_failed', 'payment_intent.payment_failed', failingPayment.provider_ref!))).json().result).toBe('failed');
    const failed = await storage.db.selectFrom('payments').selectAll().where('id', '=', failingPayment.id).executeTakeFirstOrThrow();
    expect(failed).toMatchObject({ status: 'failed', failure_reason: 'The customer failed authentication.' });
    expect(await walletOfSession(failing.id)).toBeUndefined();
    expect((await pay(failing.token, { amount: '9', payment_method: 'pm_card_visa' })).statusCode).toBe(200);
  });

  it('refuses a delivery without a valid signature, signed with another secret, or older than the tolerance, and processes none of them', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    await pay(s.token, { amount: '3', payment_method: 'pm_card_authenticationRequired' });
    const payment = (await checkoutPayment(s.id))!;
    stripeApi.setIntentStatus(payment.provider_ref!, 'succeeded');
    const good = signedEvent('evt_forged', 'payment_intent.succeeded', payment.provider_ref!);
    for (const bad of [
      { payload: good.payload, header: '' },
      signedEvent('evt_forged', 'payment_intent.succeeded', payment.provider_ref!, { secret: 'whsec_someone_else' }),
      signedEvent('evt_forged', 'payment_intent.succeeded', payment.provider_ref!, { ageSeconds: 600 }),
      // Stripe's tolerance is five minutes either way: an hour ahead is as stale as an hour old.
      signedEvent('evt_forged', 'payment_intent.succeeded', payment.provider_ref!, { ageSeconds: -3600 }),
      signedEvent('evt_forged', 'payment_intent.succeeded', payment.provider_ref!, { ageSeconds: -301 }),
      { payload: good.payload, header: 't=abc,v1=zz' },
      { payload: good.payload.replace('"evt_forged"', '"evt_tampered"'), header: good.header },
    ]) {
      const res = await deliver(bad);
      expect(res.statusCode).toBe(400);
      expect(res.json().error.code).toBe('webhook_signature_invalid');
    }
    // Within the tolerance ahead (clocks differ a little) is Stripe's.
    expect((await deliver(signedEvent('evt_slightly_ahead', 'payment_intent.succeeded', payment.provider_ref!, { ageSeconds: -200 }))).statusCode).toBe(200);
    expect(await storage.db.selectFrom('provider_events').select('event_id').where('event_id', 'in', ['evt_forged', 'evt_tampered']).execute()).toEqual([]);
    // The route is documented, without an API key.
    const doc = (await app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    expect(doc.paths['/v1/payments/stripe/webhook'].post.security).toEqual([]);
  });

  it("answers a signed body that is not an event with its own words, never a parser's error text", async () => {
    for (const payload of ['{"id": "evt_1", ', 'null', '[]', '{"id":"evt_no_data","type":"payment_intent.succeeded"}', '{"id":"evt_x","type":"t","data":{"object":"text"}}']) {
      const res = await deliver(signedBody(payload));
      expect(res.statusCode, payload).toBe(400);
      const error = res.json().error as { code: string; message: string };
      expect(error.code).toBe('webhook_signature_invalid');
      expect(error.message, payload).toMatch(/^The signed body is not a (JSON )?Stripe event/);
      expect(error.message, payload).not.toMatch(/JSON at position|Unexpected|undefined|Cannot read|property/i);
    }
  });

  it('refuses a delivery over 512 KiB, and one without a usable signature header before reading its body', async () => {
    const event = (pad: number) => signedBody(JSON.stringify({ id: 'evt_big', type: 'customer.updated', data: { object: { id: 'cus_x', object: 'customer', pad: 'x'.repeat(pad) } } }));
    const tooLarge = await deliver(event(512 * 1024));
    expect(tooLarge.statusCode).toBe(413);
    expect(tooLarge.json().error.code).toBe('payload_too_large');
    const fits = await deliver(event(500 * 1024));
    expect(fits.statusCode, fits.body).toBe(200);
    await app.listen({ port: 0, host: '127.0.0.1' });
    const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    for (const header of [undefined, 't=1,v1=00', `t=${Math.floor(clock.now() / 1000) + 3600},v1=${'0'.repeat(64)}`]) {
      const early = await refusedBeforeUpload(`${base}/v1/payments/stripe/webhook`, header ? { 'stripe-signature': header } : {});
      expect(early.status).toBe(400);
      expect(JSON.parse(early.body).error.code).toBe('webhook_signature_invalid');
    }
  });
});
