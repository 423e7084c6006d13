import type { Kysely, Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database, WalletsTable } from '../storage/schema.ts';
import type { Storage } from '../storage/db.ts';

/**
 * Wallets and their balances. This module is the only code that changes a balance.
 */
export type WalletRow = WalletsTable;

export async function insertWallet(
  db: Kysely<Database> | Transaction<Database>,
  input: { merchantId: string; ownerType: WalletRow['owner_type']; createdAt: string },
): Promise<WalletRow> {
  const row: WalletRow = {
    id: newId('wallet'),
    merchant_id: input.merchantId,
    owner_type: input.ownerType,
    balance: 0n,
    created_at: input.createdAt,
  };
  await db.insertInto('wallets').values(row).execute();
  return row;
}

export async function findWallet(storage: Storage, id: string): Promise<WalletRow | undefined> {
  return storage.db.selectFrom('wallets').selectAll().where('id', '=', id).executeTakeFirst();
}

/** Adds units to a wallet in one statement; returns the new balance, or null for an unknown wallet. */
export async function creditWallet(storage: Storage, walletId: string, units: bigint): Promise<bigint | null> {
  if (units <= 0n) throw new RangeError('a credit must be positive');
  const row = await storage.db
    .updateTable('wallets')
    .set((eb) => ({ balance: eb('balance', '+', units) }))
    .where('id', '=', walletId)
    .returning('balance')
    .executeTakeFirst();
  return row ? BigInt(row.balance) : null;
}
