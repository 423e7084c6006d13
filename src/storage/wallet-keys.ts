import { newId, newSecret, SECRET_PREFIX } from '../domain/ids.ts';
import { hashSecret, secretHint } from '../domain/secrets.ts';
import type { Storage } from './db.ts';
import { isCustomerId } from './connections.ts';
import type { Kysely, Transaction } from 'kysely';
import type { Database, WalletKeysTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type WalletKeyRow = WalletKeysTable;

/** A wallet a key may belong to: the merchant's own (connectionId null) or one of its customers'. */
export type WalletRef = { walletId: string; connectionId: string | null };

/**
 * Finds a wallet of this merchant by customer (connection) id or by wallet id; undefined when the
 * merchant has no such (live) customer or wallet.
 */
export async function findMerchantWallet(
  storage: Storage,
  merchant: { id: string; walletId: string },
  by: { connectionId: string } | { walletId: string },
): Promise<WalletRef | undefined> {
  if ('walletId' in by && by.walletId === merchant.walletId) return { walletId: merchant.walletId, connectionId: null };
  const row = await storage.db
    .selectFrom('connections')
    .select(['id', 'wallet_id'])
    .where('merchant_id', '=', merchant.id)
    .where('deleted_at', 'is', null)
    // A customer may be named by its reference_id, as wherever a customer id goes.
    .$if('connectionId' in by, (q) => {
      const named = (by as { connectionId: string }).connectionId;
      return q.where(isCustomerId(named) ? 'id' : 'reference_id', '=', named);
    })
    .$if('walletId' in by, (q) => q.where('wallet_id', '=', (by as { walletId: string }).walletId))
    .executeTakeFirst();
  return row && { walletId: row.wallet_id, connectionId: row.id };
}

export async function insertWalletKey(
  db: Kysely<Database> | Transaction<Database>,
  input: { merchantId: string; wallet: WalletRef; name: string; at: string },
): Promise<{ row: WalletKeyRow; secret: string }> {
  const secret = newSecret('walletKey');
  const row: WalletKeyRow = {
    id: newId('walletKey'),
    merchant_id: input.merchantId,
    wallet_id: input.wallet.walletId,
    connection_id: input.wallet.connectionId,
    name: input.name,
    key_hash: hashSecret(secret),
    key_preview: secretHint(secret, SECRET_PREFIX.walletKey),
    last_used_at: null,
    created_at: input.at,
    revoked_at: null,
  };
  await db.insertInto('wallet_keys').values(row).execute();
  return { row, secret };
}

export async function listWalletKeys(storage: Storage, merchantId: string, cursor: string | undefined, limit: number) {
  return storage.db
    .selectFrom('wallet_keys')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('revoked_at', 'is', null)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

export async function revokeWalletKey(storage: Storage, merchantId: string, id: string, at: string): Promise<boolean> {
  const result = await storage.db
    .updateTable('wallet_keys')
    .set({ revoked_at: at })
    .where('id', '=', id)
    .where('merchant_id', '=', merchantId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

export async function rotateWalletKey(
  storage: Storage,
  merchantId: string,
  id: string,
): Promise<{ row: WalletKeyRow; secret: string } | undefined> {
  const secret = newSecret('walletKey');
  const set = { key_hash: hashSecret(secret), key_preview: secretHint(secret, SECRET_PREFIX.walletKey) };
  const result = await storage.db
    .updateTable('wallet_keys')
    .set(set)
    .where('id', '=', id)
    .where('merchant_id', '=', merchantId)
    .where('revoked_at', 'is', null)
    .executeTakeFirst();
  if (result.numUpdatedRows === 0n) return undefined;
  const row = await storage.db.selectFrom('wallet_keys').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  return { row, secret };
}

/** A live wallet key with what authentication needs of its merchant. */
export async function findActiveWalletKeyByHash(storage: Storage, keyHash: string) {
  const row = await storage.db
    .selectFrom('wallet_keys')
    .innerJoin('merchants', 'merchants.id', 'wallet_keys.merchant_id')
    .selectAll('wallet_keys')
    .select(['merchants.wallet_id as merchant_wallet_id', 'merchants.service_charge_rate'])
    .where('wallet_keys.key_hash', '=', keyHash)
    .where('wallet_keys.revoked_at', 'is', null)
    .executeTakeFirst();
  return row;
}

/** Stamps last_used_at: called once a wallet key's call is allowed, not when it is refused. */
export async function markWalletKeyUsed(storage: Storage, id: string, at: string): Promise<void> {
  await storage.db.updateTable('wallet_keys').set({ last_used_at: at }).where('id', '=', id).execute();
}

/** A live wallet key with its merchant's wallet and service-charge rate. */
export type ActiveWalletKeyRow = NonNullable<Awaited<ReturnType<typeof findActiveWalletKeyByHash>>>;
