/**
 * Group commit for every ledger write made in batches: the forward gateway's admissions,
 * settlements and failures, and POST /requests charges (ledger/charge-batch.ts, CHARGE_JOB).
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
import { lockUsageCounters, type CounterKey } from './tier-counters.ts';
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
  /**
   * Runs several members inside the batch's transaction; returns one outcome per member, in order.
   * A job without it runs only in batches of its own (`wholeBatch`).
   */
  inTransaction?(trx: Transaction<Database>, dialect: Storage['dialect'], inputs: I[]): Promise<O[]>;
  /**
   * A batch of this job alone, written its own way (one statement; a pipelined transaction).
   * Returns null (or throws) when it cannot decide the batch; nothing of it is written then, and
   * the batch takes the ordinary transaction (`inTransaction`), or, for a job without one, each
   * member runs alone.
   */
  wholeBatch?(storage: Storage, inputs: I[]): Promise<O[] | null>;
  /** Runs one member on its own (its own transaction), when its batch failed as a whole. */
  alone(storage: Storage, input: I): Promise<O>;
  /**
   * The rows its members lock. Each job locks its own in the global order (tier counters, then
   * wallets, then hold rows, then spend keys), but one job's wallets locked before another job's
   * counters or lower wallets would break that order across the batch, and a transaction elsewhere
   * taking the same rows in order could deadlock with it. So on PostgreSQL a batch of several jobs
   * first locks what all of them declare here, in that order.
   */
  locks?(trx: Transaction<Database>, inputs: I[]): Promise<BatchLocks> | BatchLocks;
  /** A member's share of the writer's `maxBatch` (default 1): e.g. the statement parameters it writes. */
  sizeOf?(input: I): number;
  /**
   * Members with one key never share a batch: a copy waits for the first member with its key, and
   * is then answered by `answerCopy` (when it returns an outcome) or goes in the next batch.
   */
  copies?: { keyOf(input: I): string; answerCopy(first: O): O | undefined };
};

export type BatchLocks = { counters?: CounterKey[]; walletIds?: string[]; spendKeyIds?: string[] };

/** Thrown by a job to have its batch rolled back and its members run alone, without a warning. */
export class RunAlone extends Error {}

type Waiting = {
  job: BatchJob<unknown, unknown>;
  input: unknown;
  resolve: (o: unknown) => void;
  reject: (e: unknown) => void;
  /** Members with this one's key (BatchJob.copies), waiting for its outcome. */
  copies?: Waiting[];
};

class Failure {
  constructor(readonly error: unknown) {}
}

export type WriterOptions = {
  /** The largest batch, in members or in what the jobs' `sizeOf` counts. */
  maxBatch?: number;
  /**
   * Batches written at once (default 1). Two let one batch be built and answered in this process
   * while the database runs the other (decision 0012); only for jobs whose batches lock in the one
   * global order, so they cannot deadlock.
   */
  batchesInFlight?: number;
};

export class GroupCommitWriter {
  readonly #storage: Storage;
  readonly #log: Pick<FastifyBaseLogger, 'warn'> | undefined;
  #queue: Waiting[] = [];
  /** Batch loops running, or scheduled to start on the next turn of the event loop. */
  #writing = 0;
  #scheduled = false;
  /** Set while only work that may wait is queued (see BatchJob.waitMs). */
  #lazy: NodeJS.Timeout | undefined;
  #drained: (() => void)[] = [];
  readonly #maxBatch: number;
  readonly #batchesInFlight: number;
  readonly #highWater: number;
  /** Producers waiting for the queue to fall below the high-water mark. */
  #waitingForRoom: (() => void)[] = [];

  constructor(storage: Storage, log?: Pick<FastifyBaseLogger, 'warn'>, opts: WriterOptions = {}) {
    this.#storage = storage;
    this.#log = log;
    this.#maxBatch = opts.maxBatch ?? DEFAULT_MAX_BATCH;
    this.#batchesInFlight = opts.batchesInFlight ?? 1;
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
      if (job.waitMs === undefined) this.#start();
      // A batch being written takes what may wait when it is done.
      else if (this.#writing === 0) this.#lazy ??= setTimeout(() => this.#start(), job.waitMs);
    });
  }

  /** Resolves once everything handed in so far is written (work that may wait starts now). */
  drain(): Promise<void> {
    if (this.#lazy) this.#start();
    if (this.#writing === 0) return Promise.resolve();
    return new Promise((resolve) => this.#drained.push(resolve));
  }

  #start(): void {
    if (this.#scheduled || this.#writing >= this.#batchesInFlight) return;
    if (this.#lazy) clearTimeout(this.#lazy);
    this.#lazy = undefined;
    this.#writing += 1;
    this.#scheduled = true;
    // One turn of the event loop: requests read in the same turn go in the same batch.
    setImmediate(() => {
      this.#scheduled = false;
      void this.#writeWhileQueued();
    });
  }

  async #writeWhileQueued(): Promise<void> {
    try {
      while (this.#queue.length > 0) {
        const batch = this.#takeBatch();
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
      this.#writing -= 1;
      if (this.#writing === 0) {
        if (this.#queue.length > 0) this.#lazy ??= setTimeout(() => this.#start(), Math.min(...this.#queue.map((w) => w.job.waitMs ?? 0)));
        else for (const resolve of this.#drained.splice(0)) resolve();
      }
    }
  }

  /**
   * Members in arrival order up to `maxBatch` (at least one), stopping at the first that does not
   * fit; a copy of a member taken (BatchJob.copies) leaves the queue to wait for that member.
   */
  #takeBatch(): Waiting[] {
    const batch: Waiting[] = [];
    const rest: Waiting[] = [];
    let firstByKey: Map<string, Waiting> | undefined;
    let size = 0;
    for (const waiting of this.#queue) {
      const { job, input } = waiting;
      const key = job.copies && `${job.order}\n${job.copies.keyOf(input)}`;
      const first = key === undefined ? undefined : firstByKey?.get(key);
      const cost = job.sizeOf ? job.sizeOf(input) : 1;
      if (first) first.copies!.push(waiting);
      else if (batch.length === 0 || (rest.length === 0 && size + cost <= this.#maxBatch)) {
        batch.push(waiting);
        size += cost;
        if (key !== undefined) {
          waiting.copies = [];
          (firstByKey ??= new Map()).set(key, waiting);
        }
      } else rest.push(waiting);
    }
    this.#queue = rest;
    return batch;
  }

  async #write(batch: Waiting[]): Promise<void> {
    const outcomes = await this.#outcomesOf(batch);
    const retry: Waiting[] = [];
    batch.forEach((waiting, i) => {
      const outcome = outcomes[i];
      if (outcome instanceof Failure) waiting.reject(outcome.error);
      else waiting.resolve(outcome);
      if (!waiting.copies) return;
      for (const copy of waiting.copies) {
        const answer = outcome instanceof Failure ? undefined : waiting.job.copies!.answerCopy(outcome);
        if (answer === undefined) retry.push(copy);
        else copy.resolve(answer);
      }
      waiting.copies = undefined;
    });
    if (retry.length > 0) this.#queue.unshift(...retry);
  }

  /** One outcome (or Failure) per member, in the batch's order. */
  async #outcomesOf(batch: Waiting[]): Promise<unknown[]> {
    // Jobs by their order; members of a job in arrival order (the sort is stable).
    const byJob = new Map<BatchJob<unknown, unknown>, Waiting[]>();
    for (const waiting of batch.length > 1 ? [...batch].sort((a, b) => a.job.order - b.job.order) : batch) {
      const members = byJob.get(waiting.job);
      if (members) members.push(waiting);
      else byJob.set(waiting.job, [waiting]);
    }
    const [only] = byJob.keys();
    if (byJob.size === 1 && only!.wholeBatch) {
      const whole = await only!.wholeBatch(this.#storage, batch.map((w) => w.input)).catch((e: unknown) => new Failure(e));
      if (whole && !(whole instanceof Failure)) return whole;
      if (!only!.inTransaction) return this.#eachAlone(batch, whole instanceof Failure ? whole.error : new RunAlone());
    }
    let failure: unknown = new Error('a batch job without inTransaction shared its batch');
    if ([...byJob.keys()].every((job) => job.inTransaction)) {
      try {
        const outcomes = await this.#storage.db.transaction().execute(async (trx) => {
          if (byJob.size > 1 && this.#storage.dialect === 'postgres') await lockForAllJobs(trx, byJob);
          const done = new Map<Waiting, unknown>();
          for (const [job, members] of byJob) {
            const results = await job.inTransaction!(trx, this.#storage.dialect, members.map((m) => m.input));
            members.forEach((m, i) => done.set(m, results[i]));
          }
          return done;
        });
        return batch.map((w) => outcomes.get(w));
      } catch (e) {
        failure = e;
      }
    }
    return this.#eachAlone(batch, failure);
  }

  #eachAlone(batch: Waiting[], failure: unknown): Promise<unknown[]> {
    if (!(failure instanceof RunAlone)) this.#log?.warn({ err: failure, members: batch.length }, 'a group-commit batch failed; its members run alone');
    return Promise.all(batch.map((w) => w.job.alone(this.#storage, w.input).catch((error: unknown) => new Failure(error))));
  }
}

/** Takes every lock the batch's jobs declare, in the global order (see BatchJob.locks). */
async function lockForAllJobs(trx: Transaction<Database>, byJob: Map<BatchJob<unknown, unknown>, Waiting[]>): Promise<void> {
  const declared = await Promise.all([...byJob].map(([job, members]) => job.locks?.(trx, members.map((m) => m.input)) ?? {}));
  await lockUsageCounters(trx, 'postgres', declared.flatMap((d) => d.counters ?? []));
  const walletIds = declared.flatMap((d) => d.walletIds ?? []);
  if (walletIds.length > 0) await lockWallets(trx, 'postgres', walletIds);
  await lockSpendKeys(trx, 'postgres', declared.flatMap((d) => d.spendKeyIds ?? []));
}
