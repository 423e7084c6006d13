/**
 * The ledger's statements written for SQLite alone: a charge batch's steps in an ordinary
 * transaction, and the embedded admission's reads and writes made on one connection held off the
 * writer (decision 0011). Each decides nothing itself: its callers decided with
 * src/ledger/decide/.
 */
import { CompiledQuery, type Kysely, type Transaction } from 'kysely';
import { writeBatch } from '../../storage/batch-write.ts';
import { readLiveMeters } from '../../storage/meters.ts';
import type { Database } from '../../storage/schema.ts';
import { pairsDrawingPlanCredit } from '../../storage/subscriptions.ts';
import { lockUsageCounters } from '../tier-counters.ts';
import type { WalletRow } from '../wallets.ts';
import type { AdmissionWallet } from '../decide/admission.ts';
import { inLockOrder } from '../decide/lock-order.ts';
import type { ChargeBatchSteps } from './types.ts';

/** A POST /requests charge batch's steps inside an ordinary transaction (which holds SQLite's write lock from its start). */
export function chargeBatchSteps(trx: Transaction<Database>): ChargeBatchSteps {
  return {
    lock: async (counterKeys, walletIds, meterIds) => {
      const positions = await lockUsageCounters(trx, 'sqlite', counterKeys);
      const { wallets, liveCustomers } = await lockWalletsWithCustomers(trx, walletIds);
      const drawingPlanCredit = await pairsDrawingPlanCredit(trx, [...liveCustomers], meterIds);
      return { positions, wallets, liveCustomers, drawingPlanCredit, meters: await readLiveMeters(trx, meterIds) };
    },
    write: (rows) => writeBatch(trx, rows),
  };
}

/**
 * Reads wallets (on SQLite, whose write lock the transaction holds from its start) and tells, in
 * the same statement, which of their customers are still live: a customer deleted after the
 * caller looked it up is charged nothing.
 */
async function lockWalletsWithCustomers(
  trx: Transaction<Database>,
  ids: string[],
): Promise<{ wallets: Map<string, WalletRow>; liveCustomers: Set<string> }> {
  const unique = inLockOrder(ids);
  if (unique.length === 0) return { wallets: new Map(), liveCustomers: new Set() };
  const rows = await trx
    .selectFrom('wallets')
    .leftJoin('connections', (join) => join.onRef('connections.wallet_id', '=', 'wallets.id').on('connections.deleted_at', 'is', null))
    .selectAll('wallets')
    .select('connections.id as live_customer_id')
    .where('wallets.id', 'in', unique)
    .orderBy('wallets.id')
    .execute();
  const wallets = new Map<string, WalletRow>();
  const liveCustomers = new Set<string>();
  for (const { live_customer_id, ...wallet } of rows) {
    wallets.set(wallet.id, wallet);
    if (live_customer_id) liveCustomers.add(live_customer_id);
  }
  return { wallets, liveCustomers };
}

/**
 * What an embedded admission reads of its one or two wallets, compiled once per shape: building
 * the query anew costs more than running it, and this read is on every embedded request's path.
 */
const WALLET_BALANCES_SQL = [
  'select id, balance, held, overrun, cycle_credit, bundle_credit from wallets where id = ?',
  'select id, balance, held, overrun, cycle_credit, bundle_credit from wallets where id in (?, ?)',
];

/** The wallets an embedded admission decides on (one or two), read on the connection it holds. */
export async function readAdmissionWallets(db: Kysely<Database>, ids: string[]): Promise<Map<string, AdmissionWallet>> {
  if (ids.length === 0) return new Map();
  const { rows } = await db.executeQuery(CompiledQuery.raw(WALLET_BALANCES_SQL[ids.length - 1]!, ids) as CompiledQuery<AdmissionWallet>);
  return new Map(rows.map((row) => [row.id, row]));
}

/** Ends these wallets' overruns (ledger/decide/admission.ts overrunsEnded), on the connection the admission holds. */
export async function endOverruns(db: Kysely<Database>, ids: string[]): Promise<void> {
  if (ids.length === 0) return;
  await db.executeQuery(CompiledQuery.raw(`update wallets set overrun = 0 where id in (${ids.map(() => '?').join(', ')})`, ids));
}
