import type { Kysely } from 'kysely';
import { requestConditions, type RequestFilters } from './request-queries.ts';
import type { Database } from './schema.ts';

/**
 * The metadata keys the merchant's records matching `filters` carry, in order, at most `limit`:
 * an export makes one column of each, so its header can be written before its first row.
 */
export async function metadataKeysOf(db: Kysely<Database>, merchantId: string, filters: RequestFilters, limit: number): Promise<string[]> {
  const rows = await db
    .selectFrom('request_metadata as k')
    .innerJoin('requests', 'requests.id', 'k.request_pk')
    .select('k.key')
    .distinct()
    // The merchant first, as every query on a per-request table names it.
    .where('k.merchant_id', '=', merchantId)
    .where(requestConditions(merchantId, filters, filters.metadata))
    .orderBy('k.key')
    .limit(limit)
    .execute();
  return rows.map((r) => r.key);
}
