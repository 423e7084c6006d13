import type { Kysely } from 'kysely';
import type { Database, IdempotencyKeysTable } from './schema.ts';

export type IdempotencyRow = IdempotencyKeysTable;

/**
 * Identifies one claim of a key: a claim taken over after its lease ran out has another
 * `created_at`, so the abandoned request cannot overwrite or free it.
 */
export type IdempotencyClaim = { scope: string; key: string; created_at: string };

/**
 * Claims (scope, key) for a new request; false when a live row already holds it. An in-flight
 * row's `expires_at` is its lease; a finished one's is the end of its 24 h of replays.
 */
export async function claimIdempotencyKey(
  db: Kysely<Database>,
  row: Omit<IdempotencyRow, 'state' | 'response_status' | 'response_body'>,
): Promise<boolean> {
  // An expired row is dead weight, whether a finished response past its 24 h or a claim whose
  // lease ran out (its process died mid-request): clear it so the key can be used again.
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

/** Stores the claim's response for replays until `expiresAt`; false when the claim was taken over. */
export async function completeIdempotencyKey(
  db: Kysely<Database>,
  claim: IdempotencyClaim,
  response: { status: number; body: string; expiresAt: string },
): Promise<boolean> {
  const result = await db
    .updateTable('idempotency_keys')
    .set({ state: 'done', response_status: response.status, response_body: response.body, expires_at: response.expiresAt })
    .where('scope', '=', claim.scope)
    .where('key', '=', claim.key)
    .where('created_at', '=', claim.created_at)
    .where('state', '=', 'in_flight')
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

/** Frees the key for a retry, unless another request has taken the claim over. */
export async function releaseIdempotencyKey(db: Kysely<Database>, claim: IdempotencyClaim): Promise<void> {
  await db
    .deleteFrom('idempotency_keys')
    .where('scope', '=', claim.scope)
    .where('key', '=', claim.key)
    .where('created_at', '=', claim.created_at)
    .where('state', '=', 'in_flight')
    .execute();
}

/** Deletes finished responses past their 24 h and claims past their lease; returns how many. */
export async function purgeExpiredIdempotencyKeys(db: Kysely<Database>, nowIso: string): Promise<number> {
  const result = await db.deleteFrom('idempotency_keys').where('expires_at', '<=', nowIso).executeTakeFirst();
  return Number(result.numDeletedRows);
}
