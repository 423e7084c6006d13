/**
 * Read side of request records: the filtered, newest-first list behind GET /requests, and the
 * filter conditions GET /usage shares with it.
 */
import { expressionBuilder, sql, type Expression, type Kysely, type SqlBool } from 'kysely';
import type { RequestRow } from './requests.ts';
import type { Database } from './schema.ts';

export type MetadataPair = readonly [key: string, value: string];

/** Filters of GET /requests and GET /usage; metadata pairs are ANDed. */
export type RequestFilters = {
  connectionId?: string;
  meterId?: string;
  metadata: readonly MetadataPair[];
  /** The dashboard's log also filters by status and creation time ([createdFrom, createdBefore), ISO UTC). */
  status?: 'pending' | 'completed' | 'error';
  createdFrom?: string;
  createdBefore?: string;
};

/** The internal primary key of a record named by its caller-chosen request_id. */
export async function findRequestPk(db: Kysely<Database>, merchantId: string, requestId: string): Promise<string | undefined> {
  const row = await db
    .selectFrom('requests')
    .select('id')
    .where('merchant_id', '=', merchantId)
    .where('request_id', '=', requestId)
    .executeTakeFirst();
  return row?.id;
}

/**
 * Conditions on `requests` for every filter except the metadata pair that drives the query
 * (see below); `pairs` are the pairs still to check, one EXISTS each.
 */
export function requestConditions(
  merchantId: string,
  filters: RequestFilters,
  pairs: readonly MetadataPair[],
): Expression<SqlBool> {
  const eb = expressionBuilder<Database, 'requests'>();
  const conditions: Expression<SqlBool>[] = [eb('requests.merchant_id', '=', merchantId)];
  if (filters.connectionId !== undefined) conditions.push(eb('requests.connection_id', '=', filters.connectionId));
  if (filters.meterId !== undefined) conditions.push(eb('requests.meter_id', '=', filters.meterId));
  if (filters.status !== undefined) conditions.push(eb('requests.status', '=', filters.status));
  if (filters.createdFrom !== undefined) conditions.push(eb('requests.created_at', '>=', filters.createdFrom));
  if (filters.createdBefore !== undefined) conditions.push(eb('requests.created_at', '<', filters.createdBefore));
  for (const [key, value] of pairs) {
    conditions.push(
      eb.exists(
        eb
          .selectFrom('request_metadata as m')
          .select(sql.lit(1).as('one'))
          // The merchant first, as in every query on a per-request table (decision 0041); it also
          // makes the check a lookup in the (merchant, key, value, request) index.
          .where('m.merchant_id', '=', merchantId)
          .whereRef('m.request_pk', '=', 'requests.id')
          .where('m.key', '=', key)
          .where('m.value', '=', value),
      ),
    );
  }
  return eb.and(conditions);
}

/**
 * One page (plus one row, to tell whether more exist) of the merchant's records, newest first by
 * internal id, strictly before `beforePk` when given.
 *
 * With metadata filters the query is driven by the first pair's rows in `request_metadata`
 * (index on merchant, key, value, request_pk: already in id order), so a rare pair does not
 * scan every record and a common one does not sort them; the other pairs are EXISTS checks.
 */
export async function listRequests(
  db: Kysely<Database>,
  merchantId: string,
  filters: RequestFilters,
  page: { beforePk?: string; limit: number },
): Promise<RequestRow[]> {
  const [first, ...rest] = filters.metadata;
  if (!first) {
    return db
      .selectFrom('requests')
      .selectAll()
      .where(requestConditions(merchantId, filters, []))
      .$if(page.beforePk !== undefined, (q) => q.where('requests.id', '<', page.beforePk!))
      .orderBy('requests.id', 'desc')
      .limit(page.limit + 1)
      .execute();
  }
  return db
    .selectFrom('request_metadata as m0')
    .innerJoin('requests', 'requests.id', 'm0.request_pk')
    .selectAll('requests')
    .where('m0.merchant_id', '=', merchantId)
    .where('m0.key', '=', first[0])
    .where('m0.value', '=', first[1])
    .where(requestConditions(merchantId, filters, rest))
    .$if(page.beforePk !== undefined, (q) => q.where('m0.request_pk', '<', page.beforePk!))
    .orderBy('m0.request_pk', 'desc')
    .limit(page.limit + 1)
    .execute();
}
