import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { reconcilePayments, RECONCILE_AFTER_MS } from '../../src/commerce/reconciliation.ts';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { CommerceState } from '../../src/commerce/state.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { ProviderUnavailableError } from '../../src/payments/types.ts';
import { presentCustomer } from '../../src/services/customers.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * Plan changes of a subscriber (decision 0037), over the API and the hosted checkout page on both
 * engines: an upgrade (Free → paid included) takes effect when it is paid, with a new cycle and its
 * full credit and the old cycle's credit kept; a downgrade is a pending change applied by the
 * renewal at the cycle's end, and can be withdrawn; each change is announced by subscription.updated.
 */
describe.each(databasesUnderTest())('plan changes on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const HOUR = 60 * 60_000;
  const checkout = (payload: Record<string, unknown>) =>
    t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload: { origin_url: 'https://shop.example.com', checkout_mode: 'subscription', ...payload } });
  const pay = (token: string) =>
    t.app.inject({
      method: 'POST',
      url: '/checkout/pay',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      payload: new URLSearchParams({ token, card_number: TEST_CARDS.succeeds }).toString(),
    });
  const subscriptionOf = async (customerId: string) =>
    (await t.app.inject({ method: 'GET', url: `/v1/customers/${customerId}/subscription`, headers: t.auth() })).json().subscription;
  const updatesOf = async (subscriptionId: string) =>
    (await eventsOfType(t.storage, 'subscription.updated')).filter((e) => e.data.subscription_id === subscriptionId).map((e) => e.data.change as { type: string; status: string });

  /** A customer on a free plan with 2 of cycle credit, half a day into its cycle. */
  async function onFree() {
    const free = await createPlan(t, { name: 'Free', period_amount: '0', included_credit: '2', billing_interval: 'month' });
    const c = await createCustomer(t);
    const sub = (await subscribe(t, c.customerId, free.plan_id)).json().subscription;
    t.clock.advance(12 * HOUR);
    return { ...c, free, sub };
  }

  it('Free → paid: a subscription checkout for the subscriber upgrades it at payment, with a new cycle, the new credit and the old credit kept', async () => {
    const { customerId, walletId, free, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '20', included_credit: '25', billing_interval: 'month' });
    const created = await checkout({ customer_id: customerId, plan_id: pro.plan_id });
    expect(created.statusCode, created.body).toBe(201);
    const session = created.json();

    const page = await t.app.inject({ method: 'GET', url: `/checkout?token=${encodeURIComponent(session.checkout_session_token)}` });
    expect(page.body).toContain('Upgrade to Pro');
    expect(page.body).toContain('Pay 20.00 USD');

    const before = t.payments.charges.length;
    const paidAt = dateOf(t.clock);
    const paid = await pay(session.checkout_session_token);
    expect(paid.statusCode, paid.body).toBe(200);
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('20'), status: 'succeeded' })]);

    const now = await subscriptionOf(customerId);
    expect(now).toMatchObject({ subscription_id: sub.subscription_id, plan_id: pro.plan_id, status: 'active', pending_change: null, plan: { name: 'Pro' } });
    // The new cycle starts at the payment (the clock moved half a day since the subscription began).
    expect(new Date(now.cycle_start_at).getTime()).toBeGreaterThanOrEqual(paidAt.getTime());
    expect(now.cycle_start_at).not.toBe(sub.cycle_start_at);
    expect(new Date(now.cycle_end_at).getUTCMonth()).toBe((new Date(now.cycle_start_at).getUTCMonth() + 1) % 12);
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ cycle: parseMoney('27'), prepaid: 0n });
    expect(now.credits.cycle_remaining).toBe('27.0000000000');

    expect(await updatesOf(sub.subscription_id)).toEqual([
      { type: 'upgrade', status: 'applied', previous_plan_id: free.plan_id, plan_id: pro.plan_id, effective_at: now.cycle_start_at },
    ]);
    const completed = (await eventsOfType(t.storage, 'checkout.completed')).find((e) => e.data.checkout_session_id === session.checkout_session_id);
    expect(completed?.data).toMatchObject({ subscription_id: sub.subscription_id, customer_id: customerId });
    // One subscription, never a second one.
    const listed = (await t.app.inject({ method: 'GET', url: `/v1/subscriptions?status=all&customer_id=${customerId}`, headers: t.auth() })).json();
    expect(listed.data).toHaveLength(1);

    // The next renewal is a Pro renewal a month after the upgrade.
    const renewedAt = new Date(new Date(now.cycle_end_at).getTime() + 1000);
    await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, renewedAt);
    expect(t.payments.charges.at(-1)).toMatchObject({ amount: parseMoney('20'), status: 'succeeded' });
    expect((await subscriptionOf(customerId)).cycle_start_at).toBe(now.cycle_end_at);
  });

  it('an upgrade drops a scheduled cancellation: the customer chose a plan', async () => {
    const { customerId, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '5', billing_interval: 'month' });
    expect((await t.app.inject({ method: 'DELETE', url: `/v1/subscriptions/${sub.subscription_id}`, headers: t.auth() })).statusCode).toBe(200);
    expect((await subscriptionOf(customerId)).pending_change).toEqual({ type: 'cancellation', effective_at: sub.cycle_end_at });

    const session = (await checkout({ customer_id: customerId, plan_id: pro.plan_id })).json();
    expect((await pay(session.checkout_session_token)).statusCode).toBe(200);
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: pro.plan_id, pending_change: null });
    expect((await updatesOf(sub.subscription_id)).map((c) => `${c.type}:${c.status}`)).toEqual(['cancellation:scheduled', 'upgrade:applied']);
  });

  it('a downgrade by checkout is pending until the cycle ends, charges nothing now, can be withdrawn, and the renewal applies it', async () => {
    const basic = await createPlan(t, { name: 'Basic', period_amount: '4', included_credit: '5', billing_interval: 'month', rollover_type: 'none' });
    const pro = await createPlan(t, { name: 'Pro', period_amount: '20', included_credit: '25', billing_interval: 'month' });
    // A new customer subscribes to Pro through checkout (the card is saved for renewals).
    const first = (await checkout({ plan_id: pro.plan_id })).json();
    const subscribed = await pay(first.checkout_session_token);
    expect(subscribed.statusCode, subscribed.body).toBe(200);
    const customerId = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${first.checkout_session_id}`, headers: t.auth() })).json().customer_id;
    const sub = await subscriptionOf(customerId);
    expect(sub.plan_id).toBe(pro.plan_id);

    const down = (await checkout({ customer_id: customerId, plan_id: basic.plan_id })).json();
    const page = await t.app.inject({ method: 'GET', url: `/checkout?token=${encodeURIComponent(down.checkout_session_token)}` });
    expect(page.body).toContain('Change plan to Basic');
    expect(page.body).toContain('nothing is charged today');
    const before = t.payments.charges.length;
    expect((await pay(down.checkout_session_token)).statusCode).toBe(200);
    expect(t.payments.charges.slice(before)).toEqual([]);
    const pending = { type: 'downgrade', effective_at: sub.cycle_end_at, plan_id: basic.plan_id, name: 'Basic', period_amount: '4.0000000000', included_credit: '5.0000000000' };
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: pro.plan_id, pending_change: pending });
    const session = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${down.checkout_session_id}`, headers: t.auth() })).json();
    expect(session).toMatchObject({ subscription_id: sub.subscription_id, completed_at: expect.any(String) });

    // Withdrawn by choosing the current plan again, then scheduled once more.
    const patch = (payload: object) => t.app.inject({ method: 'PATCH', url: `/v1/subscriptions/${sub.subscription_id}`, headers: t.auth(), payload });
    expect((await patch({ plan_id: pro.plan_id })).json()).toEqual({ success: true });
    expect((await subscriptionOf(customerId)).pending_change).toBeNull();
    expect((await patch({ plan_id: basic.plan_id })).statusCode).toBe(200);
    expect((await subscriptionOf(customerId)).pending_change).toEqual(pending);

    // The cycle's end (the clock moved there): the renewal charges Basic and grants its credit; Pro's rollover (full) keeps what was left.
    t.clock.advance(new Date(sub.cycle_end_at).getTime() - dateOf(t.clock).getTime() + 1000);
    const results = await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, dateOf(t.clock));
    expect(results).toContainEqual({ subscriptionId: sub.subscription_id, outcome: 'renewed' });
    expect(t.payments.charges.at(-1)).toMatchObject({ amount: parseMoney('4'), status: 'succeeded' });
    const after = await subscriptionOf(customerId);
    expect(after).toMatchObject({ plan_id: basic.plan_id, pending_change: null, cycle_start_at: sub.cycle_end_at, credits: { cycle_remaining: '30.0000000000' } });

    expect(await updatesOf(sub.subscription_id)).toEqual([
      { type: 'downgrade', status: 'scheduled', previous_plan_id: pro.plan_id, plan_id: basic.plan_id, effective_at: sub.cycle_end_at },
      { type: 'downgrade', status: 'withdrawn', previous_plan_id: pro.plan_id, plan_id: basic.plan_id, effective_at: null },
      { type: 'downgrade', status: 'scheduled', previous_plan_id: pro.plan_id, plan_id: basic.plan_id, effective_at: sub.cycle_end_at },
      { type: 'downgrade', status: 'applied', previous_plan_id: pro.plan_id, plan_id: basic.plan_id, effective_at: sub.cycle_end_at },
    ]);
    const renewed = (await eventsOfType(t.storage, 'subscription.renewed')).find((e) => e.data.subscription_id === sub.subscription_id);
    expect(renewed?.data).toMatchObject({ plan_id: basic.plan_id, previous_plan_id: pro.plan_id });
  });

  it('a checkout for the plan the customer is on is refused before anybody pays', async () => {
    const { customerId, free } = await onFree();
    const refused = await checkout({ customer_id: customerId, plan_id: free.plan_id });
    expect(refused.statusCode).toBe(409);
    expect(refused.json().error.code).toBe('subscription_exists');
  });

  it('POST /v1/subscriptions for a subscriber changes its plan: an upgrade charged to the saved card now, a downgrade scheduled; without a card an upgrade is 402', async () => {
    const { customerId, walletId, free, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '20', included_credit: '25', billing_interval: 'month' });
    const refused = await subscribe(t, customerId, pro.plan_id);
    expect(refused.statusCode).toBe(402);
    expect(refused.json().error.code).toBe('payment_method_required');

    await saveTestCard(t.storage, t.merchant.merchantId, customerId);
    const before = t.payments.charges.length;
    const upgraded = await subscribe(t, customerId, pro.plan_id);
    expect(upgraded.statusCode, upgraded.body).toBe(200);
    expect(upgraded.json().subscription).toMatchObject({ subscription_id: sub.subscription_id, plan_id: pro.plan_id, pending_change: null, credits: { cycle_remaining: '27.0000000000' } });
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('20'), status: 'succeeded' })]);
    expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(0n);

    const downgraded = await subscribe(t, customerId, free.plan_id);
    expect(downgraded.statusCode).toBe(200);
    expect(downgraded.json().subscription).toMatchObject({ plan_id: pro.plan_id, pending_change: { type: 'downgrade', plan_id: free.plan_id } });
    expect(t.payments.charges.length).toBe(before + 1);
    expect((await subscribe(t, customerId, pro.plan_id)).statusCode).toBe(409);
    expect((await updatesOf(sub.subscription_id)).map((c) => `${c.type}:${c.status}`)).toEqual(['upgrade:applied', 'downgrade:scheduled']);
  });

  it('an upgrade paid while the renewal is charging the subscription changes nothing and is credited as prepaid funds', async () => {
    const { customerId, walletId, free, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '5', included_credit: '5', billing_interval: 'month' });
    const session = (await checkout({ customer_id: customerId, plan_id: pro.plan_id })).json();
    // A renewal claimed it (another instance, mid-charge).
    const claimedUntil = new Date(dateOf(t.clock).getTime() + 60_000).toISOString();
    await t.storage.db.updateTable('subscriptions').set({ claimed_until: claimedUntil }).where('id', '=', sub.subscription_id).execute();
    expect((await pay(session.checkout_session_token)).statusCode).toBe(200);
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: free.plan_id, cycle_start_at: sub.cycle_start_at });
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ prepaid: parseMoney('5'), cycle: parseMoney('2') });
    const done = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    expect(done).toMatchObject({ subscription_id: null, completed_at: expect.any(String) });
    expect(await updatesOf(sub.subscription_id)).toEqual([]);
  });

  it('an upgrade by POST whose provider answers nothing after charging is 503 and changes nothing; the reconciliation refunds what was taken', async () => {
    const { customerId, walletId, free, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '5', billing_interval: 'month' });
    await saveTestCard(t.storage, t.merchant.merchantId, customerId);
    t.payments.failOnce('after_charge', new ProviderUnavailableError('test', new Error('timed out after charging')));
    const res = await subscribe(t, customerId, pro.plan_id);
    expect(res.statusCode).toBe(503);
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: free.plan_id, cycle_start_at: sub.cycle_start_at });

    t.clock.advance(RECONCILE_AFTER_MS + 1);
    const deps = { storage: t.storage, payments: t.payments, clock: t.clock, commerceState: new CommerceState() };
    await reconcilePayments(deps, (row) => presentCustomer(row, dateOf(t.clock)), dateOf(t.clock));
    const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', 'like', `${sub.subscription_id}:upgrade%`).executeTakeFirstOrThrow();
    expect(payment).toMatchObject({ status: 'succeeded', failure_reason: 'cycle_closed', amount: parseMoney('5') });
    const refunds = await t.storage.db.selectFrom('refunds').select(['status', 'amount']).where('payment_id', '=', payment.id).execute();
    expect(refunds.map((r) => ({ status: r.status, amount: BigInt(r.amount) }))).toEqual([{ status: 'succeeded', amount: parseMoney('5') }]);
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: free.plan_id });
    expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(0n);
  });

  it('an upgrade by POST that never reached the provider ends not_charged at the reconciliation, and is not asked about again', async () => {
    const { customerId, free, sub } = await onFree();
    const pro = await createPlan(t, { name: 'Pro', period_amount: '5', billing_interval: 'month' });
    await saveTestCard(t.storage, t.merchant.merchantId, customerId);
    t.payments.failOnce('before_charge', new ProviderUnavailableError('test', new Error('connection refused')));
    expect((await subscribe(t, customerId, pro.plan_id)).statusCode).toBe(503);
    const upgradePayment = () => t.storage.db.selectFrom('payments').selectAll().where('reference', 'like', `${sub.subscription_id}:upgrade%`).executeTakeFirstOrThrow();
    expect(await upgradePayment()).toMatchObject({ status: 'failed', failure_reason: 'provider_unavailable' });

    t.clock.advance(RECONCILE_AFTER_MS + 1);
    const deps = { storage: t.storage, payments: t.payments, clock: t.clock, commerceState: new CommerceState() };
    const report = await reconcilePayments(deps, (row) => presentCustomer(row, dateOf(t.clock)), dateOf(t.clock));
    expect(report.notCharged).toBeGreaterThanOrEqual(1);
    const payment = await upgradePayment();
    expect(payment).toMatchObject({ status: 'failed', failure_reason: 'not_charged' });
    expect(t.payments.charges.filter((c) => c.idempotencyKey === payment.id)).toEqual([]);
    // Ended: a later round leaves it as it is.
    t.clock.advance(60_000);
    await reconcilePayments(deps, (row) => presentCustomer(row, dateOf(t.clock)), dateOf(t.clock));
    expect(await upgradePayment()).toMatchObject({ status: 'failed', failure_reason: 'not_charged', updated_at: payment.updated_at });
    expect(await subscriptionOf(customerId)).toMatchObject({ plan_id: free.plan_id });
  });
});
