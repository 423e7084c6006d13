/**
 * The overview's "top customers" and "top models" for a usage range: the same sums as GET /usage,
 * grouped by customer (from the rollups GET /usage reads) or by model (from the records, which
 * the rollups do not split by model). Both count exactly the records GET /usage counts: settled
 * or failed ones (never pending) created in [range.startMs, range.endMs).
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { UsageRange } from '../domain/usage-window.ts';
import type { Database } from './schema.ts';
import { ROLLUP_SUMS } from './rollups.ts';
import { exactSumColumns, exactSumForOrdering, exactSumOf } from './exact-sum.ts';
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

/** The rollup sums as exact parts (exact-sum.ts): a customer's or a model's total may pass 2^63 units. */
function sumParts(expressionOf: (field: (typeof ROLLUP_SUMS)[number]) => string | RawBuilder<unknown>) {
  return ROLLUP_SUMS.flatMap((f) => exactSumColumns(expressionOf(f), f));
}

function leadersOf(rows: readonly PartsRow[]): UsageLeader[] {
  return rows.map((row) => {
    const sums = emptySums();
    for (const f of ROLLUP_SUMS) sums[f] = exactSumOf(row, f);
    return { key: row.key ?? '', sums };
  });
}

/** The customers with the highest total request cost in the range (records without a customer left out). */
export async function topCustomers(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  const rows = await db
    .selectFrom('usage_rollups')
    .select(['connection_id as key', ...sumParts((f) => f)])
    .where('merchant_id', '=', merchantId)
    .where('bucket_start', '>=', isoOf(range.startMs))
    .where('bucket_start', '<', isoOf(range.endMs))
    .where('connection_id', '!=', '')
    .groupBy('connection_id')
    .orderBy(exactSumForOrdering('request_cost'), 'desc')
    .orderBy(sql`sum(requests)`, 'desc')
    .orderBy('connection_id')
    .limit(limit)
    .execute();
  return leadersOf(rows as unknown as PartsRow[]);
}

/**
 * The models with the highest total request cost in the range; records that name no model are
 * grouped under the key ''. Reads the records through the (merchant_id, created_at) index.
 */
export async function topModels(db: Kysely<Database>, merchantId: string, range: UsageRange, limit: number): Promise<UsageLeader[]> {
  const model = sql<string>`coalesce(requests.model, '')`;
  const rows = await db
    .selectFrom('requests')
    .select([model.as('key'), ...sumParts((f) => RECORD_EXPRESSIONS[f])])
    .where('requests.merchant_id', '=', merchantId)
    .where('requests.created_at', '>=', isoOf(range.startMs))
    .where('requests.created_at', '<', isoOf(range.endMs))
    .where('requests.status', '!=', 'pending')
    .groupBy(model)
    .orderBy(exactSumForOrdering(RECORD_EXPRESSIONS.request_cost), 'desc')
    .orderBy(sql`count(*)`, 'desc')
    .orderBy(model)
    .limit(limit)
    .execute();
  return leadersOf(rows as unknown as PartsRow[]);
}
