import { Redis } from 'ioredis';
import { ulid } from 'ulid';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { MemoryRateLimiter, RedisRateLimiter, type RateLimiter } from '../../src/http/rate-limit.ts';
import { startServer, type RunningServer } from '../../src/main.ts';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { insertSecretKey } from '../../src/storage/secret-keys.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { TestClock } from '../helpers/clock.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

const LIMIT = 5;
const env = { RATE_LIMIT_PER_MINUTE: String(LIMIT) };

/** Redis runs when TEST_REDIS_URL is set; in CI a missing Redis is a failure, never a silent skip. */
const REDIS_URL = process.env.TEST_REDIS_URL;
if (!REDIS_URL && process.env.CI) {
  throw new Error('CI must set TEST_REDIS_URL so the Redis rate-limit suites run.');
}

/** The one clock of every app and server here, so apps sharing a limiter agree on its windows. */
const clock = new TestClock();

/**
 * Windows are fixed minutes of the app's clock. A burst that straddles a boundary would see two
 * windows, so when the current one is about to end the clock jumps to the next one.
 */
async function awayFromWindowEdge(marginMs = 5_000): Promise<void> {
  const left = 60_000 - (clock.now() % 60_000);
  if (left < marginMs) clock.advance(left + 1);
}

type LimiterFactory = { make(): RateLimiter; closeAll(): Promise<void> };

function memoryLimiters(): LimiterFactory {
  return { make: () => new MemoryRateLimiter(), closeAll: async () => {} };
}

/** Every limiter gets its own connection (as separate instances would), all under one run-unique prefix. */
function redisLimiters(url: string): LimiterFactory {
  const prefix = `tollgate:test:${ulid()}:`;
  const clients: Redis[] = [];
  return {
    make: () => {
      const redis = new Redis(url, { maxRetriesPerRequest: 2 });
      clients.push(redis);
      return new RedisRateLimiter(redis, { prefix });
    },
    closeAll: async () => {
      await Promise.all(clients.map((c) => c.quit()));
    },
  };
}

const suites: [string, () => LimiterFactory, boolean][] = [
  ['in-memory limiter', memoryLimiters, false],
  ['Redis limiter', () => redisLimiters(REDIS_URL ?? ''), !REDIS_URL],
];

for (const [label, factory, skip] of suites) {
  describe.skipIf(skip).each(databasesUnderTest())(`rate limits with the ${label} on %s`, (dialect) => {
    let limiters: LimiterFactory;
    let t: TestApp;
    beforeAll(async () => {
      limiters = factory();
      t = await startTestApp(dialect, { env, rateLimiter: limiters.make(), clock });
    });
    afterAll(async () => {
      await t?.close();
      await limiters?.closeAll();
    });

    const get = (app: TestApp, secret: string) =>
      app.app.inject({ method: 'GET', url: '/v1/meters', headers: app.auth(secret) });

    it('reads a window without counting, and clears it (as sign-in failures are forgotten on success)', async () => {
      await awayFromWindowEdge();
      const limiter = limiters.make();
      const key = `peek-clear:${ulid()}`;
      expect(await limiter.count(key, 60_000, clock.now())).toBe(0);
      await limiter.hit(key, 5, 60_000, clock.now());
      await limiter.hit(key, 5, 60_000, clock.now());
      expect(await limiter.count(key, 60_000, clock.now())).toBe(2);
      expect(await limiter.count(key, 60_000, clock.now())).toBe(2);
      await limiter.clear(key, 60_000, clock.now());
      expect(await limiter.count(key, 60_000, clock.now())).toBe(0);
      expect((await limiter.hit(key, 5, 60_000, clock.now())).remaining).toBe(4);
    });

    it('sends X-RateLimit headers counting down, with Reset as Unix seconds within the next minute', async () => {
      await awayFromWindowEdge();
      const m = await t.newMerchant();
      for (let i = 1; i <= LIMIT; i++) {
        const before = clock.now() / 1000;
        const res = await get(t, m.secretKey);
        expect(res.statusCode).toBe(200);
        expect(res.headers['x-ratelimit-limit']).toBe(String(LIMIT));
        expect(res.headers['x-ratelimit-remaining']).toBe(String(LIMIT - i));
        const reset = Number(res.headers['x-ratelimit-reset']);
        expect(Number.isInteger(reset)).toBe(true);
        expect(reset).toBeGreaterThan(before);
        expect(reset).toBeLessThanOrEqual(Math.ceil(before) + 60);
      }
    });

    it('answers the request over the limit with 429 rate_limited and Retry-After', async () => {
      await awayFromWindowEdge();
      const m = await t.newMerchant();
      for (let i = 0; i < LIMIT; i++) expect((await get(t, m.secretKey)).statusCode).toBe(200);

      const res = await get(t, m.secretKey);
      expect(res.statusCode).toBe(429);
      expect(res.json()).toEqual({ error: { message: expect.any(String), code: 'rate_limited', status: 429 } });
      expect(res.headers['x-ratelimit-remaining']).toBe('0');
      const retryAfter = Number(res.headers['retry-after']);
      expect(Number.isInteger(retryAfter)).toBe(true);
      expect(retryAfter).toBeGreaterThanOrEqual(1);
      expect(retryAfter).toBeLessThanOrEqual(60);
      // Retry-After and Reset name the same moment.
      const reset = Number(res.headers['x-ratelimit-reset']);
      expect(Math.abs(reset - (Math.floor(clock.now() / 1000) + retryAfter))).toBeLessThanOrEqual(1);

      // A limited key stays limited for the rest of the window, and nothing runs behind the 429.
      const post = await t.app.inject({
        method: 'POST',
        url: '/v1/customers',
        headers: t.auth(m.secretKey),
        payload: { reference_id: 'blocked' },
      });
      expect(post.statusCode).toBe(429);
      const rows = await t.storage.db
        .selectFrom('connections')
        .select('id')
        .where('merchant_id', '=', m.merchantId)
        .execute();
      expect(rows).toHaveLength(0);
    });

    it('counts per API key: other keys, of this merchant or another, are unaffected', async () => {
      await awayFromWindowEdge();
      const m = await t.newMerchant();
      const sibling = await insertSecretKey(t.storage.db, m.merchantId, 'Sibling', new Date().toISOString());
      const other = await t.newMerchant();
      for (let i = 0; i <= LIMIT; i++) await get(t, m.secretKey);
      expect((await get(t, m.secretKey)).statusCode).toBe(429);

      for (const secret of [sibling.secret, other.secretKey]) {
        const res = await get(t, secret);
        expect(res.statusCode).toBe(200);
        expect(res.headers['x-ratelimit-remaining']).toBe(String(LIMIT - 1));
      }
      // Public operational endpoints are not metered per key.
      const health = await t.app.inject({ method: 'GET', url: '/healthz' });
      expect(health.statusCode).toBe(200);
      expect(health.headers['x-ratelimit-limit']).toBeUndefined();
    });

    if (label === 'Redis limiter') {
      it('shares one window between two app instances on one Redis and one database: together they admit exactly the limit', async () => {
        await awayFromWindowEdge();
        const second = await startTestApp(dialect, { env, database: t.database, rateLimiter: limiters.make(), clock });
        try {
          const m = await t.newMerchant();
          // Sequential, alternating: the counts of both instances add up.
          const sequential: number[] = [];
          for (let i = 0; i < LIMIT + 3; i++) sequential.push((await get(i % 2 ? second : t, m.secretKey)).statusCode);
          expect(sequential.filter((s) => s === 200)).toHaveLength(LIMIT);
          expect(sequential.slice(LIMIT).every((s) => s === 429)).toBe(true);

          // Concurrent, spread over both instances.
          const n = await t.newMerchant();
          const burst = await Promise.all(
            Array.from({ length: 3 * LIMIT }, (_, i) => get(i % 2 ? second : t, n.secretKey)),
          );
          const statuses = burst.map((r) => r.statusCode);
          expect(statuses.filter((s) => s === 200)).toHaveLength(LIMIT);
          expect(statuses.filter((s) => s === 429)).toHaveLength(2 * LIMIT);
          const remaining = burst.filter((r) => r.statusCode === 200).map((r) => r.headers['x-ratelimit-remaining']);
          expect([...remaining].sort()).toEqual(['0', '1', '2', '3', '4']);
        } finally {
          await second.close();
        }
      });
    }
  });
}

describe.each(databasesUnderTest())('rate limits while Redis is unreachable, on %s', (dialect) => {
  let server: RunningServer;
  let secretKey: string;
  beforeAll(async () => {
    const database = await freshDatabase(dialect);
    // Nothing listens on port 1: every connection attempt is refused.
    server = await startServer(
      loadConfig({ PORT: '0', LOG_LEVEL: 'silent', DATABASE_URL: database.url, REDIS_URL: 'redis://127.0.0.1:1', ...env }),
      { clock },
    );
    const side = openStorage(database.url);
    ({ secretKey } = await createMerchant(side, { name: 'No Redis' }, new Date().toISOString()));
    await side.close();
  });
  afterAll(async () => server?.stop());

  const call = (path: string, init: RequestInit = {}) =>
    fetch(`${server.url}${path}`, {
      ...init,
      headers: { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' },
    });

  it('keeps answering standard endpoints, counting the limit in this instance, never a 500', async () => {
    await awayFromWindowEdge();
    const created = await call('/v1/customers', { method: 'POST', body: JSON.stringify({ reference_id: 'still-billed' }) });
    expect(created.status).toBe(201);
    expect(created.headers.get('x-ratelimit-remaining')).toBe(String(LIMIT - 1));
    for (let i = 2; i <= LIMIT; i++) {
      const res = await call('/v1/meters');
      expect(res.status).toBe(200);
      expect(res.headers.get('x-ratelimit-remaining')).toBe(String(LIMIT - i));
    }
    const over = await call('/v1/meters');
    expect(over.status).toBe(429);
    expect((await over.json()).error.code).toBe('rate_limited');
  });

  it('reports Redis as unreachable in /readyz, degraded but still 200 while the database answers', async () => {
    const res = await fetch(`${server.url}/readyz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'degraded', database: dialect, redis: 'unreachable' });
  });
});

describe.skipIf(!REDIS_URL)('Redis limiter when Redis fails a command', () => {
  const prefix = `tollgate:test:${ulid()}:`;
  let redis: Redis;
  beforeAll(() => {
    redis = new Redis(REDIS_URL ?? '', { maxRetriesPerRequest: 2 });
  });
  afterAll(async () => redis?.quit());

  it('counts locally and reports the outage once, then counts in Redis again when it answers', async () => {
    await awayFromWindowEdge();
    const outages: unknown[] = [];
    const limiter = new RedisRateLimiter(redis, { prefix, onOutage: (err) => outages.push(err), probeIntervalMs: 10 });
    const windowStart = Math.floor(clock.now() / 60_000) * 60_000;
    const redisKey = `${prefix}key-a:${windowStart}`;
    // A key of the wrong type makes INCR fail while the connection is fine.
    await redis.hset(redisKey, 'not', 'a counter');

    expect((await limiter.hit('key-a', LIMIT, 60_000, clock.now())).remaining).toBe(LIMIT - 1);
    expect((await limiter.hit('key-a', LIMIT, 60_000, clock.now())).remaining).toBe(LIMIT - 2);
    expect(outages).toHaveLength(1);
    expect(String(outages[0])).toMatch(/WRONGTYPE/);

    await redis.del(redisKey);
    // The breaker sends nothing more until its probe is answered.
    await vi.waitFor(async () => expect(await limiter.reachable()).toBe(true), { timeout: 2_000, interval: 10 });
    expect((await limiter.hit('key-a', LIMIT, 60_000, clock.now())).remaining).toBe(LIMIT - 1);
    expect(await redis.get(redisKey)).toBe('1');

    // A new outage is reported again.
    await redis.del(redisKey);
    await redis.hset(redisKey, 'not', 'a counter again');
    await limiter.hit('key-a', LIMIT, 60_000, clock.now());
    expect(outages).toHaveLength(2);
    await redis.del(redisKey);
  });

  it('reports Redis as ready in /readyz when REDIS_URL answers', async () => {
    const database = await freshDatabase('sqlite');
    const server = await startServer(loadConfig({ PORT: '0', LOG_LEVEL: 'silent', DATABASE_URL: database.url, REDIS_URL: REDIS_URL ?? '' }));
    try {
      const res = await fetch(`${server.url}/readyz`);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ status: 'ready', database: 'sqlite', redis: 'ready' });
    } finally {
      await server.stop();
    }
  });
});
