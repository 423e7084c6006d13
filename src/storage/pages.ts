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

/**
 * Inserts `row` into a merchant's table unless the merchant already has `max` rows there. The
 * merchant's row is locked first (PostgreSQL; SQLite's write transactions are serial anyway), so
 * two concurrent creates cannot both see room for one more.
 */
export async function insertWithinMerchantLimit<T extends 'webhooks' | 'alerts'>(
  storage: Storage,
  table: T,
  max: number,
  row: Database[T] & { merchant_id: string },
): Promise<Database[T] | 'limit_reached'> {
  return storage.db.transaction().execute(async (trx) => {
    await trx
      .selectFrom('merchants')
      .select('id')
      .where('id', '=', row.merchant_id)
      .$call((q) => (storage.dialect === 'postgres' ? q.forUpdate() : q))
      .execute();
    const { count } = await trx
      .selectFrom(table as 'alerts')
      .select((eb) => eb.fn.countAll<string | number>().as('count'))
      .where('merchant_id', '=', row.merchant_id)
      .executeTakeFirstOrThrow();
    if (Number(count) >= max) return 'limit_reached';
    await trx.insertInto(table as 'alerts').values(row as Database['alerts']).execute();
    return row;
  });
}
