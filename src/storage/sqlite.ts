/**
 * SQLite through Kysely (better-sqlite3). A database file gets two connections: this thread's, which
 * only reads, and the writer thread's (sqlite-writer.ts), which runs every statement that writes,
 * every transaction and every WAL checkpoint (decision 0011, "Writes off the event loop"). An
 * in-memory database cannot be shared between threads: it keeps one connection on this thread,
 * which does everything, as every SQLite database did before.
 */
import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import SqliteDatabase from 'better-sqlite3';
import {
  CompiledQuery,
  Kysely,
  SqliteAdapter,
  SqliteDialect,
  SqliteDriver,
  SqliteIntrospector,
  SqliteQueryCompiler,
  type DatabaseConnection,
  type Dialect,
  type Driver,
  type QueryResult,
  type SqliteDialectConfig,
} from 'kysely';
import type { Database } from './schema.ts';
import { configureConnection, runStatementList, STATEMENT_CACHE_SIZE, STATEMENT_LIST, type ListedStatement } from './sqlite-connection.mjs';
import { SqliteWriter, type WriterResult } from './sqlite-writer.ts';

export type SqliteHandle = {
  db: Kysely<Database>;
  describe: string;
  writeCount: () => number;
  /** Set for a database file: the thread that writes it. */
  writer?: SqliteWriter;
};

/**
 * Checkpoints copy the WAL into the database file and sync it; hot pages (wallets, index edges) are
 * copied once per checkpoint, so fewer, larger ones (~40 MB of WAL) write less.
 */
const AUTOCHECKPOINT_PAGES = 10_000;

/**
 * The writer's page cache, in KiB. better-sqlite3 builds SQLite with 16 MB per connection
 * (`SQLITE_DEFAULT_CACHE_SIZE=-16000`); the writer's connection filled it under gateway load, in
 * the writer thread's own malloc arena, on top of the reading connection's. Its transactions append
 * to time-ordered B-trees (ULID keys), whose hot pages are few, so SQLite's own default of 2 MB
 * keeps them (decision 0011, "Memory": ~20 MB less peak RSS, no measurable cost).
 */
const WRITER_CACHE_KIB = 2000;

export function openSqlite(path: string, opts: { onWriterDeath?: (error: Error) => void } = {}): SqliteHandle {
  const inMemory = path === ':memory:' || path === '';
  const writes = { count: 0 };
  if (inMemory) {
    const sqlite = new SqliteDatabase(':memory:');
    configureConnection(sqlite);
    sqlite.pragma('foreign_keys = ON');
    sqlite.pragma(`wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`);
    const db = new Kysely<Database>({ dialect: new ImmediateSqliteDialect({ database: withStatementCache(sqlite, writes) }) });
    return { db, describe: 'sqlite::memory:', writeCount: () => writes.count };
  }
  mkdirSync(dirname(resolve(path)), { recursive: true });
  const reader = new SqliteDatabase(path);
  configureConnection(reader);
  // Only the writer thread commits, so only it would checkpoint; this connection must never.
  reader.pragma('wal_autocheckpoint = 0');
  reader.pragma('query_only = ON');
  const writer = new SqliteWriter(path, {
    autocheckpointPages: AUTOCHECKPOINT_PAGES,
    cacheKib: WRITER_CACHE_KIB,
    onDeath: opts.onWriterDeath ?? ((error) => console.error(error)),
  });
  const db = new Kysely<Database>({ dialect: new RoutedSqliteDialect(new RoutedSqliteDriver(withStatementCache(reader), writer, writes)) });
  return { db, describe: `sqlite:${path}`, writeCount: () => writes.count, writer };
}

/**
 * Several statements as one query: run in order in the caller's transaction, answered with one row
 * `{ returned }` per statement (how many rows it returned; 0 without RETURNING). A database file's
 * statements go to the writer thread as one message, so a batch that writes many tables waits for
 * one answer instead of one per statement (Kysely runs a transaction's queries one at a time).
 */
export function statementList(queries: CompiledQuery[]): CompiledQuery<{ returned: number }> {
  return CompiledQuery.raw(
    STATEMENT_LIST,
    queries.map((query) => ({ sql: query.sql, parameters: query.parameters })),
  ) as CompiledQuery<{ returned: number }>;
}

/**
 * A statement list on this thread's connection (an in-memory database): a statement-like object
 * for Kysely, answering as the writer thread does for a database file (runStatementList).
 */
function listRunner(prepare: (text: string) => SqliteDatabase.Statement): SqliteDatabase.Statement {
  const all = (list: ListedStatement[]) => runStatementList(prepare, list);
  return { reader: true, readonly: false, all } as unknown as SqliteDatabase.Statement;
}

type StatementSource = { prepare(text: string): SqliteDatabase.Statement; close(): void };

/**
 * Kysely prepares every query anew; preparing costs more than running most of ours. The app issues
 * a small, fixed set of SQL texts, so prepared statements are kept and reused. With `writes`, every
 * run of a statement that writes is counted in it (Storage.writeCount).
 */
function withStatementCache(sqlite: SqliteDatabase.Database, writes?: { count: number }): StatementSource {
  const cache = new Map<string, SqliteDatabase.Statement>();
  const source: StatementSource = {
    close: () => sqlite.close(),
    prepare: (text: string) => {
      if (text === STATEMENT_LIST) return listRunner(source.prepare);
      let statement = cache.get(text);
      if (!statement) {
        statement = sqlite.prepare(text);
        if (writes && !statement.readonly) countRuns(statement, writes);
        if (cache.size >= STATEMENT_CACHE_SIZE) cache.delete(cache.keys().next().value!);
        cache.set(text, statement);
      }
      return statement;
    },
  };
  return source;
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

class RoutedSqliteDialect implements Dialect {
  readonly #driver: RoutedSqliteDriver;
  constructor(driver: RoutedSqliteDriver) {
    this.#driver = driver;
  }
  createDriver(): Driver {
    return this.#driver;
  }
  createQueryCompiler() {
    return new SqliteQueryCompiler();
  }
  createAdapter() {
    return new SqliteAdapter();
  }
  createIntrospector(db: Kysely<unknown>) {
    return new SqliteIntrospector(db);
  }
}

/** Statements that begin or end a transaction: better-sqlite3 calls them read-only, but they belong to the writer. */
const TRANSACTION_CONTROL = /^\s*(begin|commit|end|rollback|savepoint|release)\b/i;

/**
 * Sends each statement to the connection it belongs to. A read outside a transaction runs here at
 * once on the reading connection: WAL readers are never blocked, and each read sees every
 * transaction committed before it (and nothing of one still open). Anything else — a statement
 * that writes, a transaction and all its statements — takes the writer: one user at a time, as
 * SQLite's single write lock requires. A connection keeps the writer from its first such statement
 * until Kysely releases it.
 */
class RoutedSqliteDriver implements Driver {
  readonly #reader: StatementSource;
  readonly writer: SqliteWriter;
  /** Counts statements sent to the writer, as sent and as answered (Storage.writeCount). */
  readonly writes: { count: number };
  readonly writerTurn = new Turn();

  constructor(reader: StatementSource, writer: SqliteWriter, writes: { count: number }) {
    this.#reader = reader;
    this.writer = writer;
    this.writes = writes;
  }

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    return new RoutedConnection(this);
  }

  /** A statement the reading connection may run now; undefined when it belongs to the writer. */
  readable(text: string): SqliteDatabase.Statement | undefined {
    if (TRANSACTION_CONTROL.test(text)) return undefined;
    let statement: SqliteDatabase.Statement;
    try {
      statement = this.#reader.prepare(text);
    } catch {
      // Names a table the writer may be creating, or is wrong: the writer answers either way.
      return undefined;
    }
    return statement.readonly ? statement : undefined;
  }

  async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }
  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('commit'));
  }
  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('rollback'));
  }
  async savepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`savepoint "${name}"`));
  }
  async rollbackToSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`rollback to "${name}"`));
  }
  async releaseSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`release "${name}"`));
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    (connection as RoutedConnection).release();
  }

  /** Lets every write already asked for run (none is lost at shutdown), then closes both connections. */
  async destroy(): Promise<void> {
    await this.writerTurn.idle();
    // The writer's connection closes last, so SQLite's final checkpoint runs on its thread too.
    this.#reader.close();
    await this.writer.close();
  }
}

class RoutedConnection implements DatabaseConnection {
  readonly #driver: RoutedSqliteDriver;
  /** The writer's generation while this connection holds the writer's turn. */
  #holding: number | undefined;

  constructor(driver: RoutedSqliteDriver) {
    this.#driver = driver;
  }

  async executeQuery<R>(query: CompiledQuery): Promise<QueryResult<R>> {
    if (this.#holding === undefined) {
      const readable = query.sql === STATEMENT_LIST ? undefined : this.#driver.readable(query.sql);
      if (readable) return resultOf(readable.reader ? { rows: readable.all(query.parameters) } : readable.run(query.parameters));
      await this.#driver.writerTurn.take();
      this.#holding = this.#driver.writer.generation;
    }
    const { writer, writes } = this.#driver;
    if (writer.generation !== this.#holding) {
      // The writer thread died under this connection: SQLite rolled its transaction back. Nothing
      // more may run on it, or it would commit on its own what was meant to be part of that one.
      if (/^\s*rollback\b/i.test(query.sql)) return { rows: [] };
      throw new Error('the SQLite writer thread died during this transaction; none of it was committed');
    }
    writes.count++;
    try {
      return resultOf(await writer.run(query.sql, query.parameters));
    } finally {
      writes.count++;
    }
  }

  async *streamQuery<R>(): AsyncIterableIterator<QueryResult<R>> {
    throw new Error('streaming is not used on SQLite');
  }

  release(): void {
    if (this.#holding === undefined) return;
    // A transaction left open (its owner failed before COMMIT or ROLLBACK) must not take in the next owner's statements.
    if (this.#holding === this.#driver.writer.generation) this.#driver.writer.release();
    this.#holding = undefined;
    this.#driver.writerTurn.give();
  }
}

function resultOf<R>(result: WriterResult): QueryResult<R> {
  if (result.rows) return { rows: result.rows as R[] };
  const { changes, lastInsertRowid } = result;
  return {
    numAffectedRows: changes === undefined || changes === null ? undefined : BigInt(changes),
    insertId: lastInsertRowid === undefined || lastInsertRowid === null ? undefined : BigInt(lastInsertRowid),
    rows: [],
  };
}

/** Whose turn it is to use the writer: one connection at a time, in the order they asked. */
class Turn {
  #held = false;
  readonly #waiting: (() => void)[] = [];
  readonly #idle: (() => void)[] = [];

  take(): Promise<void> | void {
    if (!this.#held) {
      this.#held = true;
      return;
    }
    return new Promise((resolve) => this.#waiting.push(resolve));
  }

  give(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else {
      this.#held = false;
      for (const resolve of this.#idle.splice(0)) resolve();
    }
  }

  /** Resolves once nobody holds or waits for the turn. */
  idle(): Promise<void> | void {
    if (this.#held) return new Promise((resolve) => this.#idle.push(resolve));
  }
}
