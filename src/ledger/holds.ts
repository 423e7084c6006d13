import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Storage } from '../storage/db.ts';
import type { Database, HoldsTable } from '../storage/schema.ts';
import { lockWallets, type UnwrittenHolds, type WalletRow } from './wallets.ts';
import { availableOf } from './decide/balance.ts';
import { refusedPart, type HoldPart } from './decide/admission.ts';
import { entriesInLockOrder } from './decide/lock-order.ts';

export type HoldRow = HoldsTable;

/** The hold rows of an admitted request's parts (decide/admission.ts holdParts), active from `now` for `ttlMs`. */
export function holdRowsOf(parts: readonly HoldPart[], recordId: string, now: Date, ttlMs: number): HoldRow[] {
  const createdAt = now.toISOString();
  const expiresAt = new Date(now.getTime() + ttlMs).toISOString();
  return parts.map((part) => ({
    id: newId('hold'),
    wallet_id: part.walletId,
    reference: recordId,
    amount: part.amount,
    status: 'active',
    created_at: createdAt,
    expires_at: expiresAt,
  }));
}

/**
 * Reserves `amount` of a wallet's available balance (balance − active holds) for a request about
 * to run. Refused when the wallet cannot cover it; the reservation expires after `ttlMs`.
 */
export async function placeHold(
  storage: Storage,
  input: { walletId: string; amount: bigint; reference: string; ttlMs: number; now: Date; unwritten?: UnwrittenHolds },
): Promise<{ holdId: string } | { insufficient: { available: bigint } }> {
  if (input.amount < 0n) throw new RangeError('a hold cannot be negative');
  const now = input.now;
  return storage.db.transaction().execute(async (trx) => {
    const wallet = (await lockWallets(trx, storage.dialect, [input.walletId])).get(input.walletId);
    if (!wallet) throw new RangeError(`no wallet ${input.walletId}`);
    const available = availableOf(wallet, input.unwritten);
    const part: HoldPart = { walletId: wallet.id, amount: input.amount, payer: 'wallet' };
    if (refusedPart([part], () => available)) return { insufficient: { available } };
    const [hold] = holdRowsOf([part], input.reference, now, input.ttlMs);
    await insertHold(trx, wallet, hold!);
    return { holdId: hold!.id };
  });
}

/** Records a hold (built by holdRowsOf) on a wallet locked by the caller's transaction and raises its `held` total. */
async function insertHold(trx: Transaction<Database>, wallet: WalletRow, hold: HoldRow): Promise<void> {
  await trx.insertInto('holds').values(hold).execute();
  wallet.held += hold.amount;
  await trx.updateTable('wallets').set({ held: wallet.held }).where('id', '=', wallet.id).execute();
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

/** How many requests' holds one sweep transaction expires. */
const EXPIRY_BATCH = 1000;

type ExpiryOptions = {
  batchSize?: number;
  /**
   * Runs in each batch's transaction with the references whose holds it expired (the sweeper
   * fails their pending records there, so a crash leaves both done or neither).
   */
  inSameTransaction?: (trx: Transaction<Database>, references: string[]) => Promise<unknown>;
  /**
   * Runs in each batch's transaction before its wallets are locked, with the references whose due
   * holds it is about to expire: locks that come before wallets in the global order (the sweeper's
   * tier counters) are taken here.
   */
  lockFirst?: (trx: Transaction<Database>, references: string[]) => Promise<unknown>;
};

/**
 * Crash safety: holds past their TTL are released, batch after batch (one transaction each) until
 * a batch comes back short. Returns the references of the expired holds.
 */
export async function expireHolds(storage: Storage, now: Date, options: ExpiryOptions = {}): Promise<string[]> {
  const batchSize = options.batchSize ?? EXPIRY_BATCH;
  const expired: string[] = [];
  for (;;) {
    const batch = await storage.db.transaction().execute(async (trx) => {
      const result = await expireDueBatch(trx, storage.dialect, now, batchSize, options.lockFirst);
      if (options.inSameTransaction && result.references.length > 0) await options.inSameTransaction(trx, result.references);
      return result;
    });
    expired.push(...batch.references);
    if (batch.due < batchSize) return expired;
  }
}

/**
 * Expires the due holds of up to `batchSize` references (all of a reference's due holds together,
 * so a request is never left half expired). Holds are not locked while chosen: their wallets are
 * locked first, as every writer does, and a hold settled meanwhile is simply not expired.
 */
async function expireDueBatch(
  trx: Transaction<Database>,
  dialect: Storage['dialect'],
  now: Date,
  batchSize: number,
  lockFirst?: ExpiryOptions['lockFirst'],
): Promise<{ due: number; references: string[] }> {
  const dueAt = now.toISOString();
  const chosen = await trx
    .selectFrom('holds')
    .select('reference')
    .distinct()
    .where('status', '=', 'active')
    .where('expires_at', '<=', dueAt)
    .orderBy('reference')
    .limit(batchSize)
    .execute();
  if (chosen.length === 0) return { due: 0, references: [] };
  const due = await trx
    .selectFrom('holds')
    .select(['id', 'wallet_id', 'reference'])
    .where('status', '=', 'active')
    .where('expires_at', '<=', dueAt)
    .where('reference', 'in', chosen.map((c) => c.reference))
    .execute();
  await lockFirst?.(trx, [...new Set(due.map((h) => h.reference))]);
  await lockWallets(trx, dialect, due.map((h) => h.wallet_id));
  const expired = await trx
    .updateTable('holds')
    .set({ status: 'expired' })
    .where('id', 'in', due.map((h) => h.id))
    .where('status', '=', 'active')
    .returning(['wallet_id', 'amount', 'reference'])
    .execute();
  const releasedPerWallet = new Map<string, bigint>();
  for (const hold of expired) releasedPerWallet.set(hold.wallet_id, (releasedPerWallet.get(hold.wallet_id) ?? 0n) + BigInt(hold.amount));
  for (const [walletId, amount] of entriesInLockOrder(releasedPerWallet)) {
    await trx
      .updateTable('wallets')
      .set((eb) => ({ held: eb('held', '-', amount) }))
      .where('id', '=', walletId)
      .execute();
  }
  return { due: chosen.length, references: [...new Set(expired.map((h) => h.reference))] };
}
