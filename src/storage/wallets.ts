import type { Kysely, Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database, WalletsTable } from './schema.ts';

type Db = Kysely<Database> | Transaction<Database>;

/** A new, empty wallet (merchants and customers get one when they are created). */
export async function insertWallet(
  db: Db,
  input: { merchantId: string; ownerType: WalletsTable['owner_type']; createdAt: string },
): Promise<WalletsTable> {
  const row: WalletsTable = {
    id: newId('wallet'),
    merchant_id: input.merchantId,
    owner_type: input.ownerType,
    balance: 0n,
    cycle_credit: 0n,
    bundle_credit: 0n,
    held: 0n,
    created_at: input.createdAt,
  };
  await db.insertInto('wallets').values(row).execute();
  return row;
}
