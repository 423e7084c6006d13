/**
 * Secret keys: a merchant's API credentials. The API and the dashboard create, rotate, revoke and
 * show them through these operations; the raw key is returned on create and rotate only.
 */
import { z } from 'zod';
import type { Clock } from '../domain/clock.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { optionalBody } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import { merchantHasRow } from '../storage/pages.ts';
import {
  findActiveSecretKey,
  insertSecretKey,
  listSecretKeys,
  revokeSecretKey,
  rotateSecretKey,
  type SecretKeyRow,
} from '../storage/secret-keys.ts';

export const secretKeySchema = z.object({
  secret_key_id: z.string(),
  name: z.string(),
  secret_key_hint: z.string(),
  created_at: z.string(),
});
export const createdSecretKeySchema = secretKeySchema.extend({ secret_key: z.string().describe('Shown only once') });
export const secretKeyCreateBody = optionalBody(z.object({ name: z.string().trim().min(1).max(255).default('Secret key') }));

export type PresentedSecretKey = z.infer<typeof secretKeySchema>;

export function presentSecretKey(row: SecretKeyRow): PresentedSecretKey {
  return { secret_key_id: row.id, name: row.name, secret_key_hint: row.key_hint, created_at: row.created_at };
}

type Deps = { storage: Storage; clock: Clock };
const nowIso = (deps: { clock: Clock }) => new Date(deps.clock.now()).toISOString();

export async function listSecretKeyPage(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<SecretKeyRow[]> {
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'secret_keys', merchantId, id));
  return listSecretKeys(storage, merchantId, cursor, limit);
}

/** The active key, or a 404 (a revoked key is as gone as an unknown one). */
export async function getSecretKey(storage: Storage, merchantId: string, id: string): Promise<SecretKeyRow> {
  const row = await findActiveSecretKey(storage, merchantId, id);
  if (!row) throw notFound('secret key', id);
  return row;
}

export async function createSecretKey(deps: Deps, merchantId: string, body: z.infer<typeof secretKeyCreateBody>): Promise<{ row: SecretKeyRow; secret: string }> {
  return insertSecretKey(deps.storage.db, merchantId, body.name, nowIso(deps));
}

/** A new secret for the key (same id and name); the old secret is refused from now on. */
export async function rotateKeySecret(storage: Storage, merchantId: string, id: string): Promise<{ row: SecretKeyRow; secret: string }> {
  const rotated = await rotateSecretKey(storage, merchantId, id);
  if (!rotated) throw notFound('secret key', id);
  return rotated;
}

/** Revokes the key for good, unless it is the merchant's last active one (409 `last_secret_key`). */
export async function revokeKey(deps: Deps, merchantId: string, id: string): Promise<void> {
  const outcome = await revokeSecretKey(deps.storage, merchantId, id, nowIso(deps));
  if (outcome === 'not_found') throw notFound('secret key', id);
  if (outcome === 'last_key') throw new ApiError('last_secret_key');
}
