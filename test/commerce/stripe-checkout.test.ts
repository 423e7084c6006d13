import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { reconcilePayments, RECONCILE_AFTER_MS } from '../../src/commerce/reconciliation.ts';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { CommerceState } from '../../src/commerce/state.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { createPaymentProvider } from '../../src/payments/index.ts';
import { AUTHENTICATION_REQUIRED } from '../../src/payments/stripe.ts';
import { HOSTED_CHECKOUT_CLOSED } from '../../src/payments/types.ts';
import { presentCustomer } from '../../src/services/customers.ts';
import { TestClock } from '../helpers/clock.ts';
import { eventsOfType, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { closeStripeApp, listenForStripe, startAppOnStripeStandIn, type StripeApp } from '../helpers/stripe-app.ts';

/**
 * The hosted checkout with Stripe: Tollgate's page sends the customer to Stripe Checkout (the
 * local stand-in's hosted page, over real HTTP), Stripe sends them back and sends its signed
 * events; whichever comes first credits, exactly once. Declines and 3-D Secure happen on Stripe's
 * page; the card saved there pays renewals off-session, and a card that needs authentication
 * off-session ends the renewal in a stated failure.
 */
const SECRET_KEY = 'sk_test_tollgate_checkout';
const WEBHOOK_SECRET = 'whsec_tollgate_checkout';

describe.each(databasesUnderTest())('Stripe Checkout on %s', (dialect) => {
  const clock = new TestClock();
  let started: StripeApp;
  let base: string;
  const auth = () => ({ authorization: `Bearer ${started.secretKey}`, 'content-type': 'application/json' });

  beforeAll(async () => {
    started = await startAppOnStripeStandIn(dialect, clock, { apiKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET });
    base = await listenForStripe(started, clock, WEBHOOK_SECRET);
  });
  afterEach(async () => {
    started.stripeApi.setWebhookTiming('immediate');
    expect(started.stripeApi.problems).toEqual([]);
    expect((await verifyLedger(started.storage)).problems).toEqual([]);
  });
  afterAll(() => closeStripeApp(started));

  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${base}${path}`, { method, headers: auth(), ...(body ? { body: JSON.stringify(body) } : {}) });
    return { status: res.status, body: await res.json() };
  };
  async function session(payload: Record<string, unknown>): Promise<{ id: string; token: string }> {
    const res = await api('POST', '/v1/checkout_sessions', { origin_url: 'https://shop.example.com/cart', ...payload });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    return { id: res.body.checkout_session_id, token: res.body.checkout_session_token };
  }
  const post = (url: string, form: Record<string, string>) =>
    fetch(url, { method: 'POST', redirect: 'manual', headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'text/html' }, body: new URLSearchParams(form).toString() });
  /** Tollgate's form, posted: answers the Stripe page it redirects to. */
  async function toStripe(token: string, form: Record<string, string> = {}): Promise<string> {
    const res = await post(`${base}/checkout/pay`, { token, ...form });
    expect(res.status, await res.clone().text()).toBe(303);
    const location = res.headers.get('location')!;
    expect(location.startsWith(`${started.stripeApi.url}/c/pay/cs_test_`)).toBe(true);
    return location;
  }
  /** A card typed on Stripe's page: the redirect back, or the page's answer. */
  const payOnStripe = (page: string, card: string) => post(page, { card });
  const stripeSessionOf = (page: string) => started.stripeApi.checkoutSessions.get(page.split('/').pop()!)!;
  const paymentsOf = (sessionId: string) => started.storage.db.selectFrom('payments').selectAll().where('reference', 'like', `${sessionId}%`).orderBy('created_at').orderBy('id').execute();
  const customerOf = async (sessionId: string) => {
    const row = await started.storage.db.selectFrom('checkout_sessions').select(['connection_id', 'completed_at']).where('id', '=', sessionId).executeTakeFirstOrThrow();
    if (!row.connection_id) return null;
    return started.storage.db.selectFrom('connections').select(['id', 'wallet_id']).where('id', '=', row.connection_id).executeTakeFirstOrThrow();
  };
  const resultsOf = (deliveries: { type: string; body: string }[]) => deliveries.map((d) => `${d.type}: ${JSON.parse(d.body).result}`);
  /** Ledger transactions made for the session's payments: one per credit. */
  const creditsOf = async (sessionId: string) => {
    const ids = (await paymentsOf(sessionId)).map((p) => p.id);
    return (await started.storage.db.selectFrom('ledger_transactions').select('id').where('reference', 'in', ids).execute()).length;
  };

  it('a top-up paid on Stripe with the event first: the event credits, the return shows the recap, the card is saved; once', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const form = await fetch(`${base}/checkout?token=${encodeURIComponent(s.token)}`);
    const html = await form.text();
    expect(html).not.toContain('payment_method');
    expect(html).toContain('target="_top"');
    expect(form.headers.get('content-security-policy')).toContain(`form-action 'self' ${started.stripeApi.url}`);

    const page = await toStripe(s.token, { amount: '20', name: 'Ada Lovelace', email: 'ada@example.com' });
    const sent = started.stripeApi.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!;
    const [payment] = await paymentsOf(s.id);
    expect(payment).toMatchObject({ status: 'requires_action', provider_ref: stripeSessionOf(page).id, amount: parseMoney('20') });
    expect(sent.params).toMatchObject({
      mode: 'payment',
      'line_items[0][price_data][unit_amount]': '2000',
      'line_items[0][price_data][currency]': 'usd',
      'line_items[0][price_data][product_data][name]': 'Wallet set-up',
      'payment_intent_data[setup_future_usage]': 'off_session',
      'payment_intent_data[metadata][tollgate_payment_id]': payment!.id,
      'metadata[tollgate_payment_id]': payment!.id,
      'allowed_payment_method_types[0]': 'card',
      success_url: `${base}/checkout/return?token=${encodeURIComponent(s.token)}`,
      cancel_url: `${base}/checkout?token=${encodeURIComponent(s.token)}`,
      customer: expect.stringMatching(/^cus_/),
    });
    expect(sent.idempotencyKey).toBe(`${payment!.id}:checkout`);
    expect(await (await fetch(page)).text()).toContain('20.00 USD');

    const paid = await payOnStripe(page, '4242 4242 4242 4242');
    expect(paid.status).toBe(303);
    expect(resultsOf(started.stripeApi.deliveries.slice(-2))).toEqual(['payment_intent.succeeded: credited', 'checkout.session.completed: unchanged']);
    const back = await fetch(paid.headers.get('location')!);
    const recap = await back.text();
    expect(back.status).toBe(200);
    expect(recap).toContain('Payment received');
    expect(recap).toContain('20.00 USD');

    const customer = (await customerOf(s.id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('20'));
    expect(await creditsOf(s.id)).toBe(1);
    const settled = (await paymentsOf(s.id))[0]!;
    expect(settled).toMatchObject({ status: 'succeeded', provider_ref: expect.stringMatching(/^pi_/) });
    const method = await started.storage.db.selectFrom('payment_methods').selectAll().where('connection_id', '=', customer.id).executeTakeFirstOrThrow();
    expect(method).toMatchObject({ provider: 'stripe', provider_ref: expect.stringMatching(/^pm_/), provider_customer_ref: sent.params.customer, label: 'Visa ending 4242' });
    expect((await eventsOfType(started.storage, 'checkout.completed')).filter((e) => e.data.checkout_session_id === s.id)).toHaveLength(1);
    // The return page again (a reload) shows the same recap and credits nothing more.
    expect(await (await fetch(paid.headers.get('location')!)).text()).toContain('Payment received');
    expect(await creditsOf(s.id)).toBe(1);
  });

  it('a top-up whose events come after the redirect: the return credits, the late events change nothing', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    started.stripeApi.setWebhookTiming('held');
    const page = await toStripe(s.token, { amount: '7.25' });
    const paid = await payOnStripe(page, '4242424242424242');
    expect(await customerOf(s.id)).toBeNull();
    expect(await (await fetch(paid.headers.get('location')!)).text()).toContain('7.25 USD');
    const customer = (await customerOf(s.id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('7.25'));

    expect(resultsOf(await started.stripeApi.deliverHeld())).toEqual(['payment_intent.succeeded: unchanged', 'checkout.session.completed: unchanged']);
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('7.25'));
    expect(await creditsOf(s.id)).toBe(1);
  });

  it("a declined card on Stripe's page is not the payment's end: its failure event changes nothing and the next card pays, once", async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const page = await toStripe(s.token, { amount: '5' });
    const declined = await payOnStripe(page, '4000000000000002');
    expect(declined.status).toBe(402);
    expect(await declined.text()).toContain('Your card was declined.');
    expect(resultsOf(started.stripeApi.deliveries.slice(-1))).toEqual(['payment_intent.payment_failed: unchanged']);
    expect((await paymentsOf(s.id)).map((p) => p.status)).toEqual(['requires_action']);
    expect(await customerOf(s.id)).toBeNull();

    const paid = await payOnStripe(page, '4242424242424242');
    expect(paid.status).toBe(303);
    const customer = (await customerOf(s.id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('5'));
    expect(await creditsOf(s.id)).toBe(1);
  });

  it('going back from Stripe and paying again closes the first Stripe page (not counted as a decline); only the second pays', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const first = await toStripe(s.token, { amount: '3' });
    expect(stripeSessionOf(first).cancel_url).toBe(`${base}/checkout?token=${encodeURIComponent(s.token)}`);
    // The expiry's event is held, so that it comes after the closing (as it may).
    started.stripeApi.setWebhookTiming('held');
    const second = await toStripe(s.token, { amount: '4' });
    expect(stripeSessionOf(first).status).toBe('expired');
    expect((await fetch(first)).status).toBe(410);
    const rows = await paymentsOf(s.id);
    expect(rows.map((p) => [p.status, p.failure_reason])).toEqual([
      ['failed', HOSTED_CHECKOUT_CLOSED],
      ['requires_action', null],
    ]);
    // The expiry event of the first page changes nothing.
    expect(resultsOf(await started.stripeApi.deliverHeld())).toEqual(['checkout.session.expired: unchanged']);
    started.stripeApi.setWebhookTiming('immediate');
    await payOnStripe(second, '4242424242424242');
    const customer = (await customerOf(s.id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('4'));
  });

  it('a Stripe page that expires unpaid frees the session by its event, without counting as a decline; the next attempt pays', async () => {
    const s = await session({ checkout_mode: 'onboarding' });
    const first = await toStripe(s.token, { amount: '6' });
    started.stripeApi.setWebhookTiming('held');
    started.stripeApi.expireCheckoutSession(stripeSessionOf(first).id);
    expect(resultsOf(await started.stripeApi.deliverHeld())).toEqual(['checkout.session.expired: failed']);
    expect((await paymentsOf(s.id)).map((p) => [p.status, p.failure_reason])).toEqual([['failed', HOSTED_CHECKOUT_CLOSED]]);
    // Stripe's page sends nobody back once expired; a return anyway says nothing was charged.
    const back = await fetch(`${base}/checkout/return?token=${encodeURIComponent(s.token)}`);
    expect(await back.text()).toContain('Nothing was charged');
    started.stripeApi.setWebhookTiming('immediate');
    const second = await toStripe(s.token, { amount: '6' });
    expect((await payOnStripe(second, '4242424242424242')).status).toBe(303);
    expect((await walletBuckets(started.storage, (await customerOf(s.id))!.wallet_id)).prepaid).toBe(parseMoney('6'));
  });

  it('a downgrade, with nothing to pay now, goes through a Stripe setup page: the card is saved by a SetupIntent and the change is scheduled', async () => {
    const pro = (await api('POST', '/v1/plans', { name: 'Large', period_amount: '30', billing_interval: 'month' })).body;
    const small = (await api('POST', '/v1/plans', { name: 'Small', period_amount: '5', billing_interval: 'month' })).body;
    const subscribe = await session({ checkout_mode: 'subscription', plan_id: pro.plan_id });
    await payOnStripe(await toStripe(subscribe.token), '4242424242424242');
    const customerId = (await customerOf(subscribe.id))!.id;

    const downgrade = await session({ checkout_mode: 'subscription', plan_id: small.plan_id, customer_id: customerId });
    const page = await toStripe(downgrade.token);
    const sent = started.stripeApi.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!;
    expect(sent.params).toMatchObject({ mode: 'setup', currency: 'usd', 'setup_intent_data[metadata][tollgate_payment_id]': expect.stringMatching(/^pay/) });
    expect(sent.params['line_items[0][price_data][unit_amount]']).toBeUndefined();
    expect(await (await fetch(page)).text()).toContain('Save card');
    const saved = await payOnStripe(page, '4000000000000341');
    expect(await (await fetch(saved.headers.get('location')!)).text()).toContain('Payment received');

    const [payment] = await paymentsOf(downgrade.id);
    expect(payment).toMatchObject({ status: 'succeeded', amount: 0n, provider_ref: expect.stringMatching(/^seti_/) });
    const methods = await started.storage.db.selectFrom('payment_methods').select('label').where('connection_id', '=', customerId).orderBy('id').execute();
    expect(methods.map((m) => m.label)).toEqual(['Visa ending 4242', 'Visa ending 0341']);
    const { subscription } = (await api('GET', `/v1/customers/${customerId}/subscription`)).body;
    expect(subscription).toMatchObject({ plan_id: pro.plan_id, pending_change: { type: 'downgrade' } });
  });

  it('with the return and the events both lost, the reconciliation leaves an open Stripe page alone and credits it once paid', async () => {
    const s = await session({ checkout_mode: 'topup', customer_id: (await api('POST', '/v1/customers', { reference_id: `recon-${dialect}` })).body.customer_id });
    started.stripeApi.setWebhookTiming('held');
    const page = await toStripe(s.token, { amount: '8' });
    const deps = { storage: started.storage, payments: createPaymentProvider(started.config), clock, commerceState: new CommerceState() };
    const reconcile = () => reconcilePayments(deps, (row) => presentCustomer(row, dateOf(clock)), new Date(clock.now() + RECONCILE_AFTER_MS + 1));
    await reconcile();
    expect((await paymentsOf(s.id)).map((p) => p.status)).toEqual(['requires_action']);

    // Paid on Stripe's page; the customer closes the window before the return.
    expect((await payOnStripe(page, '4242424242424242')).status).toBe(303);
    await reconcile();
    const customer = (await customerOf(s.id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('8'));
    expect(resultsOf(await started.stripeApi.deliverHeld())).toEqual(['payment_intent.succeeded: unchanged', 'checkout.session.completed: unchanged']);
    expect(await (await fetch(`${base}/checkout/return?token=${encodeURIComponent(s.token)}`)).text()).toContain('Payment received');
    expect(await creditsOf(s.id)).toBe(1);
  });

  it('a subscription through 3-D Secure on Stripe: a failed authentication pays nothing, a completed one subscribes; the saved card renews off-session', async () => {
    const plan = (await api('POST', '/v1/plans', { name: 'Pro', period_amount: '9.99', included_credit: '12', billing_interval: 'month' })).body;
    const s = await session({ checkout_mode: 'subscription', plan_id: plan.plan_id, reference_id: `order-${dialect}` });
    const page = await toStripe(s.token, { name: 'Grace Hopper' });
    expect(started.stripeApi.requests.filter((r) => r.path === '/v1/checkout/sessions').at(-1)!.params['line_items[0][price_data][product_data][name]']).toBe('Pro subscription, first month');

    const challenge = await payOnStripe(page, '4000002500003155');
    expect(await challenge.text()).toContain('Complete authentication');
    const failed = await post(`${page}/authenticate`, { card: '4000002500003155', action: 'fail' });
    expect(failed.status).toBe(402);
    expect(await customerOf(s.id)).toBeNull();
    await payOnStripe(page, '4000002500003155');
    const done = await post(`${page}/authenticate`, { card: '4000002500003155', action: 'complete' });
    expect(done.status).toBe(303);
    expect(await (await fetch(done.headers.get('location')!)).text()).toContain('Payment received');

    const shown = (await api('GET', `/v1/checkout_sessions/${s.id}`)).body;
    const { subscription } = (await api('GET', `/v1/customers/${shown.customer_id}/subscription`)).body;
    expect(subscription).toMatchObject({ status: 'active', plan_id: plan.plan_id, credits: { cycle_remaining: '12.0000000000' } });

    const engine = { storage: started.storage, payments: createPaymentProvider(started.config), clock };
    const results = await renewDueSubscriptions(engine, new Date(subscription.cycle_end_at));
    expect(results.filter((r) => r.subscriptionId === subscription.subscription_id).map((r) => r.outcome)).toEqual(['renewed']);
    const offSession = started.stripeApi.requests.filter((r) => r.path === '/v1/payment_intents').at(-1)!;
    expect(offSession.params).toMatchObject({ amount: '999', off_session: 'true', confirm: 'true', customer: stripeSessionOf(page).customer });
  });

  it('a card whose issuer asks for authentication on every payment: the renewal fails off-session in a stated way, its PaymentIntent cancelled', async () => {
    const plan = (await api('POST', '/v1/plans', { name: 'Team', period_amount: '20', billing_interval: 'month' })).body;
    const s = await session({ checkout_mode: 'subscription', plan_id: plan.plan_id });
    const page = await toStripe(s.token);
    await payOnStripe(page, '4000002760003184');
    const done = await post(`${page}/authenticate`, { card: '4000002760003184', action: 'complete' });
    expect(await (await fetch(done.headers.get('location')!)).text()).toContain('Payment received');
    const shown = (await api('GET', `/v1/checkout_sessions/${s.id}`)).body;
    const { subscription } = (await api('GET', `/v1/customers/${shown.customer_id}/subscription`)).body;

    const engine = { storage: started.storage, payments: createPaymentProvider(started.config), clock };
    const results = await renewDueSubscriptions(engine, new Date(subscription.cycle_end_at));
    expect(results.filter((r) => r.subscriptionId === subscription.subscription_id).map((r) => r.outcome)).toEqual(['past_due']);
    const renewal = await started.storage.db.selectFrom('payments').selectAll().where('purpose', '=', 'renewal').where('reference', 'like', `${subscription.subscription_id}:%`).executeTakeFirstOrThrow();
    expect(renewal).toMatchObject({ status: 'failed', failure_reason: AUTHENTICATION_REQUIRED });
    expect(started.stripeApi.intents.get(renewal.provider_ref!)?.status).toBe('canceled');
    const failedEvents = (await eventsOfType(started.storage, 'subscription.payment_failed')).filter((e) => e.data.subscription_id === subscription.subscription_id);
    expect(failedEvents).toHaveLength(1);
  });
});
