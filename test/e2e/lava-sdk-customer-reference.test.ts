import { Lava } from '@lavapayments/nodejs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS, type MockGateway } from '../helpers/gateway.ts';
import { until } from '../helpers/until.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

type CheckoutParams = Parameters<Lava['checkoutSessions']['create']>[0];
type Json = Record<string, unknown>;
/** Tollgate's customer also carries its wallet (the older connection shape), beyond the client's type. */
const walletOf = (customer: object) => (customer as { wallet: { wallet_id: string } }).wallet.wallet_id;

/**
 * Customers by reference, through the published client (`@lavapayments/nodejs` 11.2): create is
 * idempotent on `reference_id`, and a reference_id goes wherever a customer id does — in paths
 * (both vocabularies), bodies, filters and the forward token.
 */
describe.each(databasesUnderTest())('published Lava client: customers by reference_id on %s', (dialect) => {
  let g: MockGateway;
  let lava: Lava;
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${g.base}/v1/${path}`, {
      method,
      headers: { ...g.t.auth(), 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return { status: res.status, body: (await res.json()) as Json };
  };
  const pay = async (token: string, form: Record<string, string>) => {
    const res = await fetch(`${g.base}/checkout/pay`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ token, card_number: '4242424242424242', ...form }).toString(),
    });
    return { status: res.status, body: await res.text() };
  };
  const customersWithReference = async (reference: string) => (await lava.customers.list({ limit: 100 })).data.filter((c) => c.reference_id === reference);

  beforeAll(async () => {
    g = await startGatewayOnMock(dialect, { ...THREE_PROVIDERS, env: { RATE_LIMIT_PER_MINUTE: '100000' } });
    lava = new Lava(g.t.merchant.secretKey, { baseUrl: `${g.base}/v1/` });
  });
  afterEach(async () => {
    expect((await verifyLedger(g.t.storage)).problems).toEqual([]);
  });
  afterAll(async () => {
    await g?.t.close();
    await g?.upstream.close();
  });
  checkResponsesAgainstOpenApi(() => g.t);

  it('create is idempotent on reference_id: the second create answers the same customer, unchanged, with 200', async () => {
    const first = await lava.customers.create({ reference_id: 'user-42', name: 'Ada Lovelace', email: 'ada@example.com' });
    const second = await lava.customers.create({ reference_id: 'user-42', name: 'Someone Else', email: 'else@example.com' });
    expect(second).toEqual(first);
    expect(await customersWithReference('user-42')).toHaveLength(1);
    const raw = await api('POST', 'customers', { reference_id: 'user-42' });
    expect(raw).toEqual({ status: 200, body: first });
    const fresh = await api('POST', 'customers', { reference_id: 'user-43' });
    expect(fresh.status).toBe(201);
  });

  it('concurrent creates with one reference_id make one customer and all answer it', async () => {
    const answers = await Promise.all(Array.from({ length: 8 }, () => lava.customers.create({ reference_id: 'ref-race' })));
    expect(new Set(answers.map((c) => c.customer_id)).size).toBe(1);
    expect(await customersWithReference('ref-race')).toHaveLength(1);
  });

  it('retrieves, updates, credits, reads the subscription of and deletes a customer by reference_id, in both vocabularies', async () => {
    const c = await lava.customers.create({ reference_id: 'ref-paths', name: 'Grace Hopper' });
    expect(await lava.customers.retrieve('ref-paths')).toEqual(c);
    expect((await api('GET', 'connections/ref-paths')).body).toMatchObject({ connection_id: c.customer_id, reference_id: 'ref-paths' });
    expect(await lava.customers.update('ref-paths', { phone: '+15550101' })).toMatchObject({ customer_id: c.customer_id, contact: { phone: '+15550101' } });
    expect(await lava.customers.getSubscription('ref-paths')).toEqual({ subscription: null });
    const credit = await api('POST', 'customers/ref-paths/credits', { amount: '2.5' });
    expect(credit).toMatchObject({ status: 201, body: { customer_id: c.customer_id, balance: '2.5000000000' } });

    expect(await lava.customers.delete('ref-paths')).toEqual({ success: true });
    await expect(lava.customers.retrieve('ref-paths')).rejects.toThrow(/^Lava API Error: 404 /);
    expect((await api('DELETE', 'connections/ref-paths')).status).toBe(404);
    // Deleting frees the reference: a new customer may take it.
    const again = await lava.customers.create({ reference_id: 'ref-paths' });
    expect(again.customer_id).not.toBe(c.customer_id);
    expect((await api('GET', 'connections/ref-paths')).body).toMatchObject({ connection_id: again.customer_id });
  });

  it('refuses a reference_id shaped like a customer id, so a value names one or the other', async () => {
    await expect(lava.customers.create({ reference_id: 'con_lookalike' })).rejects.toThrow(/^Lava API Error: 400 .*"path":\["reference_id"\]/);
    const c = await lava.customers.create({});
    await expect(lava.customers.update(c.customer_id, { reference_id: 'con_lookalike' })).rejects.toThrow(/^Lava API Error: 400 .*"path":\["reference_id"\]/);
  });

  it('takes a reference_id for the customer of subscriptions, checkout sessions, spend keys, recorded requests, filters and the forward token', async () => {
    const c = await lava.customers.create({ reference_id: 'ref-everywhere' });
    await creditWallet(g.t.storage, walletOf(c), parseMoney('5'), new Date().toISOString());
    const meter = await lava.meters.create({ name: 'By reference', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '1' }] });

    const plan = await lava.subscriptions.createPlan({ name: 'Free by ref', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'B', cost: '1', credit_amount: '1' }] });
    const { subscription } = await lava.subscriptions.create({ customer_id: 'ref-everywhere', plan_id: plan.plan_id });
    expect((await lava.subscriptions.list({ customer_id: 'ref-everywhere' })).data.map((s) => s.subscription_id)).toEqual([subscription.subscription_id]);
    expect((await api('GET', 'subscriptions?connection_id=ref-everywhere')).body.data).toHaveLength(1);

    const session = await lava.checkoutSessions.create({
      checkout_mode: 'credit_bundle',
      origin_url: 'https://shop.example.com',
      customer_id: 'ref-everywhere',
      credit_bundle_id: plan.credit_bundles[0]!.credit_bundle_id,
    });
    expect(session.customer_id).toBe(c.customer_id);
    const topup = await api('POST', 'checkout_sessions', { checkout_mode: 'topup', origin_url: 'https://shop.example.com', connection_id: 'ref-everywhere' });
    expect(topup.body).toMatchObject({ connection_id: c.customer_id });

    const key = await api('POST', 'spend_keys', { name: 'For ref', customer_id: 'ref-everywhere' });
    expect(key.body).toMatchObject({ wallet_id: walletOf(c), customer_id: c.customer_id });

    const recorded = await lava.requests.create({ request_id: 'ref-req-1', customer_id: 'ref-everywhere', meter_slug: meter.meter_slug, input_tokens: 600, output_tokens: 400 });
    expect(recorded).toMatchObject({ customer_id: c.customer_id, status: 'completed' });

    await lava.gateway('https://api.openai.com/v1/chat/completions', {
      customer_id: 'ref-everywhere',
      meter_slug: meter.meter_slug,
      body: { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] },
    });
    const listed = await until(async () => {
      const page = await lava.requests.list({ customer_id: 'ref-everywhere' });
      return page.data.length === 2 && page.data.every((r) => r.status === 'completed') && page;
    }, 'both requests to be listed as completed');
    expect(listed.data.map((r) => r.customer_id)).toEqual([c.customer_id, c.customer_id]);
    expect((await api('GET', 'requests?connection_id=ref-everywhere')).body.data).toHaveLength(2);

    const today = new Date(g.t.clock.now()).toISOString().slice(0, 10);
    const usage = await lava.usage.retrieve({ start: today, customer_id: 'ref-everywhere' });
    expect(usage.totals.total_requests).toBe(2);
    // A reference nobody has filters to nothing, as an unknown id does.
    expect((await lava.requests.list({ customer_id: 'nobody-has-this' })).data).toEqual([]);
  });

  it('an onboarding checkout whose reference_id a customer has is that customer’s from creation: paying funds it, creates nobody', async () => {
    const existing = await lava.customers.create({ reference_id: 'onb-taken' });
    const session = await lava.checkoutSessions.create({ checkout_mode: 'onboarding', origin_url: 'https://shop.example.com', reference_id: 'onb-taken' } as unknown as CheckoutParams);
    expect(session.customer_id).toBe(existing.customer_id);
    const paid = await pay(session.checkout_session_token, { amount: '7' });
    expect(paid.status, paid.body).toBe(200);
    expect((await findWallet(g.t.storage, walletOf(existing)))!.balance).toBe(parseMoney('7'));
    expect(await customersWithReference('onb-taken')).toHaveLength(1);
  });

  it('an onboarding checkout whose reference_id a customer takes after the session was made still completes, for that customer', async () => {
    const session = await lava.checkoutSessions.create({ checkout_mode: 'onboarding', origin_url: 'https://shop.example.com', reference_id: 'onb-late' } as unknown as CheckoutParams);
    expect(session.customer_id).toBeNull();
    const late = await lava.customers.create({ reference_id: 'onb-late' });
    const paid = await pay(session.checkout_session_token, { amount: '3', name: 'Late Payer' });
    expect(paid.status, paid.body).toBe(200);
    expect(paid.body).toContain('Payment received');
    expect((await findWallet(g.t.storage, walletOf(late)))!.balance).toBe(parseMoney('3'));
    expect(await customersWithReference('onb-late')).toHaveLength(1);
    expect((await api('GET', `checkout_sessions/${session.checkout_session_id}`)).body).toMatchObject({ connection_id: late.customer_id });
  });

  it('a subscription checkout for a reference_id whose customer is subscribed is that customer\'s plan change, decided at creation; its current plan is refused before anybody pays', async () => {
    const plan = await lava.subscriptions.createPlan({ name: 'Free taken', period_amount: '0', billing_interval: 'month' });
    const paid = await lava.subscriptions.createPlan({ name: 'Paid taken', period_amount: '4', billing_interval: 'month' });
    const c = await lava.customers.create({ reference_id: 'sub-taken' });
    await lava.subscriptions.create({ customer_id: c.customer_id, plan_id: plan.plan_id });
    const upgrade = await api('POST', 'checkout_sessions', { checkout_mode: 'subscription', origin_url: 'https://shop.example.com', plan_id: paid.plan_id, reference_id: 'sub-taken' });
    expect(upgrade).toMatchObject({ status: 201, body: { customer_id: c.customer_id, plan_id: paid.plan_id } });
    const refused = await api('POST', 'checkout_sessions', { checkout_mode: 'subscription', origin_url: 'https://shop.example.com', plan_id: plan.plan_id, reference_id: 'sub-taken' });
    expect(refused).toMatchObject({ status: 409, body: { error: { code: 'subscription_exists' } } });
  });
});
