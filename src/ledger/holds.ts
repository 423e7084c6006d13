import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Storage } from '../storage/db.ts';
import type { Database, HoldsTable } from '../storage/schema.ts';
import { availableOf, lockWallets, type WalletRow } from './wallets.ts';

export type HoldRow = HoldsTable;

/**
 * Reserves `amount` of a wallet's available balance (balance − active holds) for a request about
 * to run. Refused when the wallet cannot cover it; the reservation expires after `ttlMs`.
 */
export async function placeHold(
  storage: Storage,
  input: { walletId: string; amount: bigint; reference: string; ttlMs: number; now?: Date },
): Promise<{ holdId: string } | { insufficient: { available: bigint } }> {
  if (input.amount < 0n) throw new RangeError('a hold cannot be negative');
  const now = input.now ?? new Date();
  return storage.db.transaction().execute(async (trx) => {
    const wallet = (await lockWallets(trx, storage.dialect, [input.walletId])).get(input.walletId);
    if (!wallet) throw new RangeError(`no wallet ${input.walletId}`);
    const available = availableOf(wallet);
    if (available < input.amount || (input.amount === 0n && available <= 0n)) return { insufficient: { available } };
    const holdId = await insertHold(trx, wallet, input.amount, input.reference, input.ttlMs, now);
    return { holdId };
  });
}

/** Records a hold on a wallet locked by the caller's transaction and raises its `held` total. */
export async function insertHold(
  trx: Transaction<Database>,
  wallet: WalletRow,
  amount: bigint,
  reference: string,
  ttlMs: number,
  now: Date,
): Promise<string> {
  const holdId = newId('hold');
  await trx
    .insertInto('holds')
    .values({
      id: holdId,
      wallet_id: wallet.id,
      reference,
      amount,
      status: 'active',
      created_at: now.toISOString(),
      expires_at: new Date(now.getTime() + ttlMs).toISOString(),
    })
    .execute();
  wallet.held += amount;
  await trx.updateTable('wallets').set({ held: wallet.held }).where('id', '=', wallet.id).execute();
  return holdId;
}

/**
 * Ends an active hold inside the caller's transaction (whose wallets are already locked).
 * Returns false when the hold was not active any more: settlement and release happen once.
 */
export async function releaseHoldInTransaction(
  trx: Transaction<Database>,
  holdId: string,
  status: 'settled' | 'released' | 'expired',
  lockedWallets: Map<string, WalletRow>,
): Promise<boolean> {
  const hold = await trx
    .updateTable('holds')
    .set({ status })
    .where('id', '=', holdId)
    .where('status', '=', 'active')
    .returning(['wallet_id', 'amount'])
    .executeTakeFirst();
  if (!hold) return false;
  const amount = BigInt(hold.amount);
  const wallet = lockedWallets.get(hold.wallet_id);
  if (wallet) wallet.held -= amount;
  await trx
    .updateTable('wallets')
    .set((eb) => ({ held: eb('held', '-', amount) }))
    .where('id', '=', hold.wallet_id)
    .execute();
  return true;
}

/** Releases a hold without charging (the upstream call failed, or nothing was used). */
export async function releaseHold(storage: Storage, holdId: string): Promise<boolean> {
  return storage.db.transaction().execute(async (trx) => {
    const hold = await trx.selectFrom('holds').select('wallet_id').where('id', '=', holdId).executeTakeFirst();
    if (!hold) return false;
    const wallets = await lockWallets(trx, storage.dialect, [hold.wallet_id]);
    return releaseHoldInTransaction(trx, holdId, 'released', wallets);
  });
}

/** Crash safety: holds past their TTL are released. Returns the references of the expired holds. */
export async function expireHolds(storage: Storage, now = new Date()): Promise<string[]> {
  const due = await storage.db
    .selectFrom('holds')
    .select(['id', 'wallet_id', 'reference'])
    .where('status', '=', 'active')
    .where('expires_at', '<=', now.toISOString())
    .limit(1000)
    .execute();
  const expired: string[] = [];
  for (const hold of due) {
    const done = await storage.db.transaction().execute(async (trx) => {
      const wallets = await lockWallets(trx, storage.dialect, [hold.wallet_id]);
      return releaseHoldInTransaction(trx, hold.id, 'expired', wallets);
    });
    if (done) expired.push(hold.reference);
  }
  return expired;
}
