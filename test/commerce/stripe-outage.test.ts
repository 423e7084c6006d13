import Stripe from 'stripe';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { renewDueSubscriptions, PROVIDER_RETRY_MS } from '../../src/commerce/renewals.ts';
import type { Config } from '../../src/config.ts';
import { parseMoney } from '../../src/domain/money.ts';
import type { App } from '../../src/http/types.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { createPaymentProvider } from '../../src/payments/index.ts';
import type { Storage } from '../../src/storage/db.ts';
import { TestClock } from '../helpers/clock.ts';
import { eventsOfType, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { closeStripeApp, startAppOnStripeStandIn, type StripeApp } from '../helpers/stripe-app.ts';
import type { StripeStandIn } from '../helpers/stripe-stand-in.ts';

/**
 * Stripe does not answer (the local stand-in shut down): a checkout is answered 503
 * `service_unavailable` with Retry-After and writes nothing but its failed attempt, so the session
 * can be paid once Stripe is back; a paid POST /v1/subscriptions is 503 too; a renewal is retried
 * later with the same payment (not counted as a failed attempt); an auto top-up answers the
 * request 503 and buys nothing. Each works again once the stand-in is back up.
 *
 * And when Stripe took an off-session payment but its answer was lost (the stand-in drops it),
 * Stripe's webhook event settles it: a renewal renews, an auto top-up is credited — once, whatever
 * the duplicate or out-of-order deliveries (events signed by the package's test-header helper).
 */
const SECRET_KEY = 'sk_test_tollgate_outage';
const WEBHOOK_SECRET = 'whsec_tollgate_outage';

describe.each(databasesUnderTest())('Stripe unreachable on %s', (dialect) => {
  let stripeApi: StripeStandIn;
  let app: App;
  let storage: Storage;
  let secretKey: string;
  let config: Config;
  const clock = new TestClock();
  const auth = () => ({ authorization: `Bearer ${secretKey}` });

  let started: StripeApp | undefined;

  beforeAll(async () => {
    started = await startAppOnStripeStandIn(dialect, clock, { apiKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET });
    ({ stripeApi, config, storage, app, secretKey } = started);
  });
  afterEach(async () => {
    stripeApi.dropAnswers(false);
    await stripeApi.up().catch(() => undefined);
    expect(stripeApi.problems).toEqual([]);
    expect((await verifyLedger(storage)).problems).toEqual([]);
  });
  afterAll(() => closeStripeApp(started));

  const api = (method: 'POST' | 'GET', url: string, payload?: Record<string, unknown>) => app.inject({ method, url, headers: auth(), ...(payload ? { payload } : {}) });
  async function session(payload: Record<string, unknown>): Promise<{ id: string; token: string }> {
    const res = await api('POST', '/v1/checkout_sessions', { origin_url: 'https://shop.example.com', ...payload });
    expect(res.statusCode, res.body).toBe(201);
    return { id: res.json().checkout_session_id, token: res.json().checkout_session_token };
  }
  const pay = (token: string, form: Record<string, string>, accept = 'application/json') =>
    app.inject({
      method: 'POST',
      url: '/checkout/pay',
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept },
      payload: new URLSearchParams({ token, ...form }).toString(),
    });
  const paymentsOf = (sessionId: string) => storage.db.selectFrom('payments').selectAll().where('reference', 'like', `${sessionId}%`).orderBy('id').execute();
  const countOf = async (table: 'connections' | 'payment_methods') => Number((await storage.db.selectFrom(table).select((eb) => eb.fn.countAll().as('n')).executeTakeFirstOrThrow()).n);

  /** A Stripe event about a PaymentIntent, signed at the app's time with the package's own helper. */
  function deliver(id: string, type: string, intentId: string) {
    const payload = JSON.stringify({ id, object: 'event', type, api_version: Stripe.API_VERSION, created: Math.floor(clock.now() / 1000), data: { object: { id: intentId, object: 'payment_intent' } } });
    const header = Stripe.webhooks.generateTestHeaderString({ payload, secret: WEBHOOK_SECRET, timestamp: Math.floor(clock.now() / 1000) });
    return app.inject({ method: 'POST', url: '/v1/payments/stripe/webhook', headers: { 'content-type': 'application/json', 'stripe-signature': header }, payload });
  }
  const resultOf = async (delivery: ReturnType<typeof deliver>) => (await delivery).json().result as string;
  /** The stand-in's PaymentIntent for one of our payment rows. */
  const intentOf = (paymentId: string) => [...stripeApi.intents.values()].find((i) => (i.metadata as Record<string, string>).tollgate_payment_id === paymentId)!;

  /** A customer who paid a checkout with a card, which is saved with Stripe for off-session charges. */
  async function customerWithCard(): Promise<{ id: string; walletId: string }> {
    const s = await session({ checkout_mode: 'onboarding' });
    expect((await pay(s.token, { amount: '1', payment_method: 'pm_card_visa' })).statusCode).toBe(200);
    const row = await storage.db
      .selectFrom('checkout_sessions')
      .innerJoin('connections', 'connections.id', 'checkout_sessions.connection_id')
      .select(['connections.id', 'connections.wallet_id'])
      .where('checkout_sessions.id', '=', s.id)
      .executeTakeFirstOrThrow();
    return { id: row.id, walletId: row.wallet_id };
  }

  it('a checkout is answered 503 service_unavailable with Retry-After, nothing is credited or created, and the session is paid once Stripe is back', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const customers = await countOf('connections');
    await stripeApi.down();

    const res = await pay(s.token, { amount: '20', payment_method: 'pm_card_visa', name: 'Ada Lovelace' });
    expect(res.statusCode).toBe(503);
    expect(res.headers['retry-after']).toBe('30');
    expect(res.json().error.code).toBe('service_unavailable');
    // A browser gets the form again, with the reason, and the same status.
    const page = await pay(s.token, { amount: '20', payment_method: 'pm_card_visa' }, 'text/html,application/xhtml+xml');
    expect(page.statusCode).toBe(503);
    expect(page.headers['retry-after']).toBe('30');
    expect(page.body).toContain('cannot be reached');

    // Two attempts recorded failed (unanswered), neither holding the session; nothing else written.
    const attempts = await paymentsOf(s.id);
    expect(attempts.map((p) => [p.status, p.failure_reason, p.reference === `${s.id}:${p.id}`])).toEqual([
      ['failed', 'provider_unavailable', true],
      ['failed', 'provider_unavailable', true],
    ]);
    expect(await countOf('connections')).toBe(customers);
    expect((await api('GET', `/v1/checkout_sessions/${s.id}`)).json()).toMatchObject({ completed_at: null, customer_id: null });
    expect((await eventsOfType(storage, 'checkout.completed')).filter((e) => e.data.checkout_session_id === s.id)).toEqual([]);

    await stripeApi.up();
    const paid = await pay(s.token, { amount: '20', payment_method: 'pm_card_visa' });
    expect(paid.statusCode, paid.body).toBe(200);
    const done = (await api('GET', `/v1/checkout_sessions/${s.id}`)).json();
    const customer = await storage.db.selectFrom('connections').select('wallet_id').where('id', '=', done.customer_id).executeTakeFirstOrThrow();
    expect((await walletBuckets(storage, customer.wallet_id)).prepaid).toBe(parseMoney('20'));
  });

  it('a paid POST /v1/subscriptions is 503 with Retry-After while Stripe does not answer', async () => {
    const customer = await customerWithCard();
    const plan = (await api('POST', '/v1/plans', { name: 'Pro', period_amount: '10', billing_interval: 'month' })).json();
    await stripeApi.down();
    const res = await api('POST', '/v1/subscriptions', { customer_id: customer.id, plan_id: plan.plan_id });
    expect(res.statusCode).toBe(503);
    expect(res.headers['retry-after']).toBe('30');
    expect(res.json().error.code).toBe('service_unavailable');
    expect((await walletBuckets(storage, customer.walletId)).cycle).toBe(0n);
  });

  it('a renewal is retried later with the same payment, not counted as a failed attempt, and renews once Stripe answers', async () => {
    const customer = await customerWithCard();
    const plan = (await api('POST', '/v1/plans', { name: 'Monthly', period_amount: '10', included_credit: '10', billing_interval: 'month' })).json();
    const started = await api('POST', '/v1/subscriptions', { customer_id: customer.id, plan_id: plan.plan_id });
    expect(started.statusCode, started.body).toBe(201);
    const sub = started.json().subscription;
    const end = new Date(sub.cycle_end_at);
    const engine = { storage, payments: createPaymentProvider(config), clock };

    await stripeApi.down();
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, end))).toEqual(['provider_unavailable']);
    const waiting = await storage.db.selectFrom('subscriptions').selectAll().where('id', '=', sub.subscription_id).executeTakeFirstOrThrow();
    expect({ ...waiting, failed_attempts: Number(waiting.failed_attempts) }).toMatchObject({ status: 'active', failed_attempts: 0, claimed_until: null, next_attempt_at: new Date(end.getTime() + PROVIDER_RETRY_MS).toISOString() });
    const pending = await storage.db.selectFrom('payments').selectAll().where('purpose', '=', 'renewal').where('reference', 'like', `${sub.subscription_id}:${sub.cycle_end_at}:%`).execute();
    expect(pending.map((p) => p.status)).toEqual(['pending']);
    expect(await eventsOfType(storage, 'subscription.payment_failed')).toEqual([]);
    // Not due again before the retry time.
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, new Date(end.getTime() + 60_000)))).toEqual([]);

    await stripeApi.up();
    const intentsBefore = stripeApi.requests.filter((r) => r.path === '/v1/payment_intents').length;
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, new Date(end.getTime() + PROVIDER_RETRY_MS)))).toEqual(['renewed']);
    const charged = stripeApi.requests.filter((r) => r.path === '/v1/payment_intents').slice(intentsBefore);
    // The same payment row, so the same idempotency key as the unanswered attempt.
    expect(charged.filter((r) => r.params['metadata[tollgate_payment_id]'] === pending[0]!.id).map((r) => r.idempotencyKey)).toEqual([pending[0]!.id]);
    const renewed = await storage.db.selectFrom('payments').selectAll().where('id', '=', pending[0]!.id).executeTakeFirstOrThrow();
    expect(renewed.status).toBe('succeeded');
    expect((await walletBuckets(storage, customer.walletId)).cycle).toBe(parseMoney('20'));
  });

  /**
   * Subscribes the customer to a free plan linking a meter of 2 a call, whose auto top-up bundle
   * costs 5 and credits `credit`; returns the meter.
   */
  async function subscribeToAutoTopUpPlan(customerId: string, credit: string): Promise<{ meter_id: string; meter_slug: string }> {
    const meter = (await api('POST', '/v1/meters', { name: 'Per call', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '2' }] })).json();
    const plan = (
      await api('POST', '/v1/plans', {
        name: 'Metered',
        period_amount: '0',
        included_credit: '0',
        billing_interval: 'month',
        meter_ids: [meter.meter_id],
        credit_bundles: [{ name: 'Refill', cost: '5', credit_amount: credit }],
        default_auto_top_up_bundle_index: 0,
      })
    ).json();
    expect((await api('POST', '/v1/subscriptions', { customer_id: customerId, plan_id: plan.plan_id })).statusCode).toBe(201);
    return meter;
  }

  it('an auto top-up answers the request 503 and buys nothing while Stripe does not answer; the next shortage buys it', async () => {
    const customer = await customerWithCard();
    const meter = await subscribeToAutoTopUpPlan(customer.id, '5');
    const record = () => api('POST', '/v1/requests', { request_id: `r-${crypto.randomUUID()}`, customer_id: customer.id, meter_slug: meter.meter_slug });
    const before = await walletBuckets(storage, customer.walletId);
    // The 1 of prepaid from the checkout cannot pay 2: the bundle is due.
    await stripeApi.down();
    const refused = await record();
    expect(refused.statusCode).toBe(503);
    expect(refused.headers['retry-after']).toBe('30');
    expect(refused.json().error.code).toBe('service_unavailable');
    const purchases = () => storage.db.selectFrom('payments').select(['status', 'failure_reason']).where('purpose', '=', 'auto_top_up').where('connection_id', '=', customer.id).orderBy('id').execute();
    expect(await purchases()).toEqual([{ status: 'failed', failure_reason: 'provider_unavailable' }]);
    expect(await walletBuckets(storage, customer.walletId)).toEqual(before);

    await stripeApi.up();
    expect((await record()).statusCode).toBe(201);
    expect((await purchases()).map((p) => p.status)).toEqual(['failed', 'succeeded']);
    expect((await walletBuckets(storage, customer.walletId)).bundle).toBe(parseMoney('3'));
  });

  /** A customer with a saved card on a paid monthly plan: its subscription and the engine. */
  async function monthlySubscriber() {
    const customer = await customerWithCard();
    const plan = (await api('POST', '/v1/plans', { name: 'Monthly', period_amount: '10', included_credit: '10', billing_interval: 'month' })).json();
    const started = await api('POST', '/v1/subscriptions', { customer_id: customer.id, plan_id: plan.plan_id });
    expect(started.statusCode, started.body).toBe(201);
    const sub = started.json().subscription;
    return { customer, sub, end: new Date(sub.cycle_end_at), engine: { storage, payments: createPaymentProvider(config), clock } };
  }
  /** What a run of the engine did to this subscription (earlier tests' subscriptions fall due too). */
  const renewalsOf = async (sub: { subscription_id: string }, run: ReturnType<typeof renewDueSubscriptions>) =>
    (await run).filter((r) => r.subscriptionId === sub.subscription_id).map((r) => r.outcome);
  const renewalPayment = async (sub: { subscription_id: string; cycle_end_at: string }) =>
    storage.db.selectFrom('payments').selectAll().where('purpose', '=', 'renewal').where('reference', 'like', `${sub.subscription_id}:${sub.cycle_end_at}:%`).executeTakeFirstOrThrow();

  it("a renewal Stripe took but whose answer was lost is renewed once by payment_intent.succeeded; a duplicate and a late failure event change nothing", async () => {
    const { customer, sub, end, engine } = await monthlySubscriber();
    stripeApi.dropAnswers(true);
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, end))).toEqual(['provider_unavailable']);
    stripeApi.dropAnswers(false);
    const payment = await renewalPayment(sub);
    expect(payment.status).toBe('pending');
    const intent = intentOf(payment.id);
    expect(intent.status).toBe('succeeded');

    expect(await resultOf(deliver('evt_renewal_ok', 'payment_intent.succeeded', intent.id))).toBe('credited');
    const renewed = await storage.db.selectFrom('subscriptions').selectAll().where('id', '=', sub.subscription_id).executeTakeFirstOrThrow();
    expect(renewed.cycle_start_at).toBe(sub.cycle_end_at);
    expect(renewed.status).toBe('active');
    expect((await renewalPayment(sub)).status).toBe('succeeded');
    expect((await walletBuckets(storage, customer.walletId)).cycle).toBe(parseMoney('20'));

    expect(await resultOf(deliver('evt_renewal_ok', 'payment_intent.succeeded', intent.id))).toBe('duplicate');
    expect(await resultOf(deliver('evt_renewal_late_failure', 'payment_intent.payment_failed', intent.id))).toBe('unchanged');
    // Nothing is due any more: the engine charges nothing at its retry time.
    const charges = stripeApi.requests.filter((r) => r.path === '/v1/payment_intents').length;
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, new Date(end.getTime() + PROVIDER_RETRY_MS)))).toEqual([]);
    expect(stripeApi.requests.filter((r) => r.path === '/v1/payment_intents')).toHaveLength(charges);
    expect((await walletBuckets(storage, customer.walletId)).cycle).toBe(parseMoney('20'));
    const renewedEvents = (await eventsOfType(storage, 'subscription.renewed')).filter((e) => e.data.subscription_id === sub.subscription_id);
    expect(renewedEvents).toHaveLength(1);
  });

  it('a renewal Stripe declined with its answer lost is recorded by payment_intent.payment_failed, and the engine makes it past due', async () => {
    const { sub, end, engine } = await monthlySubscriber();
    stripeApi.dropAnswers(true);
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, end))).toEqual(['provider_unavailable']);
    stripeApi.dropAnswers(false);
    const payment = await renewalPayment(sub);
    const intent = intentOf(payment.id);
    stripeApi.setIntentStatus(intent.id, 'requires_payment_method', 'Your card was declined.');

    expect(await resultOf(deliver('evt_renewal_declined', 'payment_intent.payment_failed', intent.id))).toBe('failed');
    expect(await renewalPayment(sub)).toMatchObject({ status: 'failed', failure_reason: 'Your card was declined.' });
    expect(await renewalsOf(sub, renewDueSubscriptions(engine, new Date(end.getTime() + PROVIDER_RETRY_MS)))).toEqual(['past_due']);
    const failed = (await eventsOfType(storage, 'subscription.payment_failed')).filter((e) => e.data.subscription_id === sub.subscription_id);
    expect(failed.map((e) => [e.data.attempt, e.data.reason])).toEqual([[1, 'Your card was declined.']]);
  });

  it('an auto top-up Stripe took but whose answer was lost is credited once by its event, whatever the order and repetition of deliveries', async () => {
    const customer = await customerWithCard();
    const meter = await subscribeToAutoTopUpPlan(customer.id, '6');
    const before = await walletBuckets(storage, customer.walletId);
    stripeApi.dropAnswers(true);
    const refused = await api('POST', '/v1/requests', { request_id: `r-${crypto.randomUUID()}`, customer_id: customer.id, meter_slug: meter.meter_slug });
    stripeApi.dropAnswers(false);
    expect(refused.statusCode).toBe(503);
    const purchase = await storage.db.selectFrom('payments').selectAll().where('purpose', '=', 'auto_top_up').where('connection_id', '=', customer.id).executeTakeFirstOrThrow();
    expect(purchase).toMatchObject({ status: 'failed', failure_reason: 'provider_unavailable' });
    const intent = intentOf(purchase.id);

    // An earlier attempt's failure arrives first: the intent has succeeded, and that decides.
    expect(await resultOf(deliver('evt_topup_failed_first', 'payment_intent.payment_failed', intent.id))).toBe('credited');
    expect(await resultOf(deliver('evt_topup_succeeded', 'payment_intent.succeeded', intent.id))).toBe('unchanged');
    expect(await resultOf(deliver('evt_topup_succeeded', 'payment_intent.succeeded', intent.id))).toBe('duplicate');
    expect(await storage.db.selectFrom('payments').select(['status', 'failure_reason']).where('id', '=', purchase.id).executeTakeFirstOrThrow()).toEqual({ status: 'succeeded', failure_reason: null });
    expect(await walletBuckets(storage, customer.walletId)).toEqual({ ...before, balance: before.balance + parseMoney('6'), bundle: before.bundle + parseMoney('6') });
  });
});
