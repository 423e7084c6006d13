import fc from 'fast-check';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dayWindow, DAY_MS } from '../../src/domain/usage-window.ts';
import { up as createGroupedRollups } from '../../src/storage/migrations/0022_usage_rollups_grouped.ts';
import { up as createDailyRollups } from '../../src/storage/migrations/0023_usage_rollups_per_day.ts';
import type { RequestFilters } from '../../src/storage/request-queries.ts';
import { insertRequestRecord, type RequestRow } from '../../src/storage/requests.ts';
import { MAX_AMOUNT_UNITS } from '../../src/domain/money.ts';
import { carriedTotal, carryOf } from '../../src/storage/exact-sum.ts';
import { CARRIED_SUMS, ROLLUP_SUMS } from '../../src/storage/rollups.ts';
import { emptySums, usageByDay, type UsageSums } from '../../src/storage/usage.ts';
import { topCustomers, topModels } from '../../src/storage/usage-leaders.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const BASE_DAY = Math.floor(Date.parse('2026-03-01T00:00:00Z') / DAY_MS);
const CUSTOMERS = ['conn_a', 'conn_b', null] as const;
const METERS = ['meter_x', 'meter_y', null] as const;
const PAIRS = [['team', 'a'], ['team', 'b'], ['env', 'prod'], ['env', 'dev'], ['user', 'u1']] as const;

type Seed = {
  minute: number;
  second: number;
  customer: number;
  meter: number;
  pairs: number[];
  pending: boolean;
  amounts: bigint[];
  model: string | null;
};

/**
 * Records over six days, at any second (so on and beside every quarter hour), with amounts up to
 * `max` units: the largest single amount (10^18) takes a quarter-hour's sums past 2^63, where the
 * rollups carry (decision 0042).
 */
const seedsUpTo = (max: bigint): fc.Arbitrary<Seed> => fc.record({
  minute: fc.integer({ min: 0, max: 6 * 24 * 60 - 1 }),
  second: fc.constantFrom(0, 0, 59, 30),
  customer: fc.integer({ min: 0, max: 2 }),
  meter: fc.integer({ min: 0, max: 2 }),
  pairs: fc.uniqueArray(fc.integer({ min: 0, max: PAIRS.length - 1 }), { maxLength: 3, selector: (i) => PAIRS[i]![0] }),
  pending: fc.integer({ min: 0, max: 9 }).map((n) => n < 2),
  amounts: fc.array(fc.oneof(fc.bigInt({ min: 0n, max: 2n ** 50n }), fc.bigInt({ min: max - 2n ** 20n, max })), { minLength: 9, maxLength: 9 }),
  model: fc.constantFrom('gpt-4o', 'claude', null),
});
const seedArb = seedsUpTo(MAX_AMOUNT_UNITS);

/** Filters the report accepts: none, one customer, one meter, pairs, and their combinations. */
const filtersArb: fc.Arbitrary<RequestFilters> = fc
  .record({
    customer: fc.option(fc.constantFrom('conn_a', 'conn_b', 'conn_none'), { nil: undefined }),
    meter: fc.option(fc.constantFrom('meter_x', 'meter_y'), { nil: undefined }),
    pairs: fc.uniqueArray(fc.integer({ min: 0, max: PAIRS.length - 1 }), { maxLength: 3 }),
  })
  .map(({ customer, meter, pairs }) => ({
    ...(customer === undefined ? {} : { connectionId: customer }),
    ...(meter === undefined ? {} : { meterId: meter }),
    metadata: pairs.map((i) => PAIRS[i]!),
  }));

/** A range of whole local days at any quarter-hour offset within ±14:00. */
const rangeArb = fc
  .record({ offsetQuarters: fc.integer({ min: -56, max: 56 }), first: fc.integer({ min: -1, max: 6 }), length: fc.integer({ min: 1, max: 4 }) })
  .map(({ offsetQuarters, first, length }) => {
    const offsetMinutes = offsetQuarters * 15;
    const days = Array.from({ length }, (_, i) => dayWindow(BASE_DAY + first + i, offsetMinutes));
    return { offsetMinutes, days, startMs: days[0]!.startMs, endMs: days[days.length - 1]!.endMs };
  });

let serial = 0;

function recordOf(merchantId: string, seed: Seed): RequestRow {
  serial += 1;
  const [inTok, outTok, inCost, outCost, fee, service, , wallet, merchant] = seed.amounts as [bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint];
  const createdMs = BASE_DAY * DAY_MS + seed.minute * 60_000 + seed.second * 1000;
  return {
    id: `req_${String(serial).padStart(12, '0')}`,
    merchant_id: merchantId,
    request_id: `r-${serial}`,
    body_hash: null,
    status: seed.pending ? 'pending' : 'completed',
    connection_id: CUSTOMERS[seed.customer]!,
    meter_id: METERS[seed.meter]!,
    provider: 'openai',
    model: seed.model,
    requested_model: null,
    endpoint: 'POST /v1/chat/completions',
    provider_key_type: 'managed',
    response_id: null,
    provider_timestamp: null,
    metadata: JSON.stringify(Object.fromEntries(seed.pairs.map((i) => PAIRS[i]!))),
    // Up to what the API takes (a safe integer each), so a quarter-hour's tokens pass 2^63 too.
    input_tokens: inTok % BigInt(Number.MAX_SAFE_INTEGER),
    output_tokens: outTok % BigInt(Number.MAX_SAFE_INTEGER),
    cached_input_tokens: 0n,
    cache_write_input_tokens: 0n,
    reasoning_tokens: 0n,
    output_images: 0n,
    price_unit: 'tokens',
    input_characters: 0n,
    output_characters: 0n,
    input_seconds: '0',
    output_seconds: '0',
    input_cost: inCost,
    output_cost: outCost,
    base_cost_charged: 1,
    base_cost_payer: 'wallet',
    fee_amount: fee,
    rate_type: 'fixed',
    token_basis: 'input+output',
    breakdown: '{}',
    service_charge_amount: service,
    service_charge_payer: 'wallet',
    total_request_cost: wallet + merchant,
    total_wallet_cost: wallet,
    total_merchant_cost: merchant,
    usage_estimated: 0,
    created_at: new Date(createdMs).toISOString(),
    completed_at: new Date(createdMs).toISOString(),
  };
}

/** The report computed from the raw records: every non-pending record matching every filter, in the day holding it. */
function expectedDays(records: RequestRow[], range: { days: { startMs: number; endMs: number }[] }, filters: RequestFilters): UsageSums[] {
  return range.days.map((day) => {
    const sums = emptySums();
    for (const r of records) {
      const at = Date.parse(r.created_at);
      if (r.status === 'pending' || at < day.startMs || at >= day.endMs) continue;
      if (filters.connectionId !== undefined && r.connection_id !== filters.connectionId) continue;
      if (filters.meterId !== undefined && r.meter_id !== filters.meterId) continue;
      const metadata = JSON.parse(r.metadata) as Record<string, string>;
      if (!filters.metadata.every(([k, v]) => metadata[k] === v)) continue;
      addRecord(sums, r);
    }
    return sums;
  });
}

function addRecord(sums: UsageSums, r: RequestRow): void {
  sums.requests += 1n;
  sums.tokens += r.input_tokens + r.output_tokens;
  sums.usage_cost += r.input_cost + r.output_cost;
  sums.fee += r.fee_amount;
  sums.service_charge += r.service_charge_amount;
  sums.request_cost += r.total_request_cost;
  sums.wallet_cost += r.total_wallet_cost;
  sums.merchant_cost += r.total_merchant_cost;
}

/** The leaders computed from the raw records: non-pending records in the range, summed per key. */
function expectedLeaders(records: RequestRow[], range: { startMs: number; endMs: number }, keyOf: (r: RequestRow) => string | null): Map<string, UsageSums> {
  const byKey = new Map<string, UsageSums>();
  for (const r of records) {
    const at = Date.parse(r.created_at);
    const key = keyOf(r);
    if (r.status === 'pending' || at < range.startMs || at >= range.endMs || key === null) continue;
    const sums = byKey.get(key) ?? emptySums();
    addRecord(sums, r);
    byKey.set(key, sums);
  }
  return byKey;
}

type GroupedRow = Record<string, string>;

/**
 * A rollup table's rows of these merchants, every column as text (a carried sum and its carry as
 * the one total they hold), sorted by the table's key columns.
 */
async function rollupRows(db: Kysely<unknown>, table: string, keyColumns: string[], merchantIds: string[]): Promise<GroupedRow[]> {
  const rows = await (db as Kysely<Record<string, Record<string, unknown>>>)
    .selectFrom(table)
    .selectAll()
    .where('merchant_id', 'in', merchantIds)
    .execute();
  const carried = new Set<string>(CARRIED_SUMS);
  const text = rows.map((r) =>
    Object.fromEntries(
      Object.entries(r)
        .filter(([k]) => !k.endsWith('_carry'))
        .map(([k, v]) => [k, String(carried.has(k) ? carriedTotal(v, r[carryOf(k)]) : v)]),
    ),
  );
  const id = (r: GroupedRow) => JSON.stringify(keyColumns.map((c) => r[c]));
  return text.sort((a, b) => (id(a) < id(b) ? -1 : id(a) > id(b) ? 1 : 0));
}

const groupedRows = (db: Kysely<unknown>, merchantIds: string[]) =>
  rollupRows(db, 'usage_rollups_grouped', ['merchant_id', 'dimension', 'key', 'value', 'bucket_start'], merchantIds);
const dailyRows = (db: Kysely<unknown>, merchantIds: string[]) =>
  rollupRows(db, 'usage_rollups_by_day', ['merchant_id', 'dimension', 'day_start', 'key'], merchantIds);

/**
 * GET /usage reads usage_rollups_grouped for one group, the finer rollups for two dimensions and
 * the records (rarest pair first) for two or more pairs: for random records, filters, quarter-hour
 * offsets and ranges, every path gives exactly the sums of the raw records, day by day.
 */
describe.each(databasesUnderTest())('usage at the grain asked for on %s', (dialect) => {
  let t: TestApp;
  const merchants: string[] = [];

  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  async function seed(records: Seed[]): Promise<{ merchantId: string; rows: RequestRow[] }> {
    const merchantId = `m_grouped_${dialect}_${merchants.length}`;
    merchants.push(merchantId);
    const rows = records.map((s) => recordOf(merchantId, s));
    await t.storage.db.transaction().execute(async (trx) => {
      for (const row of rows) await insertRequestRecord(trx, t.storage.dialect, row);
    });
    return { merchantId, rows };
  }

  it('every report equals the raw records summed per local day, for any filters, offset and range', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(seedArb, { minLength: 1, maxLength: 40 }), fc.array(fc.tuple(rangeArb, filtersArb), { minLength: 4, maxLength: 8 }), async (seeds, queries) => {
        const { merchantId, rows } = await seed(seeds);
        for (const [range, filters] of queries) {
          expect(await usageByDay(t.storage, merchantId, range, filters)).toEqual(expectedDays(rows, range, filters));
        }
      }),
      { numRuns: 25 },
    );
  });

  it('top customers and models equal the raw records summed per key over any range, ranked by request cost', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(seedArb, { minLength: 1, maxLength: 40 }), fc.array(rangeArb, { minLength: 3, maxLength: 6 }), async (seeds, ranges) => {
        const { merchantId, rows } = await seed(seeds);
        for (const range of ranges) {
          const customers = await topCustomers(t.storage.db, merchantId, range, 100);
          const models = await topModels(t.storage.db, merchantId, range, 100);
          expect(new Map(customers.map((c) => [c.key, c.sums]))).toEqual(expectedLeaders(rows, range, (r) => r.connection_id));
          expect(new Map(models.map((m) => [m.key, m.sums]))).toEqual(expectedLeaders(rows, range, (r) => r.model ?? ''));
          for (const leaders of [customers, models]) {
            const costs = leaders.map((l) => l.sums.request_cost);
            expect(costs).toEqual([...costs].sort((a, b) => (a > b ? -1 : a < b ? 1 : 0)));
          }
        }
      }),
      { numRuns: 20 },
    );
  });

  it('the migration backfills from the finer rollups exactly what the writers added', async () => {
    // Amounts the rollups held before they carried: the backfill ran on those, and its sums are
    // BIGINT. So the records of the runs above, at the bounds, are cleared first.
    for (const table of ['usage_rollups', 'usage_rollups_by_metadata', 'usage_rollups_grouped', 'usage_rollups_by_day', 'request_metadata', 'requests'] as const) {
      await t.storage.db.deleteFrom(table).where('merchant_id', 'in', merchants).execute();
    }
    await seed(fc.sample(seedsUpTo(2n ** 50n), { numRuns: 60, seed: 42 }));
    const written = await groupedRows(t.storage.db as unknown as Kysely<unknown>, merchants);
    expect(written.length).toBeGreaterThan(0);
    expect(written.every((r) => ROLLUP_SUMS.every((s) => /^-?\d+$/.test(r[s]!)))).toBe(true);

    await sql`drop table usage_rollups_grouped`.execute(t.storage.db);
    await createGroupedRollups(t.storage.db as unknown as Kysely<unknown>);
    expect(await groupedRows(t.storage.db as unknown as Kysely<unknown>, merchants)).toEqual(written);

    const daily = await dailyRows(t.storage.db as unknown as Kysely<unknown>, merchants);
    expect(daily.length).toBeGreaterThan(0);
    await sql`drop table usage_rollups_by_day`.execute(t.storage.db);
    await createDailyRollups(t.storage.db as unknown as Kysely<unknown>);
    expect(await dailyRows(t.storage.db as unknown as Kysely<unknown>, merchants)).toEqual(daily);
  });
});
