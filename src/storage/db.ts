import { createHash } from 'node:crypto';
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import type { Database, Dialect } from './schema.ts';
import { openSqlite as openSqliteHandle } from './sqlite.ts';
import { openReadReplica, type ReadReplica } from './read-replica.ts';
import type { SqliteWriter } from './sqlite-writer.ts';

export type Storage = {
  db: Kysely<Database>;
  dialect: Dialect;
  /** A short description without credentials, for logs. */
  describe: string;
  /**
   * PostgreSQL only: connections in pipeline mode, for the POST /requests charge batches.
   * Statements sent together travel together (BEGIN with a batch's first statement, its last with
   * COMMIT), so a batch pays two round trips instead of four (pipelined-transaction.ts).
   */
  pipeline?: pg.Pool;
  /**
   * SQLite only: moves with every statement that may write, when it is sent and again when it is
   * answered (a database file's writes run on the writer thread, sqlite.ts). A row read through this
   * handle is still what the database holds while this has not moved, but for what another process
   * wrote meanwhile (decision 0011).
   */
  writeCount?: () => number;
  /** SQLite database files only: the thread that runs every write, transaction and checkpoint (decision 0011). */
  writer?: SqliteWriter;
  /**
   * PostgreSQL with DATABASE_READ_URL: the streaming replica that report reads go to (decision
   * 0041). Only reads that decide no money and write nothing take it, through `reportsOf`.
   */
  replica?: ReadReplica;
  close(): Promise<void>;
};

/**
 * Where a report (usage, request lists, dashboard pages of them) reads: the replica when one is
 * configured (the primary while the replica is down), else the database itself. Never for a read
 * that decides money or precedes a write: a replica may be seconds behind.
 */
export function reportsOf(storage: Storage): Storage {
  return storage.replica?.reads ?? storage;
}

const PG_INT8_OID = 20;

/** Opens the database named by a DATABASE_URL value (`sqlite:<path>` or `postgres://…`). */
export function openStorage(
  url: string,
  opts: { poolSize?: number; onWriterDeath?: (error: Error) => void; readUrl?: string | undefined } = {},
): Storage {
  if (url.startsWith('sqlite:')) {
    if (opts.readUrl !== undefined) throw new Error('DATABASE_READ_URL needs a PostgreSQL DATABASE_URL');
    return openSqlite(url.slice('sqlite:'.length), opts.onWriterDeath);
  }
  return openPostgres(url, opts.poolSize ?? 20, opts.readUrl);
}

function openSqlite(path: string, onWriterDeath?: (error: Error) => void): Storage {
  const { db, describe, writeCount, writer } = openSqliteHandle(path, onWriterDeath ? { onWriterDeath } : {});
  return { db, dialect: 'sqlite', describe, writeCount, ...(writer ? { writer } : {}), close: () => db.destroy() };
}

function openPostgres(url: string, max: number, readUrl: string | undefined): Storage {
  const pool = postgresPool(url, max, false);
  const pipeline = postgresPool(url, PIPELINE_POOL_SIZE, true);
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const replica = readUrl === undefined ? undefined : openReadReplica(readUrl, { primary: pool, primaryDb: db, max, openPool: postgresPool, describe: describePostgres(readUrl) });
  return {
    db,
    dialect: 'postgres',
    describe: describePostgres(url),
    pipeline,
    ...(replica ? { replica } : {}),
    close: async () => {
      await replica?.close();
      await db.destroy();
      await pipeline.end();
    },
  };
}

/** A PostgreSQL URL without its credentials, for logs. */
export function describePostgres(url: string): string {
  const parsed = new URL(url);
  return `postgres://${parsed.host}${parsed.pathname}`;
}

/** Two charge batches in flight (chargeWriter in ledger/charge-batch.ts). */
const PIPELINE_POOL_SIZE = 2;

export function postgresPool(url: string, max: number, pipeline: boolean, connectTimeoutMs = PG_CONNECT_TIMEOUT_MS): pg.Pool {
  const pool = new pg.Pool({
    ...withSessionOptions(url),
    max,
    // While the server is unreachable, a request waits this long for a connection at most, then
    // fails (a 503), instead of queueing for as long as the outage lasts.
    connectionTimeoutMillis: connectTimeoutMs,
    keepAlive: true,
    Client: PreparingClient,
    pipeline,
    types: {
      getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
        oid === PG_INT8_OID ? (v: string) => BigInt(v) : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  } as pg.PoolConfig);
  pool.on('connect', (client) => {
    // A connection that breaks while checked out (its backend terminated, the server gone)
    // emits `error` with no listener of the pool's attached: unheard, that would end the
    // process. The query running on it fails where it is awaited, and the pool drops it on release.
    client.on('error', ignoreConnectionError);
  });
  // The same for an idle connection: the pool has already removed it.
  pool.on('error', ignoreConnectionError);
  return pool;
}

/**
 * Settings every session starts with, sent in the startup packet (no statement of their own).
 * JIT compilation costs ~100 ms per query whose estimate crosses its threshold (the usage report's
 * and verify-ledger's scans do), more than it ever saves on queries of our size. Options the
 * URL gives itself (`?options=…`) would replace these (pg prefers the URL's), so they move out of
 * the URL and run first, ours after them.
 */
function withSessionOptions(url: string): { connectionString: string; options: string } {
  const own = '-c jit=off';
  const parsed = new URL(url);
  const fromUrl = parsed.searchParams.get('options');
  if (fromUrl === null) return { connectionString: url, options: own };
  parsed.searchParams.delete('options');
  return { connectionString: parsed.toString(), options: `${fromUrl} ${own}` };
}

/** How long a query waits for a connection from the pool (opening one included) before failing. */
const PG_CONNECT_TIMEOUT_MS = 5_000;

/**
 * A broken connection is not news of its own: whatever was using it fails with the error, and
 * the next checkout opens a new one. (An `error` event nobody listens to would end the process.)
 */
function ignoreConnectionError(): void {}

/**
 * Marks a statement text for PostgreSQL to keep prepared on each connection: parsed and planned
 * once, then only bound and run. Only fixed texts belong here (values travel as parameters, lists
 * as arrays or JSON), since each text stays prepared for the connection's life. The hot statements
 * are marked: for them parsing and planning cost as much as running.
 */
export function prepared(text: string): string {
  return PREPARED_MARK + text;
}

const PREPARED_MARK = '/* prepared */ ';
/** A guard against a marked text that is not fixed after all: past this many, texts run unprepared. */
const MAX_PREPARED_TEXTS = 200;
const preparedNames = new Map<string, string>();

function preparedNameOf(text: string): string | undefined {
  let name = preparedNames.get(text);
  if (name === undefined && preparedNames.size < MAX_PREPARED_TEXTS) {
    name = `tg_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
    preparedNames.set(text, name);
  }
  return name;
}

/** A pg client that runs texts marked by `prepared` as named prepared statements (Kysely passes text and values only). */
class PreparingClient extends pg.Client {}
const unpreparedQuery = pg.Client.prototype.query as (this: pg.Client, ...args: unknown[]) => unknown;
PreparingClient.prototype.query = function query(this: pg.Client, ...args: unknown[]) {
  const [text, values] = args;
  if (args.length === 2 && typeof text === 'string' && text.startsWith(PREPARED_MARK)) {
    const name = preparedNameOf(text);
    if (name) return unpreparedQuery.call(this, { name, text, values });
  }
  return unpreparedQuery.apply(this, args);
} as typeof pg.Client.prototype.query;
