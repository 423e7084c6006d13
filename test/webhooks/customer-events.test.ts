import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('customer events on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const eventsOf = async (merchantId: string) =>
    (await t.storage.db.selectFrom('events').selectAll().where('merchant_id', '=', merchantId).orderBy('id').execute()).map((e) => ({
      type: e.type,
      data: JSON.parse(e.payload),
      created_at: e.created_at,
    }));

  it('writes customer.created with the customer as GET /v1/customers/{id} shows it', async () => {
    const m = await t.newMerchant();
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/customers',
      headers: t.auth(m.secretKey),
      payload: { name: 'Ada Lovelace', email: 'ada@example.com', reference_id: 'u-1', metadata: { plan: 'pro' } },
    });
    const customer = res.json();
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/customers/${customer.customer_id}`, headers: t.auth(m.secretKey) })).json();
    const events = await eventsOf(m.merchantId);
    expect(events).toHaveLength(1);
    expect(events[0]).toEqual({ type: 'customer.created', data: shown, created_at: customer.created_at });
  });

  it('writes customer.deleted carrying the customer as the deletion left it, without the erased details', async () => {
    const m = await t.newMerchant();
    const customer = (
      await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(m.secretKey), payload: { email: 'gone@example.com', reference_id: 'u-2' } })
    ).json();
    await t.app.inject({ method: 'DELETE', url: `/v1/customers/${customer.customer_id}`, headers: t.auth(m.secretKey) });
    const events = await eventsOf(m.merchantId);
    expect(events.map((e) => e.type)).toEqual(['customer.created', 'customer.deleted']);
    const deleted = events[1]!.data;
    expect(deleted).toMatchObject({ customer_id: customer.customer_id, reference_id: 'u-2', contact: { email: null } });
    expect(JSON.stringify(deleted)).not.toContain('gone@example.com');
    // Deleting again finds nothing and emits nothing more.
    await t.app.inject({ method: 'DELETE', url: `/v1/customers/${customer.customer_id}`, headers: t.auth(m.secretKey) });
    expect(await eventsOf(m.merchantId)).toHaveLength(2);
  });

  it("writes customer.deleted with the subscription the customer had, as the customer object showed it; null without one", async () => {
    const m = await t.newMerchant();
    const api = (method: 'POST' | 'GET' | 'DELETE', url: string, payload?: Record<string, unknown>) =>
      t.app.inject({ method, url, headers: t.auth(m.secretKey), ...(payload ? { payload } : {}) });
    const plan = (await api('POST', '/v1/plans', { name: 'Starter', period_amount: '0', billing_interval: 'month' })).json();
    const subscribed = (await api('POST', '/v1/customers', {})).json();
    const plain = (await api('POST', '/v1/customers', {})).json();
    const sub = (await api('POST', '/v1/subscriptions', { customer_id: subscribed.customer_id, plan_id: plan.plan_id })).json().subscription;
    const shown = (await api('GET', `/v1/customers/${subscribed.customer_id}`)).json().subscription;
    expect(shown).toEqual({ subscription_id: sub.subscription_id, plan_id: plan.plan_id, name: 'Starter', status: 'active' });

    expect((await api('DELETE', `/v1/customers/${subscribed.customer_id}`)).statusCode).toBe(200);
    expect((await api('DELETE', `/v1/customers/${plain.customer_id}`)).statusCode).toBe(200);
    const deleted = (await eventsOf(m.merchantId)).filter((e) => e.type === 'customer.deleted').map((e) => e.data);
    expect(deleted.find((d) => d.customer_id === subscribed.customer_id)!.subscription).toEqual(shown);
    expect(deleted.find((d) => d.customer_id === plain.customer_id)!.subscription).toBeNull();
  });

  it('writes no event when nothing changes: a create answered with the customer holding its reference_id, a patch refused for a taken one', async () => {
    const m = await t.newMerchant();
    const create = (payload: Record<string, unknown>) => t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(m.secretKey), payload });
    expect((await create({ reference_id: 'dup' })).statusCode).toBe(201);
    expect((await create({ reference_id: 'dup' })).statusCode).toBe(200);
    const other = (await create({})).json();
    const moved = await t.app.inject({ method: 'PATCH', url: `/v1/customers/${other.customer_id}`, headers: t.auth(m.secretKey), payload: { reference_id: 'dup' } });
    expect(moved.json().error.code).toBe('reference_id_taken');
    expect((await eventsOf(m.merchantId)).map((e) => e.type)).toEqual(['customer.created', 'customer.created']);
  });
});
