/**
 * What the ledger asks of an engine's store (ledger/store/postgres.ts, ledger/store/sqlite.ts)
 * where the two engines write differently: the steps of a POST /requests charge batch.
 */
import type { BatchRows } from '../../storage/batch-write.ts';
import type { MeterRow } from '../../storage/meters.ts';
import type { WalletsTable } from '../../storage/schema.ts';
import type { CounterKey } from '../tier-counters.ts';

/** What a charge batch's lock step read under its locks. */
export type ChargeBatchLocked = {
  positions: Map<string, bigint>;
  wallets: Map<string, WalletsTable>;
  liveCustomers: Set<string>;
  /** planCreditKey of each (live customer, meter) pair whose usage draws plan credit. */
  drawingPlanCredit: Set<string>;
  /** The batch's meters that are not deleted, by id. */
  meters: Map<string, MeterRow>;
};

/** The two steps of a charge batch that touch the database; `write` also commits, or rolls back. */
export type ChargeBatchSteps = {
  /**
   * Locks the tier counters (created when missing), then the wallets, and reads them, with which
   * of their live customers' usage on these meters draws plan credit, and the live meters. Meters
   * are read, not locked: a tier change racing a charge may apply from the next batch on.
   */
  lock(counterKeys: CounterKey[], walletIds: string[], meterIds: string[]): Promise<ChargeBatchLocked>;
  /** Writes the batch's rows; the ids of records whose request_id was taken (then nothing is written). */
  write(rows: BatchRows): Promise<{ taken: string[] }>;
};
