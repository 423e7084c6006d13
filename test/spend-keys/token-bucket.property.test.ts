import fc from 'fast-check';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { bucketCapacity, takeToken, type BucketSpec } from '../../src/domain/spend-limits.ts';
import { defineTakeToken, takeTokenInRedis } from '../../src/gateway/spend-key-guard.ts';
import { insertSpendKey, takeTokenInDatabase } from '../../src/storage/spend-keys.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * A spend key's token bucket has one definition, domain/spend-limits.ts' takeToken (refill at
 * `rpm` units per millisecond up to the burst, take one token of 60,000 units). Its two stores —
 * the database's conditional UPDATE and the Redis script — must decide every take exactly as it
 * does, and leave the same level, on random limits and random sequences of takes and pauses
 * (a pause of 0 is requests arriving together; the clock never goes back).
 */
type Step = { waitMs: number };
const spec: fc.Arbitrary<BucketSpec> = fc
  .record({ rpm: fc.integer({ min: 1, max: 600 }), burst: fc.integer({ min: 1, max: 5 }) })
  .map(({ rpm, burst }) => ({ rpm, burst }));
const steps: fc.Arbitrary<Step[]> = fc.array(
  fc.record({ waitMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 500 }), fc.integer({ min: 500, max: 120_000 })) }),
  { minLength: 1, maxLength: 25 },
);

/** What takeToken decides for each step from a full bucket at t0: the level left after a take, or the level refused at (null = taken). */
function expected(bucket: BucketSpec, t0: number, walk: Step[]): (number | null)[] {
  let units = bucketCapacity(bucket);
  let at = t0;
  let now = t0;
  return walk.map(({ waitMs }) => {
    now += waitMs;
    const decision = takeToken(bucket, units, at, now);
    units = decision.units;
    at = decision.atMs;
    return decision.allowed ? null : decision.units;
  });
}

describe.each(databasesUnderTest())('the database token bucket decides as takeToken, on %s', (dialect) => {
  let t: TestApp;
  let keyId: string;

  beforeAll(async () => {
    t = await startTestApp(dialect);
    const key = await insertSpendKey(t.storage.db, { merchantId: t.merchant.merchantId, walletId: t.merchant.walletId, connectionId: null, settings: { name: 'bucket' } }, new Date());
    keyId = key.row.id;
  });
  afterAll(async () => {
    await t?.close();
  });

  it('the same decision for every take, refused at the same level', async () => {
    await fc.assert(
      fc.asyncProperty(spec, steps, async (bucket, walk) => {
        const t0 = 1_000_000;
        await t.storage.db.updateTable('spend_keys').set({ bucket_units: BigInt(bucketCapacity(bucket)), bucket_at_ms: BigInt(t0) }).where('id', '=', keyId).execute();
        let now = t0;
        const got: (number | null)[] = [];
        for (const { waitMs } of walk) {
          now += waitMs;
          const outcome = await takeTokenInDatabase(t.storage.db, keyId, bucket, now);
          got.push(outcome.taken ? null : outcome.level);
        }
        expect(got).toEqual(expected(bucket, t0, walk));
      }),
      { numRuns: 30 },
    );
  });
});

describe.runIf(process.env.TEST_REDIS_URL)('the Redis token bucket decides as takeToken', () => {
  let redis: Redis;
  let run = 0;

  beforeAll(() => {
    redis = new Redis(process.env.TEST_REDIS_URL!);
    defineTakeToken(redis);
  });
  afterAll(async () => {
    await redis?.quit();
  });

  it('the same decision for every take, refused at the same level', async () => {
    await fc.assert(
      fc.asyncProperty(spec, steps, async (bucket, walk) => {
        const name = `tollgate:test:bucket:${process.pid}:${Date.now()}:${run++}`;
        // A bucket the script has not seen starts full at its first take's time.
        const t0 = 1_000_000 + walk[0]!.waitMs;
        const shifted = [{ waitMs: 0 }, ...walk.slice(1)];
        let now = t0;
        const got: (number | null)[] = [];
        for (const { waitMs } of shifted) {
          now += waitMs;
          got.push(await takeTokenInRedis(redis, name, bucket, now));
        }
        await redis.del(name);
        expect(got).toEqual(expected(bucket, t0, shifted));
      }),
      { numRuns: 30 },
    );
  });
});
