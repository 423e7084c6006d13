import { Worker } from 'node:worker_threads';
import SqliteDatabase from 'better-sqlite3';

/** What a statement run by the writer thread answers (as better-sqlite3's `all` or `run` would). */
export type WriterResult = { rows?: unknown[]; changes?: number; lastInsertRowid?: bigint | number };

type Reply = WriterResult & { id: number; error?: { message: string; code?: string } };
type Pending = { resolve: (result: WriterResult) => void; reject: (error: Error) => void };

/** The worker's source: next to this module, in src/ as in dist/ (the build copies it). */
const WORKER_URL = new URL('./sqlite-writer-thread.mjs', import.meta.url);

/** A statement sent to a writer thread that died before answering: it may or may not have run, but no transaction of it committed unless its COMMIT was answered. */
export class WriterThreadDied extends Error {
  readonly code = 'SQLITE_WRITER_DIED';
}

/**
 * The SQLite connection that writes, on a worker thread of its own (decision 0011, "Writes off the
 * event loop"): statements are sent to it and answered asynchronously, so a commit, a large batch
 * or a WAL checkpoint never stalls the thread that serves requests.
 *
 * When the thread dies (an uncaught error, out of memory), every statement waiting on it fails with
 * WriterThreadDied, `onDeath` is told (the server logs it as an error), and the next statement starts
 * a new thread with a new connection. SQLite rolled back whatever transaction the dead connection
 * had open; `generation` tells its owner that its transaction is gone.
 */
export class SqliteWriter {
  readonly #path: string;
  readonly #autocheckpointPages: number;
  readonly #cacheKib: number;
  readonly #onDeath: (error: Error) => void;
  #worker: Worker | undefined;
  #generation = 0;
  #nextId = 0;
  readonly #pending = new Map<number, Pending>();
  #closing = false;
  #idle: (() => void)[] = [];

  constructor(path: string, opts: { autocheckpointPages: number; cacheKib: number; onDeath: (error: Error) => void }) {
    this.#path = path;
    this.#autocheckpointPages = opts.autocheckpointPages;
    this.#cacheKib = opts.cacheKib;
    this.#onDeath = opts.onDeath;
  }

  /** Changes each time a thread dies: a transaction begun on an earlier generation is gone. */
  get generation(): number {
    return this.#generation;
  }

  /** The running thread, if any (tests end it to prove a death is survived). */
  get thread(): Worker | undefined {
    return this.#worker;
  }

  run(sql: string, parameters: readonly unknown[]): Promise<WriterResult> {
    if (this.#closing) return Promise.reject(new Error('the SQLite storage is closed'));
    const worker = this.#running();
    const id = this.#nextId++;
    return new Promise<WriterResult>((resolve, reject) => {
      if (this.#pending.size === 0) worker.ref();
      this.#pending.set(id, { resolve, reject });
      worker.postMessage({ id, sql, parameters });
    });
  }

  /** Rolls back a transaction its owner left open, behind every statement sent before. */
  release(): void {
    this.#worker?.postMessage({ release: true });
  }

  /** Waits for every statement sent so far to be answered, then closes the connection and ends the thread. */
  async close(): Promise<void> {
    this.#closing = true;
    if (this.#pending.size > 0) await new Promise<void>((resolve) => this.#idle.push(resolve));
    const worker = this.#worker;
    if (!worker) return;
    const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    // Kept alive until the connection is closed (its last checkpoint done).
    worker.ref();
    worker.postMessage({ close: true });
    await exited;
  }

  #running(): Worker {
    if (this.#worker) return this.#worker;
    const worker = new Worker(WORKER_URL, { workerData: { path: this.#path, autocheckpointPages: this.#autocheckpointPages, cacheKib: this.#cacheKib } });
    // An idle writer must not keep the process alive; one with statements in flight must (see run).
    worker.unref();
    worker.on('message', (reply: Reply) => this.#answer(reply));
    let failure: Error | undefined;
    worker.on('error', (error) => (failure = error));
    worker.on('exit', (code) => this.#exited(worker, failure ?? new Error(`the SQLite writer thread exited with code ${code}`)));
    this.#worker = worker;
    return worker;
  }

  #answer(reply: Reply): void {
    const pending = this.#pending.get(reply.id);
    if (!pending) return;
    this.#pending.delete(reply.id);
    if (this.#pending.size === 0) this.#becameIdle();
    if (reply.error) pending.reject(sqliteError(reply.error));
    else pending.resolve(reply);
  }

  #exited(worker: Worker, cause: Error): void {
    if (this.#worker !== worker) return;
    this.#worker = undefined;
    const expected = this.#closing && this.#pending.size === 0;
    if (expected) return;
    this.#generation++;
    const died = new WriterThreadDied(`the SQLite writer thread died: ${cause.message}`, { cause });
    const waiting = [...this.#pending.values()];
    this.#pending.clear();
    this.#becameIdle();
    for (const pending of waiting) pending.reject(died);
    this.#onDeath(died);
  }

  #becameIdle(): void {
    this.#worker?.unref();
    for (const resolve of this.#idle.splice(0)) resolve();
  }
}

/** The error better-sqlite3 would have thrown on this thread (same class and `code`, so callers tell a unique violation). */
function sqliteError(error: { message: string; code?: string }): Error {
  return new SqliteDatabase.SqliteError(error.message, error.code ?? 'SQLITE_ERROR');
}
