/**
 * What every newest-first list shares: ids sort by creation time, so a page is the rows below the
 * cursor (the last id shown) in descending id order, plus one extra row that only says whether
 * more exist (`toPage` in http/pagination.ts drops it).
 */
import { sql, type SelectQueryBuilder } from 'kysely';
import type { Storage } from './db.ts';
import type { Database } from './schema.ts';

export type PageRequest = { cursor?: string | undefined; limit: number };

/** Narrows a list query to one page; `idColumn` names the id when the query joins tables. */
export function newestFirstPage<DB, TB extends keyof DB, O>(
  query: SelectQueryBuilder<DB, TB, O>,
  page: PageRequest,
  idColumn = 'id',
): SelectQueryBuilder<DB, TB, O> {
  const id = sql.ref(idColumn);
  return query
    .$if(page.cursor !== undefined, (q) => q.where(id, '<', page.cursor!))
    .orderBy(id, 'desc')
    .limit(page.limit + 1);
}

/** Tables whose rows belong to one merchant. */
type MerchantTable = {
  [T in keyof Database]: Database[T] extends { id: string; merchant_id: string } ? T : never;
}[keyof Database];

/**
 * Whether the merchant has (or had: revoked and deleted rows count) a row with this id: what a
 * cursor must name to page through that merchant's list.
 */
export async function merchantHasRow(storage: Storage, table: MerchantTable, merchantId: string, id: string): Promise<boolean> {
  const row = await storage.db
    .selectFrom(table as 'meters')
    .select('id')
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .executeTakeFirst();
  return row !== undefined;
}
