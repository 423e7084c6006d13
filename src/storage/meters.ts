import type { Transaction } from 'kysely';
import type { Storage } from './db.ts';
import { isUniqueViolation } from './errors.ts';
import type { Database, MetersTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type MeterRow = MetersTable;

export async function insertMeter(storage: Storage, row: MeterRow): Promise<'ok' | 'slug_taken'> {
  try {
    await storage.db.insertInto('meters').values(row).execute();
    return 'ok';
  } catch (e) {
    if (isUniqueViolation(e)) return 'slug_taken';
    throw e;
  }
}

export async function findMeter(storage: Storage, merchantId: string, id: string): Promise<MeterRow | undefined> {
  return storage.db
    .selectFrom('meters')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
}

export async function findMeterBySlug(storage: Storage, merchantId: string, slug: string) {
  return storage.db
    .selectFrom('meters')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('slug', '=', slug)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
}

export async function listMeters(storage: Storage, merchantId: string, cursor: string | undefined, limit: number) {
  return storage.db
    .selectFrom('meters')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('deleted_at', 'is', null)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

export async function updateMeter(
  storage: Storage,
  merchantId: string,
  id: string,
  changes: Partial<Pick<MeterRow, 'name' | 'tiers'>>,
): Promise<MeterRow | undefined> {
  if (Object.keys(changes).length > 0) {
    await storage.db
      .updateTable('meters')
      .set(changes)
      .where('merchant_id', '=', merchantId)
      .where('id', '=', id)
      .where('deleted_at', 'is', null)
      .execute();
  }
  return findMeter(storage, merchantId, id);
}

export async function softDeleteMeter(storage: Storage, merchantId: string, id: string, at: string): Promise<boolean> {
  const result = await storage.db
    .updateTable('meters')
    .set({ deleted_at: at })
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

/** The older request body and forward token name a meter (product) by its secret. */
export async function findMeterBySecret(storage: Storage, merchantId: string, secret: string) {
  return storage.db
    .selectFrom('meters')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('secret', '=', secret)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
}

/** The meters by id that are not deleted, read inside the caller's transaction (a charge batch's). */
export async function readLiveMeters(trx: Transaction<Database>, ids: string[]): Promise<Map<string, MeterRow>> {
  if (ids.length === 0) return new Map();
  const rows = await trx.selectFrom('meters').selectAll().where('id', 'in', ids).where('deleted_at', 'is', null).execute();
  return new Map(rows.map((row) => [row.id, row]));
}
