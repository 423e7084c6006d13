/**
 * Aggregates behind GET /usage. Every path returns sums per 15-minute UTC bucket, which are then
 * folded into the report's local days in JS: a day at any quarter-hour offset is a whole number
 * of buckets, and the SQL stays the same on SQLite and PostgreSQL (no timezone arithmetic).
 */
import { sql, type Kysely } from 'kysely';
import { dayIndexOf, type UsageRange } from '../domain/usage-window.ts';
import { requestConditions, type MetadataPair, type RequestFilters } from './request-queries.ts';
import type { Database, UsageRollupsGroupedTable } from './schema.ts';
import type { Storage } from './db.ts';
import { CARRIED_SUMS, ROLLUP_SUMS } from './rollups.ts';
import { carriedSumColumns, carriedTotal, carryOf, exactSumColumns, exactSumOf } from './exact-sum.ts';

/** A usage report's sums are the rollups' accumulating columns (ROLLUP_SUMS), by the same names. */
type UsageField = (typeof ROLLUP_SUMS)[number];

/** Counts and money (1e-10 units), all exact bigints. */
export type UsageSums = Record<UsageField, bigint>;

type BucketRow = { bucket: string } & UsageSums;

export function emptySums(): UsageSums {
  return Object.fromEntries(ROLLUP_SUMS.map((f) => [f, 0n])) as UsageSums;
}

export function addSums(into: UsageSums, add: Record<UsageField, unknown>): void {
  for (const f of ROLLUP_SUMS) into[f] += toBigInt(add[f]);
}

/** SUM over BIGINT is NUMERIC on PostgreSQL (a string) and INTEGER on SQLite (a bigint). */
function toBigInt(v: unknown): bigint {
  if (v === null || v === undefined) return 0n;
  return typeof v === 'bigint' ? v : BigInt(String(v));
}

/** Sums per day of `range`, in the order of `range.days`. */
export async function usageByDay(
  storage: Storage,
  merchantId: string,
  range: UsageRange,
  filters: RequestFilters,
): Promise<UsageSums[]> {
  return foldIntoDays(range, await bucketsFor(storage.db, merchantId, range, filters));
}

/**
 * Which rollup a report reads (decision 0042): one group (everything, a customer, a meter or a
 * metadata pair) reads usage_rollups_grouped, at most 96 rows a day; a customer and a meter
 * together, or a pair with either, read the finer rollups that carry both; two or more pairs read
 * the records, driven by the pair with the fewest requests in the range.
 */
async function bucketsFor(db: Kysely<Database>, merchantId: string, range: UsageRange, filters: RequestFilters): Promise<BucketRow[]> {
  const [first, ...rest] = filters.metadata;
  const group = singleGroupOf(filters);
  if (group) return bucketsFromGroup(db, merchantId, range, group);
  if (!first) return bucketsFromRollups(db, merchantId, range, filters);
  if (rest.length === 0) return bucketsFromRollups(db, merchantId, range, filters, first);
  const pairs = await rarestFirst(db, merchantId, range, filters.metadata);
  return bucketsFromRecords(db, merchantId, range, { ...filters, metadata: pairs });
}

type Group = Pick<UsageRollupsGroupedTable, 'dimension' | 'key' | 'value'>;

/** The one group of usage_rollups_grouped the filters select, or undefined when they name more than one dimension. */
function singleGroupOf(filters: RequestFilters): Group | undefined {
  const named = [filters.connectionId, filters.meterId, ...filters.metadata].filter((f) => f !== undefined).length;
  if (named > 1) return undefined;
  if (filters.connectionId !== undefined) return { dimension: 'customer', key: filters.connectionId, value: '' };
  if (filters.meterId !== undefined) return { dimension: 'meter', key: filters.meterId, value: '' };
  const [pair] = filters.metadata;
  if (pair) return { dimension: 'metadata', key: pair[0], value: pair[1] };
  return { dimension: 'total', key: '', value: '' };
}

/** One group's rows of usage_rollups_grouped in the range: a primary-key range scan. */
function groupRows(db: Kysely<Database>, merchantId: string, range: UsageRange, group: Group) {
  return db
    .selectFrom('usage_rollups_grouped')
    .where('merchant_id', '=', merchantId)
    .where('dimension', '=', group.dimension)
    .where('key', '=', group.key)
    .where('value', '=', group.value)
    .where('bucket_start', '>=', isoOf(range.startMs))
    .where('bucket_start', '<', isoOf(range.endMs));
}

async function bucketsFromGroup(db: Kysely<Database>, merchantId: string, range: UsageRange, group: Group): Promise<BucketRow[]> {
  const rows = await groupRows(db, merchantId, range, group)
    .select(['bucket_start as bucket', ...ROLLUP_SUMS, ...CARRIED_SUMS.map(carryOf)])
    .execute();
  return rows.map((row) => {
    const sums = emptySums();
    sums.requests = toBigInt(row.requests);
    for (const f of CARRIED_SUMS) sums[f] = carriedTotal(row[f], row[carryOf(f)]);
    return { bucket: row.bucket, ...sums };
  });
}

/** Rows of a bucket and the parts of its exact sums (exact-sum.ts) as bucket rows. */
function summedBuckets(rows: readonly object[]): BucketRow[] {
  return rows.map((row) => {
    const sums = emptySums();
    for (const f of ROLLUP_SUMS) sums[f] = exactSumOf(row, f);
    return { bucket: (row as { bucket: string }).bucket, ...sums };
  });
}

/**
 * The pairs ordered by how many requests carry each in the range (fewest first), counted from
 * usage_rollups_grouped: the records path reads only the first pair's records, so a report with a
 * rare pair and a common one costs the rare one's matches whichever order the caller gave.
 */
async function rarestFirst(db: Kysely<Database>, merchantId: string, range: UsageRange, pairs: readonly MetadataPair[]): Promise<MetadataPair[]> {
  const counted = await Promise.all(
    pairs.map(async (pair) => {
      const row = await groupRows(db, merchantId, range, { dimension: 'metadata', key: pair[0], value: pair[1] })
        .select((eb) => eb.fn.sum<string | number | bigint | null>('requests').as('requests'))
        .executeTakeFirst();
      return { pair, requests: toBigInt(row?.requests) };
    }),
  );
  return counted.sort((a, b) => (a.requests < b.requests ? -1 : a.requests > b.requests ? 1 : 0)).map((c) => c.pair);
}

function foldIntoDays(range: UsageRange, buckets: readonly BucketRow[]): UsageSums[] {
  const days = range.days.map(() => emptySums());
  for (const b of buckets) {
    const index = dayIndexOf(range, Date.parse(b.bucket));
    // The queries are bounded by the range; a row outside it would be a bug, not usage.
    if (index !== null) addSums(days[index]!, b);
  }
  return days;
}

export const isoOf = (ms: number) => new Date(ms).toISOString();

/**
 * The rollups already hold 15-minute sums per (connection, meter) — and, in
 * `usage_rollups_by_metadata`, per metadata pair too (its primary key leads with merchant, key,
 * value, bucket); only the filters remain.
 */
async function bucketsFromRollups(
  db: Kysely<Database>,
  merchantId: string,
  range: UsageRange,
  filters: RequestFilters,
  pair?: MetadataPair,
): Promise<BucketRow[]> {
  const rows = await db
    .selectFrom(pair ? 'usage_rollups_by_metadata' : 'usage_rollups')
    .select(['bucket_start as bucket', sql<unknown>`sum(requests)`.as('requests_low'), ...CARRIED_SUMS.flatMap((f) => carriedSumColumns(f, f))])
    .where('merchant_id', '=', merchantId)
    // Only the per-pair table has these columns, and only it is read when there is a pair.
    .$if(pair !== undefined, (q) => q.where(sql.ref('key'), '=', pair![0]).where(sql.ref('value'), '=', pair![1]))
    .where('bucket_start', '>=', isoOf(range.startMs))
    .where('bucket_start', '<', isoOf(range.endMs))
    .$if(filters.connectionId !== undefined, (q) => q.where('connection_id', '=', filters.connectionId!))
    .$if(filters.meterId !== undefined, (q) => q.where('meter_id', '=', filters.meterId!))
    .groupBy('bucket_start')
    .execute();
  return summedBuckets(rows);
}

/**
 * The 15-minute bucket of `requests.created_at` as rollup text ("…T10:15:00.000Z"). Timestamps
 * are ISO text, so the bucket is cut out of the string; literals only (no parameters), so the
 * same expression can be repeated in GROUP BY on PostgreSQL.
 */
const bucketOfCreatedAt = sql<string>`substr(requests.created_at, 1, 14) || case
  when substr(requests.created_at, 15, 2) < '15' then '00'
  when substr(requests.created_at, 15, 2) < '30' then '15'
  when substr(requests.created_at, 15, 2) < '45' then '30'
  else '45' end || ':00.000Z'`;

/** The same sums as a rollup row, computed exactly (exact-sum.ts) from the records themselves. */
const RECORD_SUMS = [
  sql<unknown>`count(*)`.as('requests_low'),
  ...exactSumColumns(sql`requests.input_tokens + requests.output_tokens`, 'tokens'),
  ...exactSumColumns(sql`requests.input_cost + requests.output_cost`, 'usage_cost'),
  ...exactSumColumns('requests.fee_amount', 'fee'),
  ...exactSumColumns('requests.service_charge_amount', 'service_charge'),
  ...exactSumColumns('requests.total_request_cost', 'request_cost'),
  ...exactSumColumns('requests.total_wallet_cost', 'wallet_cost'),
  ...exactSumColumns('requests.total_merchant_cost', 'merchant_cost'),
];

/**
 * Two or more metadata pairs are not in the rollups, so they read the records. The first pair drives
 * the query through `request_metadata` (index on merchant, key, value, created_at: only matching
 * rows in the range are touched); the other pairs are EXISTS checks on each record.
 */
async function bucketsFromRecords(
  db: Kysely<Database>,
  merchantId: string,
  range: UsageRange,
  filters: RequestFilters,
): Promise<BucketRow[]> {
  const [first, ...rest] = filters.metadata;
  if (!first) throw new Error('bucketsFromRecords needs at least one metadata pair');
  const rows = await db
    .selectFrom('request_metadata as m0')
    .innerJoin('requests', 'requests.id', 'm0.request_pk')
    .select([bucketOfCreatedAt.as('bucket'), ...RECORD_SUMS])
    .where('m0.merchant_id', '=', merchantId)
    .where('m0.key', '=', first[0])
    .where('m0.value', '=', first[1])
    .where('m0.created_at', '>=', isoOf(range.startMs))
    .where('m0.created_at', '<', isoOf(range.endMs))
    // A pending (forwarded, not yet settled) record is not usage yet: the rollups skip it too.
    .where('requests.status', '!=', 'pending')
    .where(requestConditions(merchantId, filters, rest))
    .groupBy(bucketOfCreatedAt)
    .execute();
  return summedBuckets(rows);
}
