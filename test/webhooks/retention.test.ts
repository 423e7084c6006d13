import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PRUNE_BATCH, pruneDeliveredEvents } from '../../src/storage/webhook-retention.ts';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import { MAX_ATTEMPTS } from '../../src/webhooks/schedule.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';

const DAY_MS = 86_400_000;

describe.each(databasesUnderTest())('webhook event retention on %s', (dialect) => {
  let t: TestApp;
  const receivers: Receiver[] = [];

  beforeAll(async () => {
    t = await startTestApp(dialect, { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
  });
  afterAll(async () => {
    await Promise.all(receivers.map((r) => r.close()));
    await t?.close();
  });

  const api = (m: Merchant, method: 'GET' | 'POST' | 'PATCH', url: string, payload?: object) =>
    t.app.inject({ method, url, headers: t.auth(m.secretKey), ...(payload ? { payload } : {}) }).then((r) => r.json());
  const receiverAnswering = async (status: number) => {
    const r = await startReceiver(() => status);
    receivers.push(r);
    return r;
  };
  const eventsOf = async (m: Merchant) => t.storage.db.selectFrom('events').select('id').where('merchant_id', '=', m.merchantId).execute();
  const deliveriesOf = async (m: Merchant) =>
    t.storage.db
      .selectFrom('webhook_deliveries as d')
      .innerJoin('webhooks as w', 'w.id', 'd.webhook_id')
      .select(['d.id', 'd.state'])
      .where('w.merchant_id', '=', m.merchantId)
      .execute();

  it('deletes delivered and finally failed events with their deliveries after the retention days, never a pending or undispatched one', async () => {
    let nowMs = Date.now();
    const d = new WebhookDispatcher({
      storage: t.storage,
      policy: { allowHttpLoopback: true },
      timeoutMs: 2_000,
      maxConcurrency: 16,
      log: t.app.log,
      now: () => nowMs,
      random: () => 0.5,
      retentionDays: 30,
    });
    const round = async () => {
      await d.tick();
      await d.drain();
    };
    try {
      const delivered = await t.newMerchant();
      await api(delivered, 'POST', '/v1/webhooks', { name: 'ok', url: (await receiverAnswering(200)).url });
      const failing = await t.newMerchant();
      await api(failing, 'POST', '/v1/webhooks', { name: 'down', url: (await receiverAnswering(500)).url });
      const stuck = await t.newMerchant();
      const stuckHook = await api(stuck, 'POST', '/v1/webhooks', { name: 'paused', url: (await receiverAnswering(500)).url });
      const quiet = await t.newMerchant(); // no webhook: its events are never fanned out
      for (const m of [delivered, failing, stuck, quiet]) await api(m, 'POST', '/v1/customers', {});

      await round();
      // The paused endpoint's delivery stays pending: a disabled webhook's deliveries wait.
      await api(stuck, 'PATCH', `/v1/webhooks/${stuckHook.webhook_id}`, { enabled: false });
      // The failing endpoint's delivery goes through its whole schedule, an attempt every 11 hours (3.2 days).
      for (let attempt = 2; attempt <= MAX_ATTEMPTS; attempt++) {
        nowMs += 11 * 3_600_000;
        await round();
      }
      expect((await deliveriesOf(delivered)).map((x) => x.state)).toEqual(['succeeded']);
      expect((await deliveriesOf(failing)).map((x) => x.state)).toEqual(['failed']);
      expect((await deliveriesOf(stuck)).map((x) => x.state)).toEqual(['pending']);

      // 29 days after the success: within retention, everything stays.
      const start = nowMs - (MAX_ATTEMPTS - 1) * 11 * 3_600_000;
      nowMs = start + 29 * DAY_MS;
      await round();
      for (const m of [delivered, failing, stuck, quiet]) expect(await eventsOf(m)).toHaveLength(1);

      // 31 days after the success, under 28 after the final failure: the delivered event goes; the
      // failed one is kept until 30 days after its last attempt.
      nowMs = start + 31 * DAY_MS;
      await round();
      expect(await eventsOf(delivered)).toEqual([]);
      expect(await deliveriesOf(delivered)).toEqual([]);
      expect(await eventsOf(failing)).toHaveLength(1);

      nowMs = start + 34 * DAY_MS;
      await round();
      expect(await eventsOf(failing)).toEqual([]);
      expect(await deliveriesOf(failing)).toEqual([]);
      // Never a pending delivery or an event not yet fanned out, however old.
      expect(await eventsOf(stuck)).toHaveLength(1);
      expect((await deliveriesOf(stuck)).map((x) => x.state)).toEqual(['pending']);
      expect(await eventsOf(quiet)).toHaveLength(1);
    } finally {
      await d.stop();
    }
  });

  it('a dispatcher prunes at most every 10 minutes of its clock', async () => {
    const m = await t.newMerchant();
    const hook = await api(m, 'POST', '/v1/webhooks', { name: 'cadence', url: (await receiverAnswering(200)).url });
    let nowMs = Date.parse('2030-01-01T00:00:00.000Z');
    const d = new WebhookDispatcher({ storage: t.storage, policy: { allowHttpLoopback: true }, timeoutMs: 2_000, maxConcurrency: 16, log: t.app.log, now: () => nowMs, random: () => 0.5, retentionDays: 30 });
    /** One delivered event, long past retention (an id sorting before any real event's, as below). */
    const oldDeliveredEvent = async (id: string) => {
      const at = '2020-01-01T00:00:00.000Z';
      await t.storage.db.insertInto('events').values({ id, merchant_id: m.merchantId, type: 'customer.created', payload: '{}', created_at: at, dispatched_at: at }).execute();
      await t.storage.db
        .insertInto('webhook_deliveries')
        .values({ id: `whd_${id}`, webhook_id: hook.webhook_id, event_id: id, event_type: 'customer.created', state: 'succeeded', attempts: 1, last_attempt_at: at, last_status_code: 200, created_at: at })
        .execute();
    };
    const round = async () => {
      await d.tick();
      await d.drain();
    };
    try {
      await oldDeliveredEvent('evt_0000000000cad001');
      await round();
      expect(await eventsOf(m)).toEqual([]);

      await oldDeliveredEvent('evt_0000000000cad002');
      nowMs += 10 * 60_000 - 1;
      await round();
      expect((await eventsOf(m)).map((e) => e.id)).toEqual(['evt_0000000000cad002']);
      nowMs += 1;
      await round();
      expect(await eventsOf(m)).toEqual([]);
    } finally {
      await d.stop();
    }
  });

  it('prunes a large backlog in bounded batches, oldest first', async () => {
    const m = await t.newMerchant();
    const hook = await api(m, 'POST', '/v1/webhooks', { name: 'backlog', url: (await receiverAnswering(200)).url });
    expect(PRUNE_BATCH).toBe(500); // the batch decision 0033 states
    const count = 2 * PRUNE_BATCH + 200;
    const at = '2020-01-01T00:00:00.000Z';
    const pad = (e: ReturnType<typeof sql>) => (dialect === 'postgres' ? sql`lpad((${e})::text, 6, '0')` : sql`printf('%06d', ${e})`);
    const numbers = sql`with recursive n(i) as (select 0 union all select i + 1 from n where i < ${sql.lit(count - 1)})`;
    // Ids sort before any real event's: their time part is all zeros but for the sequence.
    await sql`${numbers} insert into events (id, merchant_id, type, payload, created_at, dispatched_at)
      select 'evt_0000000000' || ${pad(sql`i`)}, ${m.merchantId}, 'customer.created', '{}', ${at}, ${at} from n`.execute(t.storage.db);
    await sql`${numbers} insert into webhook_deliveries (id, webhook_id, event_id, event_type, state, attempts, last_attempt_at, last_status_code, created_at)
      select 'whd_backlog' || ${pad(sql`i`)}, ${hook.webhook_id}, 'evt_0000000000' || ${pad(sql`i`)}, 'customer.created', 'succeeded', 1, ${at}, 200, ${at} from n`.execute(t.storage.db);

    const before = '2021-01-01T00:00:00.000Z';
    expect(await pruneDeliveredEvents(t.storage, before)).toEqual({ deleted: PRUNE_BATCH, full: true });
    const left = await eventsOf(m);
    expect(left).toHaveLength(count - PRUNE_BATCH);
    expect(left.map((e) => e.id).sort()[0]).toBe(`evt_0000000000${String(PRUNE_BATCH).padStart(6, '0')}`);
    expect(await pruneDeliveredEvents(t.storage, before)).toEqual({ deleted: PRUNE_BATCH, full: true });
    expect(await pruneDeliveredEvents(t.storage, before)).toEqual({ deleted: 200, full: false });
    expect(await eventsOf(m)).toEqual([]);
    expect(await deliveriesOf(m)).toEqual([]);
  });
});
