import { createHash } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import { CompiledQuery, Kysely, PostgresDialect, SqliteDialect, SqliteDriver, type DatabaseConnection, type SqliteDialectConfig } from 'kysely';
import pg from 'pg';
import type { Database, Dialect } from './schema.ts';

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
   * SQLite only: how many statements that write this handle has run so far. A row read through
   * it is still what the database holds while this has not moved, but for what another process
   * wrote meanwhile (decision 0011).
   */
  writeCount?: () => number;
  close(): Promise<void>;
};

const PG_INT8_OID = 20;

/** Opens the database named by a DATABASE_URL value (`sqlite:<path>` or `postgres://…`). */
export function openStorage(url: string, opts: { poolSize?: number } = {}): Storage {
  if (url.startsWith('sqlite:')) return openSqlite(url.slice('sqlite:'.length));
  return openPostgres(url, opts.poolSize ?? 20);
}

function openSqlite(path: string): Storage {
  const inMemory = path === ':memory:' || path === '';
  if (!inMemory) mkdirSync(dirname(resolve(path)), { recursive: true });
  const sqlite = new SqliteDatabase(inMemory ? ':memory:' : path);
  sqlite.pragma('journal_mode = WAL');
  sqlite.pragma('busy_timeout = 10000');
  sqlite.pragma('synchronous = NORMAL');
  // Checkpoints copy the WAL into the database file and sync it; hot pages (wallets, index
  // edges) are copied once per checkpoint, so fewer, larger ones (~40 MB of WAL) write less.
  sqlite.pragma('wal_autocheckpoint = 10000');
  sqlite.pragma('foreign_keys = ON');
  // Money is BIGINT; numbers above 2^53 must never pass through a JS number.
  sqlite.defaultSafeIntegers(true);
  const writes = { count: 0 };
  const db = new Kysely<Database>({ dialect: new ImmediateSqliteDialect({ database: withStatementCache(sqlite, writes) }) });
  return {
    db,
    dialect: 'sqlite',
    describe: `sqlite:${inMemory ? ':memory:' : path}`,
    writeCount: () => writes.count,
    close: () => db.destroy(),
  };
}

function openPostgres(url: string, max: number): Storage {
  const pool = postgresPool(url, max, false);
  const pipeline = postgresPool(url, PIPELINE_POOL_SIZE, true);
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  const parsed = new URL(url);
  return {
    db,
    dialect: 'postgres',
    describe: `postgres://${parsed.host}${parsed.pathname}`,
    pipeline,
    close: async () => {
      await db.destroy();
      await pipeline.end();
    },
  };
}

/** Two charge batches in flight (ChargeWriter). */
const PIPELINE_POOL_SIZE = 2;

function postgresPool(url: string, max: number, pipeline: boolean): pg.Pool {
  const pool = new pg.Pool({
    connectionString: url,
    max,
    // While the server is unreachable, a request waits this long for a connection at most, then
    // fails (a 503), instead of queueing for as long as the outage lasts.
    connectionTimeoutMillis: PG_CONNECT_TIMEOUT_MS,
    keepAlive: true,
    Client: PreparingClient,
    pipeline,
    types: {
      getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
        oid === PG_INT8_OID ? (v: string) => BigInt(v) : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  } as pg.PoolConfig);
  // JIT compilation costs ~100 ms per query whose estimate crosses its threshold (the usage
  // report's record scans do), more than it ever saves on queries of our size.
  pool.on('connect', (client) => {
    // A connection that breaks while checked out (its backend terminated, the server gone)
    // emits `error` with no listener of the pool's attached: unheard, that would end the
    // process. The query running on it fails where it is awaited, and the pool drops it on release.
    client.on('error', ignoreConnectionError);
    void client.query('set jit = off').catch(() => undefined);
  });
  // The same for an idle connection: the pool has already removed it.
  pool.on('error', ignoreConnectionError);
  return pool;
}

/** How long a query waits for a connection from the pool (opening one included) before failing. */
export const PG_CONNECT_TIMEOUT_MS = 5_000;

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

const STATEMENT_CACHE_SIZE = 500;

/**
 * Kysely prepares every query anew; preparing costs more than running most of ours. The app issues
 * a small, fixed set of SQL texts, so prepared statements are kept and reused. Every run of a
 * statement that writes is counted in `writes` (Storage.writeCount).
 */
function withStatementCache(sqlite: SqliteDatabase.Database, writes: { count: number }): SqliteDialectConfig['database'] {
  const cache = new Map<string, SqliteDatabase.Statement>();
  return {
    close: () => sqlite.close(),
    prepare: (text: string) => {
      let statement = cache.get(text);
      if (!statement) {
        statement = sqlite.prepare(text);
        if (!statement.readonly) countRuns(statement, writes);
        if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
        cache.set(text, statement);
      }
      return statement;
    },
  };
}

/**
 * Counts each run of a statement that writes, however Kysely runs it (`run`, or `all` for one with
 * RETURNING). Counted before it runs: a statement that fails may still have written part of a
 * transaction that is rolled back later, and a count too many only costs a read.
 */
function countRuns(statement: SqliteDatabase.Statement, writes: { count: number }): void {
  for (const method of ['run', 'all', 'get', 'iterate'] as const) {
    const original = statement[method] as (...args: unknown[]) => unknown;
    (statement as unknown as Record<string, unknown>)[method] = (...args: unknown[]) => {
      writes.count++;
      return original.apply(statement, args);
    };
  }
}

/**
 * SQLite transactions start with BEGIN IMMEDIATE: the write lock is taken up front, so two
 * processes sharing a file queue on busy_timeout instead of failing when a read turns into a write.
 */
class ImmediateSqliteDialect extends SqliteDialect {
  readonly #config: SqliteDialectConfig;
  constructor(config: SqliteDialectConfig) {
    super(config);
    this.#config = config;
  }
  override createDriver(): SqliteDriver {
    return new ImmediateSqliteDriver(this.#config);
  }
}

class ImmediateSqliteDriver extends SqliteDriver {
  override async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }
}
