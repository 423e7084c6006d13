/**
 * Admission decided in process and written later (decision 0011): the embedded shape reserves in
 * memory, PostgreSQL's hot wallets take from leases (decision 0013); the rows follow off the
 * response path, or a settlement that comes first takes the admission over.
 */
import type { Transaction } from 'kysely';
import type { BatchJob, GroupCommitWriter } from '../group-commit.ts';
import type { Storage } from '../../storage/db.ts';
import type { Database } from '../../storage/schema.ts';
import { holdRowsOf, type HoldRow } from '../holds.ts';
import { lockWallets, UnwrittenHolds } from '../wallets.ts';
import type { Lease, WalletLeases } from '../leases.ts';
import { admittableOf, overrunsEnded, refusedPart, type AdmissionWallet, type HoldPart } from '../decide/admission.ts';
import { endOverruns, readAdmissionWallets } from '../store/sqlite.ts';
import { drawsPlanCredit } from '../decide/balance.ts';
import { isOverrun } from '../decide/overrun.ts';
import { holdPartsOf, pendingRecord, type AdmitInput, type AdmitOutcome } from './admit.ts';
import { writeAdmissionRows } from './rows.ts';

/**
 * How long a deferred admission stays in memory only (decision 0011). A request answered sooner
 * (most are) is written once, completed, by its settlement; a longer one gets its pending record
 * and hold rows, so it is visible and swept like any other.
 */
export const ADMISSION_WRITE_DELAY_MS = 50;

/**
 * Runs work a fixed delay after it was handed in: one queue and one timer for every deferred
 * admission, instead of a timer and a chain of promises for each (every embedded request makes
 * one). Work handed in later is due later, so the queue is in due order.
 */
class DelayQueue {
  readonly #delayMs: number;
  #entries: { due: number; run: () => void }[] = [];
  #timer: NodeJS.Timeout | undefined;

  constructor(delayMs: number) {
    this.#delayMs = delayMs;
  }

  add(run: () => void): void {
    this.#entries.push({ due: performance.now() + this.#delayMs, run });
    if (this.#timer) return;
    this.#timer = setTimeout(() => this.#runDue(), this.#delayMs);
    // Whatever is due is awaited by its settlement, which shutdown waits for; the timer alone must not keep a process up.
    this.#timer.unref();
  }

  #runDue(): void {
    // Timers count from the event loop's clock, which may run a little behind performance.now().
    const now = performance.now() + 1;
    let count = 0;
    while (count < this.#entries.length && this.#entries[count]!.due <= now) count++;
    const due = this.#entries.splice(0, count);
    const next = this.#entries[0];
    this.#timer = next ? setTimeout(() => this.#runDue(), Math.max(1, next.due - now)).unref() : undefined;
    for (const entry of due) entry.run();
  }
}

/**
 * The app's deferred admissions: where they go to be written (after `delay`, through `writer`),
 * the holds they reserved in process until then (`unwritten`, which every spending decision of the
 * app subtracts) and the wallet rows the embedded decision last read (`walletReads`).
 */
export type DeferredWrites = { writer: GroupCommitWriter; delay: DelayQueue; unwritten: UnwrittenHolds; walletReads: WalletReads };

/** An app's deferred admissions, written through `writer` `delayMs` after admission. */
export function deferredWrites(writer: GroupCommitWriter, unwritten = new UnwrittenHolds(), delayMs = ADMISSION_WRITE_DELAY_MS): DeferredWrites {
  return { writer, delay: new DelayQueue(delayMs), unwritten, walletReads: new WalletReads() };
}

/**
 * What a deferred admission leaves to write: its holds and its pending record. `queued` until a
 * batch takes it (`writing`), unless its settlement comes first and takes it over (`merged`):
 * then the settled record is written directly and no hold row is ever written.
 */
export type AdmissionWrite = {
  holds: HoldRow[];
  /** The admission, from which its pending record is made when it is written (most never are). */
  admission: AdmitInput;
  createdAt: string;
  state: 'queued' | 'writing' | 'merged';
  /** Settles once the holds and the pending record are committed (or failed to be, or were merged). */
  written: Promise<void>;
  /**
   * Set when the holds were taken from wallet leases (PostgreSQL, decision 0013) instead of being
   * reserved in process: each hold's share is still in its wallet's lease row until written or settled.
   */
  leased?: { leases: WalletLeases; byWallet: Map<string, Lease> };
  /** Otherwise the app's in-process reservation of its holds, released once they are rows (or settled). */
  reservedIn?: UnwrittenHolds;
};

export type DeferredAdmission = AdmitOutcome & { deferred?: AdmissionWrite };

/** A settlement takes over its admission's write when no batch has taken it yet; true when it did. */
export function takeOverAdmission(write: AdmissionWrite | undefined): write is AdmissionWrite {
  if (write?.state !== 'queued') return false;
  write.state = 'merged';
  return true;
}

/** The in-memory reservation of a deferred admission ends: its holds are in `held` now, or settled. */
export function releaseDeferredHolds(write: AdmissionWrite): void {
  if (write.leased) {
    for (const lease of write.leased.byWallet.values()) write.leased.leases.end(lease);
    return;
  }
  for (const hold of write.holds) write.reservedIn?.release(hold.wallet_id, hold.amount);
}

/**
 * Admission decided in process, written later (decision 0011). The embedded shape (SQLite: one
 * process owns the database in the embedded shape) takes the same decision as admitRequest against the
 * wallets as committed minus every hold this process admitted and has not written yet, with the
 * connection held so no transaction is half done while it reads; the holds are reserved in memory
 * at once. With `leases` (PostgreSQL, decision 0013) the holds are taken from this instance's
 * leases on the paying wallets instead. Either way the holds' rows and the pending record are
 * written by `writes.writer` off the response path, batched with settlements.
 */
export async function admitDeferred(storage: Storage, writes: DeferredWrites, input: AdmitInput, leases?: WalletLeases): Promise<DeferredAdmission> {
  const parts = holdPartsOf(input);
  const now = input.now;
  const createdAt = now.toISOString();
  const recordId = input.requestId;
  const holds = holdRowsOf(parts, recordId, now, input.ttlMs);
  const deferred: AdmissionWrite = { holds, admission: input, createdAt, state: 'queued', written: Promise.resolve() };

  if (leases) {
    // All parts or none: a request refused on one wallet holds nothing of its other's lease.
    const taken = await leases.takeAll(parts);
    if (!(taken instanceof Map)) return { outcome: 'insufficient_balance', payer: taken.payer };
    deferred.leased = { leases, byWallet: taken };
  } else {
    const refused = await reserveInProcess(storage, writes, parts, drawsPlanCredit(input.billing));
    if (refused) return { outcome: 'insufficient_balance', payer: refused.payer };
    deferred.reservedIn = writes.unwritten;
  }

  // Handed to the writer only once the request has run a while: most settle before that and take
  // their admission over. A merged admission's reservation ends with its settlement instead.
  deferred.written = new Promise<void>((resolve, reject) => {
    writes.delay.add(() => {
      const done = () => {
        if (deferred.state !== 'merged') releaseDeferredHolds(deferred);
      };
      if (deferred.state !== 'queued') return (done(), resolve());
      writes.writer.run(WRITE_ADMISSION_JOB, deferred).then(
        () => (done(), resolve()),
        (error: unknown) => (done(), reject(error)),
      );
    });
  });
  // Its failure is reported where it is awaited (the settlement); never as an unhandled rejection.
  deferred.written.catch(() => undefined);
  return { outcome: 'admitted', recordId, holdIds: holds.map((hold) => hold.id), createdAt, deferred };
}

/**
 * The embedded decision: the first part its wallet cannot cover, or nothing (then all are reserved).
 * It is taken against the wallets as this process last read them while nothing was written since
 * (walletReads); a refusal is always taken against a fresh read.
 */
async function reserveInProcess(storage: Storage, writes: DeferredWrites, parts: HoldPart[], drawsPlanCredit: boolean): Promise<HoldPart | undefined> {
  const { unwritten, walletReads } = writes;
  const walletIds = [...new Set(parts.map((part) => part.walletId))];
  const remembered = walletReads.remembered(storage, walletIds);
  const refusedIn = (wallets: Map<string, AdmissionWallet>) => refusedPart(parts, (walletId, amount) => admittableOf(wallets.get(walletId)!, unwritten, drawsPlanCredit, amount));
  const reserve = () => {
    for (const part of parts) unwritten.reserve(part.walletId, part.amount);
  };
  // An overrun ends with a write (below), so it is decided on a fresh read.
  if (remembered && ![...remembered.values()].some((wallet) => isOverrun(wallet.overrun)) && !refusedIn(remembered)) {
    reserve();
    return undefined;
  }
  return storage.db.connection().execute(async (db) => {
    const wallets = await readAdmissionWallets(db, walletIds);
    walletReads.remember(storage, wallets);
    const refusal = refusedIn(wallets);
    // Read before this request's own parts are reserved: only an overrun with nothing in flight ends.
    const ended = refusal ? [] : overrunsEnded(parts, (walletId) => wallets.get(walletId), unwritten);
    // Reserved before the connection is let go: no other decision sees these wallets without them.
    if (!refusal) reserve();
    await endOverruns(db, ended);
    return refusal;
  });
}


/**
 * Wallet balances as the embedded admission last read them, each with the storage's write count
 * at the time. While that count has not moved, no statement of this process has written since, so
 * no transaction is half done and the row is what the database holds — but for what another
 * process wrote meanwhile. The only other process on an embedded database is the CLI, which only
 * adds credit (decision 0011): a remembered row can make an admission refuse wrongly, never admit
 * wrongly, and refusals are taken against a fresh read. Saves a read per request (the read takes
 * SQLite's WAL read lock: system calls, ~14 µs under load). One per app (DeferredWrites).
 */
class WalletReads {
  #reads = new Map<string, { row: AdmissionWallet; writes: number }>();

  /** The rows of these wallets as last read, while nothing was written through `storage` since; else null. */
  remembered(storage: Storage, ids: string[]): Map<string, AdmissionWallet> | null {
    const writes = storage.writeCount?.();
    if (writes === undefined) return null;
    const wallets = new Map<string, AdmissionWallet>();
    for (const id of ids) {
      const read = this.#reads.get(id);
      if (read?.writes !== writes) return null;
      wallets.set(id, read.row);
    }
    return wallets;
  }

  remember(storage: Storage, wallets: Map<string, AdmissionWallet>): void {
    const writes = storage.writeCount?.();
    if (writes === undefined) return;
    if (this.#reads.size >= WALLET_READS_MAX) this.#reads = new Map();
    for (const [id, row] of wallets) this.#reads.set(id, { row, writes });
  }
}

const WALLET_READS_MAX = 10_000;

/** The wallets deferred admission writes change: those of their holds (carved from a lease or not). */
function admissionWriteWalletIds(writes: AdmissionWrite[]): string[] {
  return writes.flatMap((write) => write.holds.map((hold) => hold.wallet_id));
}

const writeDeferredAdmissions = async (trx: Transaction<Database>, dialect: Storage['dialect'], writes: AdmissionWrite[]) => {
  // Wallets before the lease rows carving changes, as a lease's top-up and a settlement lock them.
  const walletIds = admissionWriteWalletIds(writes);
  if (dialect === 'postgres' && walletIds.length > 0) await lockWallets(trx, dialect, walletIds);
  const leaseOf = new Map<HoldRow, Lease>();
  for (const write of writes) {
    for (const hold of write.holds) {
      const lease = write.leased?.byWallet.get(hold.wallet_id);
      if (lease) leaseOf.set(hold, lease);
    }
  }
  return writeAdmissionRows(
    trx,
    writes.flatMap((write) => write.holds),
    writes.map((write) => pendingRecord(write.admission, write.admission.requestId, write.createdAt)),
    (hold) => leaseOf.get(hold),
  );
};

/** Takes the queued members of a batch for writing; merged ones are their settlement's to write. */
function takeQueued(inputs: AdmissionWrite[]): AdmissionWrite[] {
  const queued = inputs.filter((input) => input.state !== 'merged');
  for (const input of queued) input.state = 'writing';
  return queued;
}

export function writeAdmissionAlone(storage: Storage, input: AdmissionWrite): Promise<void> {
  return storage.db.transaction().execute(async (trx) => {
    await writeDeferredAdmissions(trx, storage.dialect, [input]);
  });
}

/** Deferred admission writes as a group-commit job: first in a batch, so settlements find them. */
const WRITE_ADMISSION_JOB: BatchJob<AdmissionWrite, void> = {
  order: -1,
  locks: (_trx, inputs) => ({ walletIds: admissionWriteWalletIds(inputs) }),
  inTransaction: async (trx, dialect, inputs) => {
    const queued = takeQueued(inputs);
    if (queued.length > 0) await writeDeferredAdmissions(trx, dialect, queued);
    return inputs.map(() => undefined);
  },
  alone: async (storage, input) => {
    if (takeQueued([input]).length > 0) await writeAdmissionAlone(storage, input);
  },
};

/** Admission as a group-commit job (ledger/group-commit.ts). */
