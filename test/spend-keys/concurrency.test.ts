import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { TestClock } from '../helpers/clock.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';
import { until } from '../helpers/until.ts';

type Json = Record<string, unknown>;

/** Redis runs when TEST_REDIS_URL is set; in CI a missing Redis is a failure, never a silent skip. */
const REDIS_URL = process.env.TEST_REDIS_URL;
if (!REDIS_URL && process.env.CI) {
  throw new Error('CI must set TEST_REDIS_URL so the Redis spend-key suites run.');
}

const buckets: [string, Record<string, string> | null][] = [
  ['database buckets', {}],
  ['Redis buckets', REDIS_URL ? { REDIS_URL } : null],
];

/** Two server instances on one database (and one Redis): limits hold exactly under parallel load. */
for (const [label, bucketEnv] of buckets) {
  describe.skipIf(bucketEnv === null).each(databasesUnderTest())(`spend key limits across two instances with ${label} on %s`, (dialect) => {
    let upstream: MockUpstream;
    let a: TestApp;
    let b: TestApp;
    let bases: string[];
    /** Both instances' clock, so they agree on expiries and buckets. */
    const clock = new TestClock();

    beforeAll(async () => {
      upstream = await startMockUpstream();
      const env = {
        ...bucketEnv,
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-openai-managed' }),
      };
      a = await startTestApp(dialect, { env, clock });
      b = await startTestApp(dialect, { env, database: a.database, clock });
      bases = [await a.listen(), await b.listen()];
      await creditWallet(a.storage, a.merchant.walletId, parseMoney('10000'), dateOf(clock).toISOString());
    });
    afterAll(async () => {
      await b?.close();
      await a?.close();
      await upstream?.close();
    });

    const createKey = async (body: Json) => {
      const res = await a.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: a.auth(), payload: { name: 'load', ...body } });
      expect(res.statusCode).toBe(201);
      return res.json() as { key: string; spend_key_id: string };
    };
    const retrieve = async (id: string) =>
      (await b.app.inject({ method: 'GET', url: `/v1/spend_keys/${id}`, headers: a.auth() })).json() as Json;
    const chat = (i: number, key: string, maxTokens = 4) =>
      fetch(`${bases[i % 2]}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o', max_tokens: maxTokens, messages: [{ role: 'user', content: 'hi' }] }),
      }).then(async (res) => ({ status: res.status, body: await res.text() }));
    const inFlight = async (id: string) =>
      (await a.storage.db.selectFrom('spend_key_reservations').select('request_pk').where('spend_key_id', '=', id).execute()).length;
    async function settled(id: string): Promise<Json> {
      await until(async () => (await inFlight(id)) === 0, 'no request of the key in flight', { timeoutMs: 10_000, intervalMs: 20 });
      return retrieve(id);
    }

    it('100 parallel requests against a spend limit of 10: at most 10 admitted, current_spend never above it', async () => {
      // gpt-4o output is 0.00001 per token: a 100000-token cap holds (and costs) just over 1.
      const key = await createKey({ spend_limit: { amount: '10', cycle: 'daily' } });
      let watching = true;
      let maxSeen = 0n;
      const watcher = (async () => {
        while (watching) {
          const spend = parseMoney((await retrieve(key.spend_key_id)).current_spend as string);
          if (spend > maxSeen) maxSeen = spend;
          // Wall clock: a sampler beside the load, a few milliseconds between looks.
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
      const results = await Promise.all(Array.from({ length: 100 }, (_, i) => chat(i, key.key, 100_000)));
      const admitted = results.filter((r) => r.status === 200).length;
      expect(results.filter((r) => r.status !== 200).every((r) => r.status === 402)).toBe(true);
      expect(admitted).toBeGreaterThan(0);
      expect(admitted).toBeLessThanOrEqual(10);
      const after = await settled(key.spend_key_id);
      watching = false;
      await watcher;
      const spend = parseMoney(after.current_spend as string);
      expect(spend).toBeLessThanOrEqual(parseMoney('10'));
      expect(maxSeen).toBeLessThanOrEqual(parseMoney('10'));
      expect(after.total_requests).toBe(admitted);
    });

    it('a provider answering more than max_tokens is the only way past the limit, by at most its excess over the reservation', async () => {
      const limit = parseMoney('10');
      const key = await createKey({ spend_limit: { amount: '10', cycle: 'daily' } });
      // Records stamped from here on are this test's alone.
      clock.advance(1000);
      const startedAt = dateOf(clock).toISOString();
      // Every answer is 50% longer than the request's cap allows.
      upstream.setNext({ path: '/chat/completions', outputTokens: 150_000, times: Infinity });
      try {
        const results = await Promise.all(Array.from({ length: 100 }, (_, i) => chat(i, key.key, 100_000)));
        const admitted = results.filter((r) => r.status === 200).length;
        expect(results.filter((r) => r.status !== 200).every((r) => r.status === 402)).toBe(true);
        expect(admitted).toBeGreaterThan(0);
        expect(admitted).toBeLessThanOrEqual(10);
        const spend = parseMoney((await settled(key.spend_key_id)).current_spend as string);

        const records = await a.storage.db
          .selectFrom('requests')
          .select(['id', 'total_wallet_cost', 'total_merchant_cost'])
          .where('created_at', '>=', startedAt)
          .where('status', '=', 'completed')
          .execute();
        expect(records).toHaveLength(admitted);
        let excess = 0n;
        for (const record of records) {
          const holds = await a.storage.db.selectFrom('holds').select('amount').where('reference', '=', record.id).execute();
          const reserved = holds.reduce((sum, h) => sum + BigInt(h.amount), 0n);
          const actual = BigInt(record.total_wallet_cost) + BigInt(record.total_merchant_cost);
          if (actual > reserved) excess += actual - reserved;
        }
        // Decision 0006: current_spend <= limit + what admitted requests cost beyond their reservations.
        expect(excess).toBeGreaterThan(0n);
        expect(spend).toBeGreaterThan(limit);
        expect(spend).toBeLessThanOrEqual(limit + excess);
      } finally {
        upstream.reset();
      }
    });

    it('rpm 60 with burst 5 hit by 50 parallel requests admits exactly 5 (plus one per full second the burst took)', async () => {
      const key = await createKey({ rate_limit: { rpm: 60, burst: 5 } });
      const started = performance.now();
      const results = await Promise.all(Array.from({ length: 50 }, (_, i) => chat(i, key.key)));
      // The bucket refills one token a second: a slow machine may see a sixth token mid-burst.
      const refilled = Math.floor((performance.now() - started) / 1000);
      const admitted = results.filter((r) => r.status === 200).length;
      expect(admitted).toBeGreaterThanOrEqual(5);
      expect(admitted).toBeLessThanOrEqual(5 + refilled);
      expect(results.filter((r) => r.status === 429)).toHaveLength(50 - admitted);
    });

    it('rpm 1 with burst 5 hit by 50 parallel requests admits exactly 5 (no refill within the run)', async () => {
      const key = await createKey({ rate_limit: { rpm: 1, burst: 5 } });
      const results = await Promise.all(Array.from({ length: 50 }, (_, i) => chat(i, key.key)));
      expect(results.filter((r) => r.status === 200)).toHaveLength(5);
      expect(results.filter((r) => r.status === 429)).toHaveLength(45);
    });

    it('a request limit of 7 hit by 40 parallel requests admits exactly 7', async () => {
      const key = await createKey({ request_limit: { count: 7, cycle: 'monthly' } });
      const results = await Promise.all(Array.from({ length: 40 }, (_, i) => chat(i, key.key)));
      expect(results.filter((r) => r.status === 200)).toHaveLength(7);
      expect(results.filter((r) => r.status === 429)).toHaveLength(33);
      const after = await settled(key.spend_key_id);
      expect(after).toMatchObject({ current_requests: 7, total_requests: 7 });
      const events = await a.storage.db.selectFrom('events').selectAll().where('type', '=', 'spend_key.limit_reached').execute();
      expect(events.filter((e) => (JSON.parse(e.payload) as Json).spend_key_id === key.spend_key_id)).toHaveLength(1);
    });

    it('a rotated key stops on both instances at once; so does a revoked one; a key expiring mid-run stops', async () => {
      const key = await createKey({});
      expect((await chat(0, key.key)).status).toBe(200);
      const rotated = (await b.app.inject({ method: 'POST', url: `/v1/spend_keys/${key.spend_key_id}/rotate`, headers: a.auth() })).json() as { key: string };
      expect((await chat(0, key.key)).status).toBe(401);
      expect((await chat(1, key.key)).status).toBe(401);
      expect((await chat(0, rotated.key)).status).toBe(200);
      await a.app.inject({ method: 'DELETE', url: `/v1/spend_keys/${key.spend_key_id}`, headers: a.auth() });
      expect((await chat(1, rotated.key)).status).toBe(401);

      const expiring = await createKey({ expires_at: new Date(clock.now() + 700).toISOString() });
      const statuses: number[] = [];
      for (let i = 0; i < 4; i++) statuses.push((await chat(i, expiring.key)).status);
      // Its expiry passes between two requests: from then on both instances refuse it.
      clock.advance(700);
      for (let i = 0; i < 4; i++) statuses.push((await chat(i, expiring.key)).status);
      expect(statuses).toEqual([200, 200, 200, 200, 401, 401, 401, 401]);
    });
  });
}
