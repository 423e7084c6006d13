/**
 * Group commit for the forward gateway's ledger writes (admissions, settlements, failures): every
 * forwarded request's money goes through one of these writers.
 *
 * Work handed in while a batch is being written waits and goes into the next one: one database
 * transaction, one commit and a fixed number of statements for the whole batch instead of a
 * dozen round trips per request, most of them made while a hot wallet's row is locked. Every
 * decision is still taken inside the transaction under row locks, so instances sharing a database
 * stay exact; only the queueing is in process.
 *
 * When a batch fails as a whole (a database error, not a refusal), nothing of it was written and
 * each member is run alone in its own transaction, so one bad member cannot fail the others.
 * `drain()` resolves once everything handed in so far is written (graceful shutdown); what is
 * queued in memory when the process dies is covered by the pending record and its hold, which the
 * hold sweeper fails when the hold expires.
 */
import type { FastifyBaseLogger } from 'fastify';
import type { Transaction } from 'kysely';
import { lockUsageCounters, type CounterKey } from './charge.ts';
import { lockWallets } from './wallets.ts';
import type { Storage } from '../storage/db.ts';
import type { Database } from '../storage/schema.ts';
import { lockSpendKeys } from './spend-key-limits.ts';

/** Large enough for everything a busy instance has waiting, small enough for any engine's parameter limit. */
const DEFAULT_MAX_BATCH = 64;
/**
 * Queued work beyond this many full batches makes the producers wait (see `room`): a writer that
 * cannot keep up must slow the requests down, not hold an ever longer queue in memory, all of it
 * lost with the process.
 */
const HIGH_WATER_BATCHES = 4;

export type BatchJob<I, O> = {
  /** Jobs run in this order inside a batch: settlements (which release holds) before admissions. */
  order: number;
  /**
   * Work off the response path may wait this long for a batch to join (on an idle instance, a
   * settlement then shares the commit of the next admission) instead of starting its own.
   */
  waitMs?: number;
  /** Runs several members inside the batch's transaction; returns one outcome per member, in order. */
  inTransaction(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: I[]): Promise<O[]>;
  /**
   * Optional fast path for a batch of this job alone: one statement, no explicit transaction.
   * Returns null (or throws) when it cannot decide the batch; nothing of it is written then, and
   * the batch takes the ordinary transaction.
   */
  inOneStatement?(storage: Storage, inputs: I[]): Promise<O[] | null>;
  /** Runs one member on its own (its own transaction), when its batch failed as a whole. */
  alone(storage: Storage, input: I): Promise<O>;
  /**
   * The rows its members lock. Each job locks its own in the global order (tier counters, then
   * wallets, then hold rows, then spend keys), but one job's wallets locked before another job's
   * counters or lower wallets would break that order across the batch, and a transaction elsewhere
   * taking the same rows in order could deadlock with it. So on PostgreSQL a batch of several jobs
   * first locks what all of them declare here, in that order.
   */
  locks(trx: Transaction<Database>, inputs: I[]): Promise<BatchLocks> | BatchLocks;
};

export type BatchLocks = { counters?: CounterKey[]; walletIds?: string[]; spendKeyIds?: string[] };

/** Thrown by a job to have its batch rolled back and its members run alone, without a warning. */
export class RunAlone extends Error {}

type Waiting = { job: BatchJob<unknown, unknown>; input: unknown; resolve: (o: unknown) => void; reject: (e: unknown) => void };

export class GroupCommitWriter {
  readonly #storage: Storage;
  readonly #log: Pick<FastifyBaseLogger, 'warn'> | undefined;
  #queue: Waiting[] = [];
  #busy = false;
  /** Set while only work that may wait is queued (see BatchJob.waitMs). */
  #lazy: NodeJS.Timeout | undefined;
  #drained: (() => void)[] = [];
  readonly #maxBatch: number;
  readonly #highWater: number;
  /** Producers waiting for the queue to fall below the high-water mark. */
  #waitingForRoom: (() => void)[] = [];

  constructor(storage: Storage, log?: Pick<FastifyBaseLogger, 'warn'>, opts: { maxBatch?: number } = {}) {
    this.#storage = storage;
    this.#log = log;
    this.#maxBatch = opts.maxBatch ?? DEFAULT_MAX_BATCH;
    this.#highWater = this.#maxBatch * HIGH_WATER_BATCHES;
  }

  /**
   * Back-pressure: undefined while the queue is below its high-water mark, else a promise that
   * resolves once a batch has taken it below. A producer awaits it before making more work.
   */
  room(): Promise<void> | undefined {
    if (this.#queue.length < this.#highWater) return undefined;
    return new Promise((resolve) => this.#waitingForRoom.push(resolve));
  }

  run<I, O>(job: BatchJob<I, O>, input: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.#queue.push({ job: job as BatchJob<unknown, unknown>, input, resolve: resolve as (o: unknown) => void, reject });
      if (this.#busy) return;
      if (job.waitMs === undefined) this.#start();
      else this.#lazy ??= setTimeout(() => this.#start(), job.waitMs);
    });
  }

  /** Resolves once everything handed in so far is written (work that may wait starts now). */
  drain(): Promise<void> {
    if (this.#lazy) this.#start();
    if (!this.#busy) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }

  #start(): void {
    if (this.#lazy) clearTimeout(this.#lazy);
    this.#lazy = undefined;
    if (this.#busy) return;
    this.#busy = true;
    // One turn of the event loop: requests read in the same turn go in the same batch.
    setImmediate(() => void this.#writeWhileQueued());
  }

  async #writeWhileQueued(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        const batch = this.#queue.splice(0, this.#maxBatch);
        if (this.#queue.length < this.#highWater) for (const resolve of this.#waitingForRoom.splice(0)) resolve();
        await this.#write(batch);
        // Work that may wait, queued while that batch was written, waits for more to join it
        // instead of following at once: a writer kept busy by batches of one would hold the hot
        // wallets' rows locked nearly all the time, and the admissions on them would queue. A
        // full batch goes at once, so a backlog cannot grow while the writer waits.
        const mayWait = this.#queue.length < this.#maxBatch && this.#queue.every((w) => w.job.waitMs !== undefined);
        if (this.#drained.length === 0 && mayWait) break;
      }
    } finally {
      this.#busy = false;
      if (this.#queue.length > 0) this.#lazy ??= setTimeout(() => this.#start(), Math.min(...this.#queue.map((w) => w.job.waitMs ?? 0)));
      else for (const resolve of this.#drained.splice(0)) resolve();
    }
  }

  async #write(batch: Waiting[]): Promise<void> {
    // Jobs by their order; members of a job in arrival order (the sort is stable).
    const byJob = new Map<BatchJob<unknown, unknown>, Waiting[]>();
    for (const waiting of [...batch].sort((a, b) => a.job.order - b.job.order)) {
      const members = byJob.get(waiting.job);
      if (members) members.push(waiting);
      else byJob.set(waiting.job, [waiting]);
    }
    const [only] = byJob.keys();
    if (byJob.size === 1 && only!.inOneStatement) {
      const fast = await only!.inOneStatement(this.#storage, batch.map((w) => w.input)).catch(() => null);
      if (fast) {
        batch.forEach((w, i) => w.resolve(fast[i]));
        return;
      }
    }
    let outcomes: Map<Waiting, unknown>;
    try {
      outcomes = await this.#storage.db.transaction().execute(async (trx) => {
        if (byJob.size > 1 && this.#storage.dialect === 'postgres') await lockForAllJobs(trx, byJob);
        const done = new Map<Waiting, unknown>();
        for (const [job, members] of byJob) {
          const results = await job.inTransaction(trx, this.#storage.dialect, members.map((m) => m.input));
          members.forEach((m, i) => done.set(m, results[i]));
        }
        return done;
      });
    } catch (e) {
      if (!(e instanceof RunAlone)) this.#log?.warn({ err: e, members: batch.length }, 'gateway batch failed; its members run alone');
      await Promise.all(
        batch.map((w) =>
          w.job.alone(this.#storage, w.input).then(
            (outcome) => w.resolve(outcome),
            (error: unknown) => w.reject(error),
          ),
        ),
      );
      return;
    }
    for (const waiting of batch) waiting.resolve(outcomes.get(waiting));
  }
}

/** Takes every lock the batch's jobs declare, in the global order (see BatchJob.locks). */
async function lockForAllJobs(trx: Transaction<Database>, byJob: Map<BatchJob<unknown, unknown>, Waiting[]>): Promise<void> {
  const declared = await Promise.all([...byJob].map(([job, members]) => job.locks(trx, members.map((m) => m.input))));
  await lockUsageCounters(trx, 'postgres', declared.flatMap((d) => d.counters ?? []));
  const walletIds = declared.flatMap((d) => d.walletIds ?? []);
  if (walletIds.length > 0) await lockWallets(trx, 'postgres', walletIds);
  await lockSpendKeys(trx, 'postgres', declared.flatMap((d) => d.spendKeyIds ?? []));
}
