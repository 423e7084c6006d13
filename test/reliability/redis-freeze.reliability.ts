import { spawn, type ChildProcess } from 'node:child_process';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { freePort, printFigures, startServe, useServeSuite } from './harness.ts';
import { until } from '../helpers/until.ts';

/**
 * A Redis that stops answering (SIGSTOP keeps its connections open, so nothing but a timeout
 * notices) costs a call a few milliseconds at most: a real `tollgate serve` using a Redis this test
 * starts for itself (never the shared one) serves standard-endpoint calls (rate limit counted in
 * Redis) and spend-key calls (token bucket in Redis) while that Redis is frozen, each call within
 * CALL_BOUND_MS but the first on each Redis client (which waits one command timeout and opens its
 * breaker, and a few a loaded host stalls); /readyz says Redis is unreachable at once; after SIGCONT the breakers' probes find Redis
 * again and the counters in Redis move again. Before, every call waited ~1 s for its command.
 */

/** What a call may take while Redis is frozen: its command timeout is 50 ms, its breaker's skip ~0. */
const CALL_BOUND_MS = 100;
/** Calls of each kind made while Redis is frozen. */
const FROZEN_CALLS = 40;
/**
 * Calls allowed past CALL_BOUND_MS: the first on each of the two Redis clients waits one command
 * timeout before its breaker opens, and a host shared with other work stalls a few more now and
 * then. Before the breaker every call waited ~1 s, so all of them were past it.
 */
const CALLS_PAST_BOUND = FROZEN_CALLS / 5;
/** No call comes near the ~1 s a frozen Redis cost each call before. */
const NEVER_MS = 600;

type OwnRedis = { process: ChildProcess; url: string; client: Redis };

async function startOwnRedis(): Promise<OwnRedis> {
  const port = await freePort();
  const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const url = `redis://127.0.0.1:${port}`;
  const client = new Redis(url, { maxRetriesPerRequest: 1, retryStrategy: () => 20 });
  client.on('error', () => {});
  try {
    await until(() => client.ping().then(() => true, () => false), 'redis-server to answer PING', { intervalMs: 25 });
    return { process: child, url, client };
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  }
}

describe.each(databasesUnderTest())('a frozen Redis (SIGSTOP) with tollgate serve on %s', (dialect) => {
  const suite = useServeSuite(dialect, 'sk-managed-redis-freeze');
  let redis: OwnRedis;

  beforeAll(async () => {
    redis = await startOwnRedis();
    suite.env.REDIS_URL = redis.url;
  });
  afterAll(async () => {
    redis?.process.kill('SIGCONT');
    redis?.client.disconnect();
    redis?.process.kill('SIGKILL');
  });

  it('costs each call a few ms while frozen (degraded as when Redis is down), and Redis counts again after SIGCONT', async () => {
    const { storage, base, env } = suite;
    const { merchant, secretKey } = await createMerchant(storage, { name: 'Redis freeze' }, new Date().toISOString());
    await creditWallet(storage, merchant.wallet_id, parseMoney('100'), new Date().toISOString());
    suite.serve = await startServe(env, base);
    const standardHeaders = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
    const created = await fetch(`${base}/v1/spend_keys`, {
      method: 'POST',
      headers: standardHeaders,
      body: JSON.stringify({ name: 'frozen', rate_limit: { rpm: 1_000_000, burst: 1_000_000 } }),
    });
    expect(created.status).toBe(201);
    const spendKey = ((await created.json()) as { key: string }).key;

    const standardCall = () => fetch(`${base}/v1/customers`, { headers: standardHeaders });
    const spendKeyCall = () =>
      fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${spendKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
      });
    const timed = async (call: () => Promise<Response>) => {
      const started = performance.now();
      const res = await call();
      await res.arrayBuffer();
      return { status: res.status, ms: performance.now() - started };
    };
    const redisCounts = async () => {
      const rateKeys = await redis.client.keys('tollgate:rl:*');
      const bucketKeys = await redis.client.keys('tollgate:spk:*');
      // Every window's count (a minute may turn during the test), and when the bucket was last taken from.
      const rate = (await Promise.all(rateKeys.map((key) => redis.client.get(key)))).reduce((sum, count) => sum + Number(count), 0);
      const bucket = bucketKeys.length === 1 ? await redis.client.hget(bucketKeys[0]!, 'ts') : null;
      return { rate, bucket };
    };

    // Before: both kinds of call are counted in this Redis.
    for (let i = 0; i < 5; i++) {
      expect((await timed(standardCall)).status).toBe(200);
      expect((await timed(spendKeyCall)).status).toBe(200);
    }
    const before = await redisCounts();
    expect(before.rate).toBeGreaterThanOrEqual(5);
    expect(before.bucket).not.toBeNull();

    redis.process.kill('SIGSTOP');
    const frozen: { status: number; ms: number }[] = [];
    for (let i = 0; i < FROZEN_CALLS; i++) {
      frozen.push(await timed(standardCall));
      frozen.push(await timed(spendKeyCall));
    }
    const readyStarted = performance.now();
    const ready = await fetch(`${base}/readyz`);
    const readyMs = performance.now() - readyStarted;
    const readyBody = (await ready.json()) as { status: string; redis: string };

    const slow = frozen.filter((call) => call.ms > CALL_BOUND_MS);
    printFigures(`redis freeze (${dialect})`, {
      calls_while_frozen: frozen.length,
      over_100ms: slow.length,
      slowest_ms: Math.round(Math.max(...frozen.map((call) => call.ms))),
      median_ms: Math.round(frozen.map((call) => call.ms).sort((a, b) => a - b)[frozen.length >> 1]!),
      readyz_ms: Math.round(readyMs),
    });
    expect(frozen.filter((call) => call.status !== 200)).toEqual([]);
    expect(slow.length).toBeLessThanOrEqual(CALLS_PAST_BOUND);
    // Even those waited one command timeout at most, not the ~1 s of before.
    expect(frozen.filter((call) => call.ms >= NEVER_MS)).toEqual([]);
    // The breaker is open: readiness reports Redis out without waiting on it.
    expect(ready.status).toBe(200);
    expect(readyBody).toMatchObject({ status: 'degraded', redis: 'unreachable' });
    expect(readyMs).toBeLessThan(NEVER_MS);

    redis.process.kill('SIGCONT');
    // The breakers' probes find Redis again (polled; the probe runs every 500 ms).
    await until(
      async () => ((await (await fetch(`${base}/readyz`)).json()) as { redis: string }).redis === 'ready',
      'readyz to report Redis ready',
      { timeoutMs: 10_000, intervalMs: 50 },
    );
    const resumed = await redisCounts();
    const after = await until(
      async () => {
        expect((await timed(standardCall)).status).toBe(200);
        expect((await timed(spendKeyCall)).status).toBe(200);
        const counts = await redisCounts();
        return counts.rate > resumed.rate && counts.bucket !== resumed.bucket && counts;
      },
      'both counters to move in Redis again',
      { timeoutMs: 10_000, intervalMs: 50 },
    );
    // Both counters move in Redis again: the standard window and the spend key's bucket.
    expect(after.rate).toBeGreaterThan(resumed.rate);
    expect(after.bucket).not.toBe(resumed.bucket);
  });
});
