import { Lava } from '@lavapayments/nodejs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { checkResponsesAgainstOpenApi } from '../helpers/openapi-responses.ts';

/** The published client (`@lavapayments/nodejs` 11.2) driving plans, credit bundles, subscriptions and checkout. */
describe.each(databasesUnderTest())('published Lava client: commerce on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  const client = (key: string) => new Lava(key, { baseUrl: `${base}/v1/` });

  beforeAll(async () => {
    t = await startTestApp(dialect);
    base = await t.listen();
  });
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
  afterAll(async () => t?.close());
  checkResponsesAgainstOpenApi(() => t);

  it('creates, lists, retrieves, updates and deletes plans, and reads their credit bundles', async () => {
    const m = await t.newMerchant();
    const lava = client(m.secretKey);
    const meter = await lava.meters.create({ name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '2' }] });

    const plan = await lava.subscriptions.createPlan({
      name: 'Starter',
      period_amount: '9.99',
      billing_interval: 'month',
      rollover_type: 'none',
      meter_ids: [meter.meter_id],
      credit_bundles: [{ name: 'Boost', cost: '5', credit_amount: '6' }],
      default_auto_top_up_bundle_index: 0,
    });
    expect(plan).toMatchObject({
      name: 'Starter',
      period_amount: '9.9900000000',
      included_credit: '9.9900000000',
      rollover_type: 'none',
      bundle_rollover_type: 'full',
      linked_meters: [{ meter_id: meter.meter_id, name: 'Tokens' }],
      credit_bundles: [{ name: 'Boost', cost: '5.0000000000', credit_amount: '6.0000000000' }],
    });
    const boostId = plan.credit_bundles[0]!.credit_bundle_id;
    expect(plan.default_auto_top_up_bundle_id).toBe(boostId);

    expect(await lava.subscriptions.retrievePlan(plan.plan_id)).toEqual(plan);
    expect((await lava.subscriptions.listPlans()).data.map((p) => p.plan_id)).toEqual([plan.plan_id]);

    const updated = await lava.subscriptions.updatePlan(plan.plan_id, {
      name: 'Starter v2',
      included_credit: '12',
      credit_bundles: [{ name: 'Mega', cost: '20', credit_amount: '25' }],
      default_auto_top_up_bundle_id: null,
    });
    expect(updated).toMatchObject({ name: 'Starter v2', included_credit: '12.0000000000', default_auto_top_up_bundle_id: null });
    expect(updated.credit_bundles.map((b) => b.name)).toEqual(['Boost', 'Mega']);

    const bundles = await lava.creditBundles.list({ plan_id: plan.plan_id });
    expect(bundles.data.map((b) => b.name)).toEqual(['Mega', 'Boost']);
    expect(await lava.creditBundles.retrieve(boostId)).toMatchObject({ credit_bundle_id: boostId, plan_id: plan.plan_id, cost: '5.0000000000' });

    expect(await lava.subscriptions.deletePlan(plan.plan_id)).toEqual({ id: plan.plan_id, deleted: true });
    await expect(lava.subscriptions.retrievePlan(plan.plan_id)).rejects.toThrow(/404/);
  });

  it('subscribes a customer to a free plan, lists, updates, reads and cancels the subscription', async () => {
    const m = await t.newMerchant();
    const lava = client(m.secretKey);
    const plan = await lava.subscriptions.createPlan({
      name: 'Free tier',
      period_amount: '0',
      included_credit: '1.5',
      billing_interval: 'week',
      credit_bundles: [{ name: 'Top-up', cost: '3', credit_amount: '3' }],
    });
    const customer = await lava.customers.create({ name: 'Ada Lovelace', email: 'ada@example.com' });
    expect(await lava.customers.getSubscription(customer.customer_id)).toEqual({ subscription: null });

    const { subscription } = await lava.subscriptions.create({ customer_id: customer.customer_id, plan_id: plan.plan_id });
    expect(subscription).toMatchObject({
      plan_id: plan.plan_id,
      status: 'active',
      credits: { total_remaining: '1.5000000000', cycle_remaining: '1.5000000000', bundle_remaining: '0.0000000000' },
      pending_change: null,
    });

    // The customer object names its subscription.
    expect((await lava.customers.retrieve(customer.customer_id)).subscription).toEqual({
      subscription_id: subscription.subscription_id,
      plan_id: plan.plan_id,
      name: 'Free tier',
      status: 'active',
    });

    const bundleId = plan.credit_bundles[0]!.credit_bundle_id;
    expect(await lava.subscriptions.update(subscription.subscription_id, { auto_top_up_bundle_id: bundleId })).toEqual({ success: true });
    const listed = await lava.subscriptions.list({ customer_id: customer.customer_id });
    expect(listed.data).toHaveLength(1);
    expect(listed.data[0]).toMatchObject({
      subscription_id: subscription.subscription_id,
      customer_id: customer.customer_id,
      auto_top_up_bundle_id: bundleId,
      customer: { email: 'ada@example.com', first_name: 'Ada', last_name: 'Lovelace' },
    });

    expect(await lava.subscriptions.cancel(subscription.subscription_id)).toEqual({ success: true });
    const current = await lava.customers.getSubscription(customer.customer_id);
    expect(current.subscription?.pending_change).toEqual({ type: 'cancellation', effective_at: subscription.cycle_end_at });
    expect((await lava.subscriptions.list({ status: 'cancelled' })).data).toEqual([]);
    await expect(lava.subscriptions.create({ customer_id: customer.customer_id, plan_id: plan.plan_id })).rejects.toThrow(/409.*subscription_exists/);
  });

  it('creates subscription and credit bundle checkout sessions whose token names this server', async () => {
    const m = await t.newMerchant();
    const lava = client(m.secretKey);
    const plan = await lava.subscriptions.createPlan({ name: 'Paid', period_amount: '5', billing_interval: 'month', credit_bundles: [{ name: 'More', cost: '1', credit_amount: '1' }] });
    const session = await lava.checkoutSessions.create({ checkout_mode: 'subscription', origin_url: 'https://app.example.com', plan_id: plan.plan_id });
    expect(session).toMatchObject({ checkout_mode: 'subscription', origin_url: 'https://app.example.com', plan_id: plan.plan_id, completed_at: null });
    expect(JSON.parse(Buffer.from(session.checkout_session_token, 'base64').toString())).toEqual({ secret: expect.stringMatching(/^css_/), base: `${base}/` });
    const page = await fetch(`${base}/checkout?token=${encodeURIComponent(session.checkout_session_token)}`);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('Subscribe to Paid');

    const customer = await lava.customers.create({});
    const bundleId = plan.credit_bundles[0]!.credit_bundle_id;
    // A customer not on the bundle's plan cannot buy it.
    await expect(
      lava.checkoutSessions.create({ checkout_mode: 'credit_bundle', origin_url: 'https://app.example.com', customer_id: customer.customer_id, credit_bundle_id: bundleId }),
    ).rejects.toThrow(/400.*credit_bundle_id/);

    // A customer on the plan can: the session is for that customer and bundle.
    const free = await lava.subscriptions.createPlan({ name: 'Free with bundles', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'Small', cost: '2', credit_amount: '2' }] });
    const subscriber = await lava.customers.create({});
    await lava.subscriptions.create({ customer_id: subscriber.customer_id, plan_id: free.plan_id });
    const small = free.credit_bundles[0]!.credit_bundle_id;
    const bundleSession = await lava.checkoutSessions.create({ checkout_mode: 'credit_bundle', origin_url: 'https://app.example.com', customer_id: subscriber.customer_id, credit_bundle_id: small });
    expect(bundleSession).toMatchObject({ checkout_mode: 'credit_bundle', customer_id: subscriber.customer_id, credit_bundle_id: small, completed_at: null });
  });

  it('changes a subscriber\'s plan through checkoutSessions.create: Free → paid at payment, a downgrade pending to the cycle\'s end and applied by the renewal', async () => {
    const m = await t.newMerchant();
    const lava = client(m.secretKey);
    const free = await lava.subscriptions.createPlan({ name: 'Free', period_amount: '0', included_credit: '1', billing_interval: 'month' });
    const pro = await lava.subscriptions.createPlan({ name: 'Pro', period_amount: '20', included_credit: '25', billing_interval: 'month', credit_bundles: [{ name: 'Boost', cost: '5', credit_amount: '5' }] });
    const basic = await lava.subscriptions.createPlan({ name: 'Basic', period_amount: '8', included_credit: '8', billing_interval: 'month' });
    const customer = await lava.customers.create({ name: 'Grace Hopper' });
    const { subscription } = await lava.subscriptions.create({ customer_id: customer.customer_id, plan_id: free.plan_id });
    const payPage = (token: string) =>
      fetch(`${base}/checkout/pay`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams({ token, card_number: TEST_CARDS.succeeds }) });

    // Free → Pro: the session is for the subscriber; paying it upgrades the same subscription now.
    const up = await lava.checkoutSessions.create({ checkout_mode: 'subscription', origin_url: 'https://app.example.com', customer_id: customer.customer_id, plan_id: pro.plan_id });
    expect(up).toMatchObject({ customer_id: customer.customer_id, plan_id: pro.plan_id, completed_at: null });
    expect((await payPage(up.checkout_session_token)).status).toBe(200);
    const upgraded = (await lava.customers.getSubscription(customer.customer_id)).subscription!;
    expect(upgraded).toMatchObject({ subscription_id: subscription.subscription_id, plan_id: pro.plan_id, status: 'active', pending_change: null, credits: { cycle_remaining: '26.0000000000' } });
    expect((await lava.customers.retrieve(customer.customer_id)).subscription).toMatchObject({ plan_id: pro.plan_id, name: 'Pro' });
    expect(await lava.subscriptions.update(subscription.subscription_id, { auto_top_up_bundle_id: pro.credit_bundles[0]!.credit_bundle_id })).toEqual({ success: true });

    // Pro → Basic: nothing to pay now; shown as the client's pending change.
    const down = await lava.checkoutSessions.create({ checkout_mode: 'subscription', origin_url: 'https://app.example.com', customer_id: customer.customer_id, plan_id: basic.plan_id });
    expect((await payPage(down.checkout_session_token)).status).toBe(200);
    const pending = (await lava.customers.getSubscription(customer.customer_id)).subscription!;
    expect(pending.plan_id).toBe(pro.plan_id);
    expect(pending.pending_change).toEqual({ type: 'downgrade', effective_at: upgraded.cycle_end_at, plan_id: basic.plan_id, name: 'Basic', period_amount: '8.0000000000', included_credit: '8.0000000000' });

    // The test clock moves past the cycle's end; the renewal charges Basic and applies it.
    t.clock.advance(new Date(upgraded.cycle_end_at!).getTime() - dateOf(t.clock).getTime() + 1000);
    await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, dateOf(t.clock));
    const renewed = (await lava.subscriptions.list({ customer_id: customer.customer_id })).data[0]!;
    expect(renewed).toMatchObject({ subscription_id: subscription.subscription_id, plan_id: basic.plan_id, pending_change: null, cycle_start_at: upgraded.cycle_end_at });
    // Pro's bundle is not Basic's: the auto top-up bundle gives way to Basic's default (none).
    expect(renewed.auto_top_up_bundle_id).toBeNull();
    expect(t.payments.charges.at(-1)).toMatchObject({ amount: 80_000_000_000n, status: 'succeeded' });

    expect(await lava.subscriptions.cancel(subscription.subscription_id)).toEqual({ success: true });
    expect((await lava.customers.getSubscription(customer.customer_id)).subscription?.pending_change).toMatchObject({ type: 'cancellation' });
  });
});
