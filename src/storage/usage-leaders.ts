/**
 * The overview's "top customers" and "top models" for a usage range: the same sums as GET /usage,
 * grouped by customer or by model, from the daily rollups for the range's whole UTC days and the
 * finer data at its two edges (decision 0042). Both count exactly the records GET /usage counts: settled
 * or failed ones (never pending) created in [range.startMs, range.endMs).
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import { DAY_MS, type UsageRange } from '../domain/usage-window.ts';
import type { Database } from './schema.ts';
import { CARRIED_SUMS, ROLLUP_SUMS } from './rollups.ts';
import { carriedSumColumns, carriedSumForOrdering, carryOf, exactSumOf } from './exact-sum.ts';
import { emptySums, isoOf, type UsageSums } from './usage.ts';

/** What each rollup sum adds up, read from the records themselves (as the rollups are written). */
const RECORD_EXPRESSIONS: Record<(typeof ROLLUP_SUMS)[number], RawBuilder<unknown>> = {
  requests: sql`1`,
  tokens: sql`requests.input_tokens + requests.output_tokens`,
  usage_cost: sql`requests.input_cost + requests.output_cost`,
  fee: sql`requests.fee_amount`,
  service_charge: sql`requests.service_charge_amount`,
  request_cost: sql`requests.total_request_cost`,
  wallet_cost: sql`requests.total_wallet_cost`,
  merchant_cost: sql`requests.total_merchant_cost`,
};

export type UsageLeader = { key: string; sums: UsageSums };

/** One row of exactSumColumns parts per rollup sum, and the group's key. */
type PartsRow = { key: string | null } & Record<string, unknown>;

/** A union part's rollup sums with their carries, as a rollup table stores them. */
const STORED_SUMS = [...ROLLUP_SUMS, ...CARRIED_SUMS.map(carryOf)];

/**
 * The union's sums as exact parts (exact-sum.ts): a customer's or a model's total may pass 2^63
 * units. The count of requests, one per record, cannot.
 */
const SUMMED_PARTS = [sql<unknown>`sum(u.requests)`.as('requests_low'), ...CARRIED_SUMS.flatMap((f) => carriedSumColumns(`u.${f}`, f))];

/**
 * The rows as leaders, in the ranking's order decided on the exact sums: SQLite orders (and so
 * picks the top rows) by a double, which cannot tell apart totals within about 1e-15 of each other.
 */
function leadersOf(rows: readonly PartsRow[]): UsageLeader[] {
  const leaders = rows.map((row) => {
    const sums = emptySums();
    for (const f of ROLLUP_SUMS) sums[f] = exactSumOf(row, f);
    return { key: row.key ?? '', sums };
  });
  const descending = (a: bigint, b: bigint) => (a > b ? -1 : a < b ? 1 : 0);
  return leaders.sort(
    (a, b) => descending(a.sums.request_cost, b.sums.request_cost) || descending(a.sums.requests, b.sums.requests) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0),
  );
}

/**
 * A range split at UTC midnights (decision 0042): its whole UTC days, read from the daily rollups,
 * and the parts before the first and after the last (each under a day), read from the finer data.
 * Without a whole UTC day inside, the whole range is an edge.
 */
function splitAtUtcDays(range: UsageRange): { wholeDays: [string, string] | null; edges: [string, string][] } {
  const firstMidnight = Math.ceil(range.startMs / DAY_MS) * DAY_MS;
  const lastMidnight = Math.floor(range.endMs / DAY_MS) * DAY_MS;
  if (firstMidnight >= lastMidnight) return { wholeDays: null, edges: [[isoOf(range.startMs), isoOf(range.endMs)]] };
  const edges: [string, string][] = [];
  if (range.startMs < firstMidnight) edges.push([isoOf(range.startMs), isoOf(firstMidnight)]);
  if (lastMidnight < range.endMs) edges.push([isoOf(lastMidnight), isoOf(range.endMs)]);
  return { wholeDays: [isoOf(firstMidnight), isoOf(lastMidnight)], edges };
}

/** Rows of one dimension of the daily rollups over whole UTC days, as (key, sums...) for the union below. */
function dailyRows(db: Kysely<Database>, merchantId: string, dimension: 'customer' | 'model', days: [string, string]) {
  return db
    .selectFrom('usage_rollups_by_day')
    .select(['key', ...STORED_SUMS])
    .where('merchant_id', '=', merchantId)
    .where('dimension', '=', dimension)
    .where('day_start', '>=', days[0])
    .where('day_start', '<', days[1]);
}

/** One part of a leaders union: rows of (key, the rollup sums and carries), whichever table they come from. */
type UnionPart = ReturnType<typeof dailyRows>;

/** The groups of the union ranked: exact sums per key, highest request cost first, then most requests, then key. */
async function ranked(db: Kysely<Database>, parts: UnionPart[], limit: number): Promise<UsageLeader[]> {
  const [first, ...rest] = parts;
  if (!first) return [];
  const union = rest.reduce((q, part) => q.unionAll(part), first);
  const rows = await db
    .selectFrom(union.as('u'))
    .select(['u.key as key', ...SUMMED_PARTS])
    .groupBy('u.key')
    .orderBy(carriedSumForOrdering('u.request_cost'), 'desc')
    .orderBy(sql`sum(u.requests)`, 'desc')
    .orderBy('u.key')
    .limit(limit)
    .execute();
  return leadersOf(rows as unknown as PartsRow[]);
}

/**
 * The customers with the highest total request cost in the range (records without a customer
 * left out): daily rollups for its whole UTC days, the 15-minute rollups at its edges.
 */
export async function topCustomers(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  return leaders(db, merchantId, 'customer', range, limit, (from, to) =>
    db
      .selectFrom('usage_rollups')
      .select(['connection_id as key', ...STORED_SUMS])
      .where('merchant_id', '=', merchantId)
      .where('bucket_start', '>=', from)
      .where('bucket_start', '<', to)
      .where('connection_id', '!=', ''),
  );
}

/**
 * The models with the highest total request cost in the range; records that name no model are
 * grouped under the key ''. Daily rollups for its whole UTC days; at its edges the records,
 * through the (merchant_id, created_at) index.
 */
export async function topModels(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  return leaders(db, merchantId, 'model', range, limit, (from, to) =>
    db
      .selectFrom('requests')
      .select([
        sql<string>`coalesce(requests.model, '')`.as('key'),
        ...ROLLUP_SUMS.map((f) => RECORD_EXPRESSIONS[f].as(f)),
        // A record's own amounts fit their columns: it carries nothing (typed, for PostgreSQL's union).
        ...CARRIED_SUMS.map((f) => sql<null>`cast(null as bigint)`.as(carryOf(f))),
      ])
      .where('requests.merchant_id', '=', merchantId)
      .where('requests.created_at', '>=', from)
      .where('requests.created_at', '<', to)
      .where('requests.status', '!=', 'pending'),
  );
}

/**
 * The leaders of one dimension over a range: the daily rollups for its whole UTC days and, for
 * each edge, the rows `edgeRows` reads from the finer data, ranked together.
 */
function leaders(
  db: Kysely<Database>,
  merchantId: string,
  dimension: 'customer' | 'model',
  range: UsageRange,
  limit: number,
  edgeRows: (from: string, to: string) => unknown,
): Promise<UsageLeader[]> {
  const { wholeDays, edges } = splitAtUtcDays(range);
  const parts = [
    ...(wholeDays ? [dailyRows(db, merchantId, dimension, wholeDays)] : []),
    ...edges.map(([from, to]) => edgeRows(from, to)),
  ] as UnionPart[];
  return ranked(db, parts, limit);
}
