import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';

const onPostgres = process.env.TEST_DATABASE_URL ? describe : describe.skip;

async function attemptsOf(registry: Registry): Promise<number> {
  const metric = await registry.getSingleMetric('tollgate_webhook_delivery_attempts_total')!.get();
  return metric.values[0]?.value ?? 0;
}

onPostgres('two server instances on one PostgreSQL database', () => {
  let t: TestApp;
  let second: Storage;
  let receiver: Receiver;
  beforeAll(async () => {
    t = await startTestApp('postgres', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    second = openStorage(t.database.url, { poolSize: 5 });
    receiver = await startReceiver();
  });
  afterAll(async () => {
    await receiver?.close();
    await second?.close();
    await t?.close();
  });

  it('share the deliveries and send no event twice to an endpoint', async () => {
    const merchants = [await t.newMerchant(), await t.newMerchant()];
    for (const [i, m] of merchants.entries()) {
      for (const n of [1, 2]) {
        await t.app.inject({ method: 'POST', url: '/v1/webhooks', headers: t.auth(m.secretKey), payload: { name: `h${n}`, url: `${receiver.url}/${i}-${n}` } });
      }
    }
    const registries = [new Registry(), new Registry()];
    const dispatchers = [t.storage, second].map(
      (storage, i) =>
        new WebhookDispatcher({
          storage,
          policy: { allowHttpLoopback: true },
          timeoutMs: 2_000,
          maxConcurrency: 8,
          log: t.app.log,
          registry: registries[i]!,
          pollIntervalMs: 10,
        }),
    );
    for (const d of dispatchers) d.start();
    try {
      const perMerchant = 100;
      await Promise.all(
        merchants.map(async (m) => {
          for (let n = 0; n < perMerchant; n++) await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(m.secretKey), payload: {} });
        }),
      );
      const expected = merchants.length * perMerchant * 2;
      await receiver.waitFor(expected, 20_000);
      await Promise.all(dispatchers.map((d) => d.tick()));
      await Promise.all(dispatchers.map((d) => d.drain()));
      const pairs = receiver.received.map((r) => `${r.path} ${JSON.parse(r.body).id}`);
      expect(pairs).toHaveLength(expected);
      expect(new Set(pairs).size).toBe(expected);
      const attempts = await Promise.all(registries.map(attemptsOf));
      expect(attempts[0]! + attempts[1]!).toBe(expected);
      expect(Math.min(...attempts)).toBeGreaterThan(0);
    } finally {
      await Promise.all(dispatchers.map((d) => d.stop()));
    }
  });
});
