/**
 * The overview's "top customers" and "top models" for a usage range: the same sums as GET /usage,
 * grouped by customer (from the rollups GET /usage reads) or by model (from the records, which
 * the rollups do not split by model). Both count exactly the records GET /usage counts: settled
 * or failed ones (never pending) created in [range.startMs, range.endMs).
 */
import { sql, type Kysely } from 'kysely';
import type { UsageRange } from '../domain/usage-window.ts';
import type { Database } from './schema.ts';
import { ROLLUP_SUMS } from './rollups.ts';
import { addSums, emptySums, isoOf, RECORD_SUMS, type UsageSums } from './usage.ts';

export type UsageLeader = { key: string; sums: UsageSums };

type SumsRow = { key: string | null } & Record<(typeof ROLLUP_SUMS)[number], unknown>;

function leadersOf(rows: readonly SumsRow[]): UsageLeader[] {
  return rows.map((row) => {
    const sums = emptySums();
    addSums(sums, row);
    return { key: row.key ?? '', sums };
  });
}

/** The customers with the highest total request cost in the range (records without a customer left out). */
export async function topCustomers(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  const rows = await db
    .selectFrom('usage_rollups')
    .select((eb) => ['connection_id as key', ...ROLLUP_SUMS.map((f) => eb.fn.sum<string | number | bigint | null>(f).as(f))])
    .where('merchant_id', '=', merchantId)
    .where('bucket_start', '>=', isoOf(range.startMs))
    .where('bucket_start', '<', isoOf(range.endMs))
    .where('connection_id', '!=', '')
    .groupBy('connection_id')
    .orderBy(sql`sum(request_cost)`, 'desc')
    .orderBy(sql`sum(requests)`, 'desc')
    .orderBy('connection_id')
    .limit(limit)
    .execute();
  return leadersOf(rows);
}

/**
 * The models with the highest total request cost in the range; records that name no model are
 * grouped under the key ''. Reads the records through the (merchant_id, created_at) index.
 */
export async function topModels(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  const model = sql<string>`coalesce(requests.model, '')`;
  const rows = await db
    .selectFrom('requests')
    .select([model.as('key'), ...RECORD_SUMS])
    .where('requests.merchant_id', '=', merchantId)
    .where('requests.created_at', '>=', isoOf(range.startMs))
    .where('requests.created_at', '<', isoOf(range.endMs))
    .where('requests.status', '!=', 'pending')
    .groupBy(model)
    .orderBy(sql`sum(requests.total_request_cost)`, 'desc')
    .orderBy(sql`count(*)`, 'desc')
    .orderBy(model)
    .limit(limit)
    .execute();
  return leadersOf(rows as unknown as SumsRow[]);
}
