import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('subscriptions API on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const get = (url: string) => t.app.inject({ method: 'GET', url, headers: t.auth() });

  it('starts a free plan at once with its cycle credit, shown with every field', async () => {
    const plan = await createPlan(t, { name: 'Free', period_amount: '0', included_credit: '3', billing_interval: 'month', credit_bundles: [{ name: 'B', cost: '1', credit_amount: '1' }], default_auto_top_up_bundle_index: 0 });
    const { customerId, walletId } = await createCustomer(t);
    const res = await subscribe(t, customerId, plan.plan_id);
    expect(res.statusCode, res.body).toBe(201);
    const sub = res.json().subscription;
    expect(sub).toMatchObject({
      plan_id: plan.plan_id,
      customer_id: customerId,
      status: 'active',
      auto_top_up_bundle_id: plan.default_auto_top_up_bundle_id,
      cancelled_at: null,
      plan: { name: 'Free', period_amount: '0.0000000000', included_credit: '3.0000000000', billing_interval: 'month', rollover_type: 'full', bundle_rollover_type: 'full' },
      credits: { total_remaining: '3.0000000000', cycle_remaining: '3.0000000000', bundle_remaining: '0.0000000000' },
      pending_change: null,
      customer: { phone: null, email: null, first_name: null, last_name: null },
    });
    expect(sub.subscription_id).toMatch(/^sub_/);
    const start = new Date(sub.cycle_start_at);
    expect(new Date(sub.cycle_end_at).getUTCMonth()).toBe((start.getUTCMonth() + 1) % 12);
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ cycle: parseMoney('3'), prepaid: 0n });
    expect(t.payments.charges).toHaveLength(0);

    const { subscription } = (await get(`/v1/customers/${customerId}/subscription`)).json();
    expect(subscription).toMatchObject({ subscription_id: sub.subscription_id, credits: sub.credits });
    expect(subscription.customer_id).toBeUndefined();
    const created = await eventsOfType(t.storage, 'subscription.created');
    const event = created.find((e) => e.data.subscription_id === sub.subscription_id);
    // Webhook receivers get the subscription as the API lists it.
    expect(event?.data).toEqual(sub);

    const again = await subscribe(t, customerId, plan.plan_id);
    expect(again.statusCode).toBe(409);
    expect(again.json().error.code).toBe('subscription_exists');
  });

  it('the customer object shows its subscription (id, plan, plan name, status) in every read, and null once it is cancelled', async () => {
    const plan = await createPlan(t, { name: 'Starter', period_amount: '0', included_credit: '1', billing_interval: 'day' });
    const { customerId } = await createCustomer(t);
    const customer = () => get(`/v1/customers/${customerId}`).then((r) => r.json());
    expect((await customer()).subscription).toBeNull();
    const sub = (await subscribe(t, customerId, plan.plan_id)).json().subscription;
    const summary = { subscription_id: sub.subscription_id, plan_id: plan.plan_id, name: 'Starter', status: 'active' };
    expect((await customer()).subscription).toEqual(summary);
    expect((await get(`/v1/connections/${customerId}`)).json().subscription).toEqual(summary);
    const listed = (await get('/v1/customers?limit=100')).json().data.find((c: { customer_id: string }) => c.customer_id === customerId);
    expect(listed.subscription).toEqual(summary);
    const patched = await t.app.inject({ method: 'PATCH', url: `/v1/customers/${customerId}`, headers: t.auth(), payload: { email: 'a@example.com' } });
    expect(patched.json().subscription).toEqual(summary);
    // The full view agrees with the summary.
    expect((await get(`/v1/customers/${customerId}/subscription`)).json().subscription).toMatchObject({ subscription_id: sub.subscription_id, plan_id: plan.plan_id, status: 'active', plan: { name: 'Starter' } });

    expect((await t.app.inject({ method: 'DELETE', url: `/v1/subscriptions/${sub.subscription_id}`, headers: t.auth() })).statusCode).toBe(200);
    expect((await customer()).subscription).toEqual(summary);
    await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, new Date(new Date(sub.cycle_end_at).getTime() + 1000));
    expect((await customer()).subscription).toBeNull();
    expect((await get(`/v1/customers/${customerId}/subscription`)).json()).toEqual({ subscription: null });
  });

  it('charges a paid plan to the saved card once, and refuses without a card or on a decline with nothing written', async () => {
    const plan = await createPlan(t, { name: 'Pro', period_amount: '20', included_credit: '25', billing_interval: 'week' });
    const noCard = await createCustomer(t);
    const refused = await subscribe(t, noCard.customerId, plan.plan_id);
    expect(refused.statusCode).toBe(402);
    expect(refused.json().error.code).toBe('payment_method_required');

    const declining = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, declining.customerId, 'declinesLater');
    const declined = await subscribe(t, declining.customerId, plan.plan_id);
    expect(declined.statusCode).toBe(402);
    expect(declined.json().error.code).toBe('payment_failed');
    expect((await walletBuckets(t.storage, declining.walletId)).balance).toBe(0n);
    expect((await get(`/v1/customers/${declining.customerId}/subscription`)).json()).toEqual({ subscription: null });

    const paying = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, paying.customerId);
    const before = t.payments.charges.length;
    const ok = await subscribe(t, paying.customerId, plan.plan_id);
    expect(ok.statusCode, ok.body).toBe(201);
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('20'), status: 'succeeded' })]);
    expect(await walletBuckets(t.storage, paying.walletId)).toMatchObject({ cycle: parseMoney('25'), balance: parseMoney('25') });
  });

  it('sets the auto top-up bundle, schedules a plan change and a cancellation, shown as pending_change', async () => {
    const plan = await createPlan(t, { name: 'Base', period_amount: '0', billing_interval: 'day', credit_bundles: [{ name: 'B', cost: '2', credit_amount: '2' }] });
    const cheaper = await createPlan(t, { name: 'Cheaper', period_amount: '0', included_credit: '1', billing_interval: 'day' });
    const other = await createPlan(t, { name: 'Other', period_amount: '0', billing_interval: 'day', credit_bundles: [{ name: 'X', cost: '1', credit_amount: '1' }] });
    const { customerId } = await createCustomer(t);
    const sub = (await subscribe(t, customerId, plan.plan_id)).json().subscription;
    const patch = (payload: unknown) => t.app.inject({ method: 'PATCH', url: `/v1/subscriptions/${sub.subscription_id}`, headers: t.auth(), payload: payload as object });

    expect((await patch({ auto_top_up_bundle_id: plan.credit_bundles[0].credit_bundle_id })).json()).toEqual({ success: true });
    const foreign = await patch({ auto_top_up_bundle_id: other.credit_bundles[0].credit_bundle_id });
    expect(foreign.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['auto_top_up_bundle_id'] }] });

    expect((await patch({ plan_id: cheaper.plan_id })).statusCode).toBe(200);
    let shown = (await get(`/v1/subscriptions?customer_id=${customerId}`)).json().data[0];
    expect(shown.auto_top_up_bundle_id).toBe(plan.credit_bundles[0].credit_bundle_id);
    expect(shown.pending_change).toEqual({
      type: 'downgrade',
      effective_at: sub.cycle_end_at,
      plan_id: cheaper.plan_id,
      name: 'Cheaper',
      period_amount: '0.0000000000',
      included_credit: '1.0000000000',
    });

    const del = await t.app.inject({ method: 'DELETE', url: `/v1/subscriptions/${sub.subscription_id}`, headers: t.auth() });
    expect(del.json()).toEqual({ success: true });
    shown = (await get(`/v1/subscriptions?customer_id=${customerId}`)).json().data[0];
    expect(shown.status).toBe('active');
    expect(shown.pending_change).toEqual({ type: 'cancellation', effective_at: sub.cycle_end_at });
    expect((await t.app.inject({ method: 'DELETE', url: '/v1/subscriptions/sub_nope', headers: t.auth() })).statusCode).toBe(404);
  });

  it('lists by status and customer with a cursor, and keeps merchants apart', async () => {
    const m = await t.newMerchant();
    const plan = await createPlan(t, { name: 'Free', period_amount: '0', billing_interval: 'month' }, m.secretKey);
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const c = await createCustomer(t, m.secretKey);
      ids.push((await subscribe(t, c.customerId, plan.plan_id, m.secretKey)).json().subscription.subscription_id);
    }
    await t.storage.db.updateTable('subscriptions').set({ status: 'cancelled', cancelled_at: new Date().toISOString() }).where('id', '=', ids[0]!).execute();
    const list = (q: string) => t.app.inject({ method: 'GET', url: `/v1/subscriptions${q}`, headers: t.auth(m.secretKey) }).then((r) => r.json());
    expect((await list('')).data.map((s: { subscription_id: string }) => s.subscription_id)).toEqual([ids[2], ids[1]]);
    expect((await list('?status=cancelled')).data.map((s: { subscription_id: string }) => s.subscription_id)).toEqual([ids[0]]);
    const page = await list('?status=all&limit=2');
    expect(page).toMatchObject({ has_more: true, next_cursor: ids[1] });
    expect((await list(`?status=all&limit=2&cursor=${page.next_cursor}`)).data.map((s: { subscription_id: string }) => s.subscription_id)).toEqual([ids[0]]);
    expect((await get('/v1/subscriptions?status=all')).json().data.map((s: { subscription_id: string }) => s.subscription_id)).not.toContain(ids[0]);
    expect((await list('?status=paused')).error.code).toBe('validation_error');
  });
});
