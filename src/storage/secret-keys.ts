import type { Kysely, Transaction } from 'kysely';
import { newId, newSecret, SECRET_PREFIX } from '../domain/ids.ts';
import { hashSecret, secretHint } from '../domain/secrets.ts';
import type { Storage } from './db.ts';
import type { Database, SecretKeysTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type SecretKeyRow = SecretKeysTable;

export async function insertSecretKey(
  db: Kysely<Database> | Transaction<Database>,
  merchantId: string,
  name: string,
  createdAt: string,
): Promise<{ row: SecretKeyRow; secret: string }> {
  const secret = newSecret('secretKey');
  const row: SecretKeyRow = {
    id: newId('secretKey'),
    merchant_id: merchantId,
    name,
    key_hash: hashSecret(secret),
    key_hint: secretHint(secret, SECRET_PREFIX.secretKey),
    created_at: createdAt,
    revoked_at: null,
  };
  await db.insertInto('secret_keys').values(row).execute();
  return { row, secret };
}

/** Active keys with what every authenticated request needs of their merchant, in one read. */
export async function findActiveKeysByHash(db: Kysely<Database>, keyHashes: string[]) {
  return db
    .selectFrom('secret_keys')
    .innerJoin('merchants', 'merchants.id', 'secret_keys.merchant_id')
    .select([
      'secret_keys.id',
      'secret_keys.merchant_id',
      'secret_keys.key_hash',
      'merchants.wallet_id as merchant_wallet_id',
      'merchants.service_charge_rate',
    ])
    .where('secret_keys.key_hash', 'in', keyHashes)
    .where('secret_keys.revoked_at', 'is', null)
    .execute();
}

export type ActiveKeyRow = Awaited<ReturnType<typeof findActiveKeysByHash>>[number];

/**
 * Revokes a key unless it is the merchant's last active one. Runs in one transaction that
 * first locks the merchant's keys, so two concurrent deletes cannot remove the last two.
 */
export async function revokeSecretKey(
  { db, dialect }: Storage,
  merchantId: string,
  keyId: string,
  at: string,
): Promise<'revoked' | 'not_found' | 'last_key'> {
  return db.transaction().execute(async (trx) => {
    const active = await trx
      .selectFrom('secret_keys')
      .select(['id'])
      .where('merchant_id', '=', merchantId)
      .where('revoked_at', 'is', null)
      .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
      .execute();
    if (!active.some((k) => k.id === keyId)) return 'not_found';
    if (active.length <= 1) return 'last_key';
    await trx.updateTable('secret_keys').set({ revoked_at: at }).where('id', '=', keyId).execute();
    return 'revoked';
  });
}

export async function listSecretKeys(storage: Storage, merchantId: string, cursor: string | undefined, limit: number) {
  return storage.db
    .selectFrom('secret_keys')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('revoked_at', 'is', null)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}


/**
 * A new secret for an active key, keeping its id and name: the old secret stops working at once
 * (like a spend key's rotation). Undefined when the merchant has no such active key.
 */
export async function rotateSecretKey(storage: Storage, merchantId: string, keyId: string): Promise<{ row: SecretKeyRow; secret: string } | undefined> {
  const secret = newSecret('secretKey');
  const result = await storage.db
    .updateTable('secret_keys')
    .set({ key_hash: hashSecret(secret), key_hint: secretHint(secret, SECRET_PREFIX.secretKey) })
    .where('merchant_id', '=', merchantId)
    .where('id', '=', keyId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  if (Number(result.numUpdatedRows) !== 1) return undefined;
  const row = await findActiveSecretKey(storage, merchantId, keyId);
  return row ? { row, secret } : undefined;
}

/** A merchant's active (not revoked) key by id. */
export async function findActiveSecretKey(storage: Storage, merchantId: string, keyId: string): Promise<SecretKeyRow | undefined> {
  return storage.db
    .selectFrom('secret_keys')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('id', '=', keyId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
}
