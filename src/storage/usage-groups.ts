import { sql } from 'kysely';
import type { Storage } from './db.ts';
import { exactSumColumns, exactSumForOrdering, exactSumOf } from './exact-sum.ts';

export const USAGE_GROUPINGS = ['model', 'customer', 'meter', 'metadata'] as const;
export type UsageGrouping = (typeof USAGE_GROUPINGS)[number];

/** One group's completed requests: how many, their tokens, fees and total cost (exact sums). */
export type UsageGroup = { key: string | null; requests: number; tokens: bigint; fee: bigint; total: bigint };

export type UsageGroupQuery = { from: string; before: string; by: UsageGrouping; metadataKey?: string };

const KEY_COLUMN = { model: 'requests.model', customer: 'requests.connection_id', meter: 'requests.meter_id' } as const;

/**
 * The merchant's completed requests created in [from, before), grouped by model, customer, meter
 * or the value of one metadata key (records without that key are left out), largest total first.
 */
export async function usageGroups(storage: Storage, merchantId: string, q: UsageGroupQuery): Promise<UsageGroup[]> {
  const sums = [
    sql<number>`count(*)`.as('requests'),
    ...exactSumColumns(sql`(requests.input_tokens + requests.output_tokens)`, 'tokens'),
    ...exactSumColumns('requests.fee_amount', 'fee'),
    ...exactSumColumns('requests.total_request_cost', 'total'),
  ];
  const base =
    q.by === 'metadata'
      ? storage.db
          .selectFrom('request_metadata as m')
          .innerJoin('requests', 'requests.id', 'm.request_pk')
          // The merchant first, as every query on a per-request table names it.
          .where('m.merchant_id', '=', merchantId)
          .where('m.key', '=', q.metadataKey ?? '')
          .select(sql<string | null>`m.value`.as('key'))
          .groupBy('m.value')
      : storage.db
          .selectFrom('requests')
          .select(sql<string | null>`${sql.ref(KEY_COLUMN[q.by])}`.as('key'))
          .groupBy(sql.ref(KEY_COLUMN[q.by]));
  const rows = await base
    .where('requests.merchant_id', '=', merchantId)
    .where('requests.status', '=', 'completed')
    .where('requests.created_at', '>=', q.from)
    .where('requests.created_at', '<', q.before)
    .select(sums)
    .orderBy(exactSumForOrdering('requests.total_request_cost'), 'desc')
    .execute();
  return rows.map((r) => ({
    key: r.key,
    requests: Number(r.requests),
    tokens: exactSumOf(r, 'tokens'),
    fee: exactSumOf(r, 'fee'),
    total: exactSumOf(r, 'total'),
  }));
}
