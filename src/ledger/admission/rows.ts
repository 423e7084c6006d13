/** The rows admissions leave, written by the batch admission and by deferred admission writes. */
import { sql, type Transaction } from 'kysely';
import type { Database } from '../../storage/schema.ts';
import { insertMetadataRows, metadataRows, type RequestRow } from '../../storage/requests.ts';
import type { HoldRow } from '../holds.ts';
import { markLeaseLost, type Lease } from '../leases.ts';

/**
 * The rows admissions leave: their holds, each wallet's `held` raised by what they hold on it, the
 * pending records and their metadata. Used by the batch admission and by deferred admission writes.
 * A hold taken from a lease is carved out of it instead: the lease row gives up its share and
 * `held` stays as it is (unless the lease expired meanwhile; then the hold is held anew).
 */
export async function writeAdmissionRows(
  trx: Transaction<Database>,
  holds: HoldRow[],
  records: RequestRow[],
  leaseOf: (hold: HoldRow) => Lease | undefined = () => undefined,
): Promise<void> {
  const carved = await carveFromLeases(trx, holds, leaseOf);
  const heldBy = new Map<string, bigint>();
  for (const hold of holds) {
    if (!carved.has(hold)) heldBy.set(hold.wallet_id, (heldBy.get(hold.wallet_id) ?? 0n) + hold.amount);
  }
  if (holds.length > 0) await trx.insertInto('holds').values(holds).execute();
  for (const [walletId, amount] of [...heldBy].sort(([a], [b]) => (a < b ? -1 : 1))) {
    await trx
      .updateTable('wallets')
      .set({ held: sql<bigint>`held + ${amount}` })
      .where('id', '=', walletId)
      .execute();
  }
  if (records.length === 0) return;
  await trx.insertInto('requests').values(records).execute();
  await insertMetadataRows(trx, metadataRows(records));
}

/** Moves each leased hold's share out of its lease row; the holds whose lease was still active. */
async function carveFromLeases(trx: Transaction<Database>, holds: HoldRow[], leaseOf: (hold: HoldRow) => Lease | undefined): Promise<Set<HoldRow>> {
  const byLease = new Map<Lease, HoldRow[]>();
  for (const hold of holds) {
    const lease = leaseOf(hold);
    if (!lease) continue;
    const leased = byLease.get(lease);
    if (leased) leased.push(hold);
    else byLease.set(lease, [hold]);
  }
  const carved = new Set<HoldRow>();
  for (const [lease, leased] of byLease) {
    const share = leased.reduce((sum, hold) => sum + hold.amount, 0n);
    const shrunk = await trx
      .updateTable('holds')
      .set((eb) => ({ amount: eb('amount', '-', share) }))
      .where('id', '=', lease.holdId)
      .where('status', '=', 'active')
      .returning('id')
      .executeTakeFirst();
    if (shrunk) for (const hold of leased) carved.add(hold);
    else markLeaseLost(lease);
  }
  return carved;
}
