import type { Kysely } from 'kysely';
import type { Database, IdempotencyKeysTable } from './schema.ts';

export type IdempotencyRow = IdempotencyKeysTable;

/** Claims (scope, key) for a new request; false when a live row already holds it. */
export async function claimIdempotencyKey(
  db: Kysely<Database>,
  row: Omit<IdempotencyRow, 'state' | 'response_status' | 'response_body'>,
): Promise<boolean> {
  // An expired claim is dead weight: clear it so the key can be reused after 24 h.
  await db
    .deleteFrom('idempotency_keys')
    .where('scope', '=', row.scope)
    .where('key', '=', row.key)
    .where('expires_at', '<=', row.created_at)
    .execute();
  const result = await db
    .insertInto('idempotency_keys')
    .values({ ...row, state: 'in_flight', response_status: null, response_body: null })
    .onConflict((oc) => oc.columns(['scope', 'key']).doNothing())
    .executeTakeFirst();
  return Number(result.numInsertedOrUpdatedRows ?? 0n) === 1;
}

export async function findIdempotencyKey(db: Kysely<Database>, scope: string, key: string) {
  return db
    .selectFrom('idempotency_keys')
    .selectAll()
    .where('scope', '=', scope)
    .where('key', '=', key)
    .executeTakeFirst();
}

export async function completeIdempotencyKey(
  db: Kysely<Database>,
  scope: string,
  key: string,
  status: number,
  body: string,
): Promise<void> {
  await db
    .updateTable('idempotency_keys')
    .set({ state: 'done', response_status: status, response_body: body })
    .where('scope', '=', scope)
    .where('key', '=', key)
    .execute();
}

export async function releaseIdempotencyKey(db: Kysely<Database>, scope: string, key: string): Promise<void> {
  await db.deleteFrom('idempotency_keys').where('scope', '=', scope).where('key', '=', key).execute();
}

export async function purgeExpiredIdempotencyKeys(db: Kysely<Database>, nowIso: string): Promise<void> {
  await db.deleteFrom('idempotency_keys').where('expires_at', '<=', nowIso).execute();
}
