import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * What the routes stamp with a time reads the app's clock (AppDeps.clock), not the system's:
 * records of POST /requests, idempotency claims and their 24 h of replays, webhooks and their
 * secret rotations. The test clock is moved a year ahead, so a wall-clock stamp would show.
 */
describe.each(databasesUnderTest())("routes stamp times from the app's clock on %s", (dialect) => {
  let t: TestApp;
  const YEAR_MS = 366 * 86_400_000;

  beforeAll(async () => {
    t = await startTestApp(dialect, { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    t.clock.advance(YEAR_MS);
  });
  afterAll(async () => {
    await t?.close();
  });

  /** Within a minute of the app's clock, which is a year past the system's. */
  const expectAppTime = (iso: string) => expect(Math.abs(Date.parse(iso) - t.clock.now())).toBeLessThan(60_000);

  it('a record of POST /requests and its Idempotency-Key claim', async () => {
    const c = await t.customerWithMeter({ credit: '1' });
    const key = `clock-${c.customerId}`;
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: { ...t.auth(), 'idempotency-key': key },
      payload: { request_id: key, customer_id: c.customerId, meter_slug: c.meterSlug },
    });
    expect(res.statusCode).toBe(201);
    expectAppTime(res.json<{ created_at: string }>().created_at);
    const claim = await t.storage.db.selectFrom('idempotency_keys').select(['created_at', 'expires_at']).where('key', '=', key).executeTakeFirstOrThrow();
    expectAppTime(claim.created_at);
    // Replays last 24 h from the claim, on the app's clock.
    expect(Date.parse(claim.expires_at) - Date.parse(claim.created_at)).toBe(24 * 3_600_000);
  });

  it("a webhook's creation and a secret rotation's overlap", async () => {
    const hook = await t.app.inject({ method: 'POST', url: '/v1/webhooks', headers: t.auth(), payload: { name: 'clock', url: 'http://127.0.0.1:9/hook' } });
    expect(hook.statusCode).toBe(201);
    const { webhook_id, created_at } = hook.json<{ webhook_id: string; created_at: string }>();
    expectAppTime(created_at);
    const rotated = await t.app.inject({ method: 'POST', url: `/v1/webhooks/${webhook_id}/rotate_secret`, headers: t.auth(), payload: { overlap_seconds: 60 } });
    expect(rotated.statusCode).toBe(200);
    const until = Date.parse(rotated.json<{ previous_secret_expires_at: string }>().previous_secret_expires_at);
    expect(Math.abs(until - (t.clock.now() + 60_000))).toBeLessThan(10_000);
  });

  it("a customer, a credit grant's ledger row, a secret key and a plan", async () => {
    const customer = await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: { reference_id: 'clock-customer' } });
    expect(customer.statusCode).toBe(201);
    const { customer_id, created_at } = customer.json<{ customer_id: string; created_at: string }>();
    expectAppTime(created_at);
    const grant = await t.app.inject({ method: 'POST', url: `/v1/customers/${customer_id}/credits`, headers: t.auth(), payload: { amount: '1' } });
    expect(grant.statusCode).toBe(201);
    const row = await t.storage.db.selectFrom('ledger_transactions').select('created_at').where('kind', '=', 'credit_grant').orderBy('created_at', 'desc').executeTakeFirstOrThrow();
    expectAppTime(row.created_at);
    const key = await t.app.inject({ method: 'POST', url: '/v1/secret_keys', headers: t.auth(), payload: { name: 'clock' } });
    expect(key.statusCode).toBe(201);
    expectAppTime(key.json<{ created_at: string }>().created_at);
    const plan = await t.app.inject({ method: 'POST', url: '/v1/plans', headers: t.auth(), payload: { name: 'Clock', period_amount: '1', billing_interval: 'month' } });
    expect(plan.statusCode).toBe(201);
    expectAppTime(plan.json<{ created_at: string }>().created_at);
  });

  it("a spend key's expiry must lie ahead of the app's clock, not the system's", async () => {
    const create = (expires_at: string) => t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'clock', expires_at } });
    // A month ahead of the system clock is eleven months behind the app's.
    const behind = await create(new Date(t.clock.now() - 300 * 86_400_000).toISOString());
    expect(behind.statusCode).toBe(400);
    expect(behind.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['expires_at'], message: 'must be in the future' }] });
    const ahead = await create(new Date(t.clock.now() + 3_600_000).toISOString());
    expect(ahead.statusCode).toBe(201);
  });
});
