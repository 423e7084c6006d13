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
});
