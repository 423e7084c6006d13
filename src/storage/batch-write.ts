/**
 * Multi-row writes of a batch, on both engines. `runWrites` runs a batch's writes described by
 * table and rows (`BatchWrite`) inside a Kysely transaction (settlements; POST /requests on SQLite):
 * on SQLite as multi-row statements whose texts are made once, on PostgreSQL as one statement of
 * data-modifying CTEs, each write's rows one JSON parameter (`JsonRows`), its text fixed and
 * prepared once per connection. `batchStatement`, the POST /requests batch on PostgreSQL, is built
 * the same way, with its own handling of a request id already taken.
 */
import { CompiledQuery, sql, type Kysely, type Transaction } from 'kysely';
import { prepared } from './db.ts';
import { statementList } from './sqlite.ts';
import type { RequestRow } from './requests.ts';
import { rollupWrites } from './rollups.ts';
import { carriedAddition } from './exact-sum.ts';
import {
  COUNTER_KEY,
  type Database,
  type EventsTable,
  type LedgerPostingsTable,
  type LedgerTransactionsTable,
  type MeterUsageCountersTable,
  type RequestMetadataTable,
  type WalletsTable,
} from './schema.ts';

/** Every row a batch of charged requests writes, built in memory under the batch's locks. */
export type BatchRows = {
  requests: RequestRow[];
  metadata: RequestMetadataTable[];
  wallets: Pick<WalletsTable, 'id' | 'balance' | 'cycle_credit' | 'bundle_credit'>[];
  counters: MeterUsageCountersTable[];
  transactions: LedgerTransactionsTable[];
  postings: LedgerPostingsTable[];
  events: EventsTable[];
};

/**
 * Writes a batch on SQLite (the records, then every other table's rows as one message to the
 * writer thread: runWrites), unless a request's (merchant, request_id) is taken already: then only
 * the requests rows may have been written, and the ids of the taken records come back for the
 * caller to roll the transaction back. PostgreSQL writes a batch with batchStatement instead.
 */
export async function writeBatch(trx: Transaction<Database>, rows: BatchRows): Promise<{ taken: string[] }> {
  if (rows.requests.length === 0) return { taken: [] };
  const inserted = await writeTableByTable(trx, rows);
  if (inserted.size === rows.requests.length) return { taken: [] };
  return { taken: rows.requests.filter((r) => !inserted.has(r.id)).map((r) => r.id) };
}

/** Requests rows in (merchant, request_id) order: two writers of the same ids wait in one order and cannot deadlock. */
function inKeyOrder(requests: RequestRow[]): RequestRow[] {
  const key = (r: RequestRow) => `${r.merchant_id}\n${r.request_id}`;
  return [...requests].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

async function writeTableByTable(trx: Transaction<Database>, rows: BatchRows): Promise<Set<string>> {
  const inserted = await trx
    .insertInto('requests')
    .values(inKeyOrder(rows.requests))
    .onConflict((oc) => oc.columns(['merchant_id', 'request_id']).doNothing())
    .returning('id')
    .execute();
  if (inserted.length !== rows.requests.length) return new Set(inserted.map((r) => r.id));
  await runWrites(trx, 'sqlite', writesBesideRecords(rows));
  return new Set(inserted.map((r) => r.id));
}

/**
 * A batch as one PostgreSQL statement of data-modifying CTEs (a round trip per statement is most
 * of the cost, and each is made while the batch's rows are locked), prepared once per connection
 * (runWrites' PostgreSQL form: parsing and planning it was as much as running it). A request whose
 * (merchant, request_id) is taken fails the statement on the unique index named by
 * REQUEST_ID_TAKEN (see takenRequests).
 */
export function batchStatement(rows: BatchRows): { text: string; values: string[] } {
  const writes: BatchWrite[] = [{ insert: 'requests', rows: inKeyOrder(rows.requests) }, ...writesBesideRecords(rows)];
  return postgresWrites(writes.filter((write) => write.rows.length > 0));
}

/**
 * What a batch of charged requests writes beside their records. The tier counters were created
 * when they were locked, so they are updated.
 */
function writesBesideRecords(rows: BatchRows): BatchWrite[] {
  return [
    { insert: 'request_metadata', rows: rows.metadata },
    ...rollupWrites(rows.requests),
    { update: 'wallets', key: ['id'], rows: rows.wallets },
    { update: 'meter_usage_counters', key: COUNTER_KEY, rows: rows.counters },
    { insert: 'ledger_transactions', rows: rows.transactions },
    { insert: 'ledger_postings', rows: rows.postings },
    { insert: 'events', rows: rows.events },
  ];
}

/** The ids of records whose (merchant, request_id) an earlier record of the same batch has: one statement cannot insert both. */
export function repeatedRequests(requests: RequestRow[]): string[] {
  const seen = new Set<string>();
  return requests.flatMap((r) => {
    const key = `${r.merchant_id}\n${r.request_id}`;
    if (seen.has(key)) return [r.id];
    seen.add(key);
    return [];
  });
}

/** The unique index a taken (merchant, request_id) violates. */
export const REQUEST_ID_TAKEN = 'requests_request_id_uq';

/** The ids of the batch's records whose (merchant, request_id) is recorded already (by a transaction that committed first). */
export async function takenRequests(db: Kysely<Database>, requests: RequestRow[]): Promise<string[]> {
  const keys = jsonRows(requests.map((r) => ({ merchant_id: r.merchant_id, request_id: r.request_id })));
  const found = await sql<{ merchant_id: string; request_id: string }>`
    select requests.merchant_id, requests.request_id from requests
    join json_to_recordset(${keys}::json) as k(merchant_id text, request_id text)
      on requests.merchant_id = k.merchant_id and requests.request_id = k.request_id`.execute(db);
  const taken = new Set(found.rows.map((r) => `${r.merchant_id}\n${r.request_id}`));
  return requests.filter((r) => taken.has(`${r.merchant_id}\n${r.request_id}`)).map((r) => r.id);
}

/**
 * Rows handed to a statement as JSON parameters, one per list: its text depends on the tables and
 * columns only, never on how many rows there are, so it can be prepared once.
 */
export class JsonRows {
  readonly values: string[] = [];
  /** `select <columns> from json_populate_recordset(null::<table>, $n)`: the rows typed by the table's row type. */
  select<T extends object>(table: string, rows: T[], columns = columnsOf(rows)): string {
    this.values.push(jsonRows(rows));
    return `select ${columns.join(', ')} from json_populate_recordset(null::${table}, $${this.values.length})`;
  }
  insert<T extends object>(table: string, rows: T[], columns = columnsOf(rows)): string {
    return `insert into ${table} (${columns.join(', ')}) ${this.select(table, rows, columns)}`;
  }
}

type TableName = keyof Database & string;

/**
 * A write of a batch, described by its table and rows; runWrites renders it for the engine. Every
 * row of a write has the columns of its first (one function per table builds them).
 * - `insert`: the rows as they are.
 * - `addTo`: each row's `sums` added to the stored row with the same `key`; inserted where none is.
 *   A `carried` sum is a total kept in two columns (exact-sum.ts carriedAddition): its remainder
 *   and `<sum>_carry`, so it is exact at any size.
 * - `update`: each row's other columns set on the stored row with its `key` (a `subtract` column
 *   is taken off the stored value instead), only where `onlyIf` holds; a `counted` update returns
 *   how many rows it changed.
 */
export type BatchWrite =
  | { insert: TableName; rows: object[] }
  | { addTo: TableName; key: readonly string[]; sums: readonly string[]; carried?: readonly string[]; rows: object[] }
  | {
      update: TableName;
      key: readonly string[];
      rows: object[];
      subtract?: readonly string[];
      onlyIf?: { column: string; is: 'pending' | 'active' };
      counted?: boolean;
    };

/**
 * Runs a batch's writes in order, and returns for each how many rows it changed (counted updates;
 * 0 for the others). No write goes through Kysely's query builder: a batch's statements are the
 * same few texts whatever its size. On PostgreSQL they go as one statement of data-modifying CTEs
 * (one round trip, made while the batch's rows are locked), each write's rows one JSON parameter,
 * a text prepared once per connection; on SQLite as multi-row statements, all of them one message
 * to the writer thread (statementList: a message per statement made every batch wait for as many
 * answers, ~25 % fewer POST /requests per second). Two writes of one batch never change the
 * same row: on PostgreSQL only one of the two would take effect.
 */
export async function runWrites(trx: Transaction<Database>, dialect: 'sqlite' | 'postgres', writes: BatchWrite[]): Promise<number[]> {
  const present = writes.filter((write) => write.rows.length > 0);
  const counts = new Map<BatchWrite, number>();
  if (dialect === 'postgres' && present.length > 0) {
    const { text, values } = postgresWrites(present);
    const { rows } = await trx.executeQuery<{ counts: string }>(CompiledQuery.raw(text, values));
    rows[0]!.counts.split(',').forEach((count, i) => counts.set(present[i]!, Number(count)));
  }
  if (dialect === 'sqlite' && present.length > 0) {
    const statements = present.flatMap((write) => sqliteWrite(write).map((query) => ({ write, query })));
    const { rows } = await trx.executeQuery(statementList(statements.map((s) => s.query)));
    rows.forEach(({ returned }, i) => counts.set(statements[i]!.write, (counts.get(statements[i]!.write) ?? 0) + returned));
  }
  return writes.map((write) => counts.get(write) ?? 0);
}

/**
 * The writes as one PostgreSQL statement, its text fixed by the writes' tables and columns alone.
 * Rows as JSON rather than a parameter per value: on PostgreSQL the gateway's own CPU, not the
 * database's, bounds its throughput (by hand, at 32 connections: ~1.0 core for the gateway, ~0.4
 * for PostgreSQL), so PostgreSQL's extra JSON work is the cheaper side (A/B: ~10 % more requests
 * per second than Kysely's multi-row inserts).
 */
function postgresWrites(writes: BatchWrite[]): { text: string; values: string[] } {
  const json = new JsonRows();
  const ctes = writes.map((write, i) => `w${i} as (${postgresWrite(json, write)})`);
  // An array, not a function of one argument per write: PostgreSQL functions take at most 100 arguments.
  const counts = writes.map((write, i) => ('update' in write && write.counted ? `(select count(*) from w${i})` : '0'));
  return { text: prepared(`with ${ctes.join(',\n')} select array_to_string(array[${counts.join(', ')}]::bigint[], ',') as counts`), values: json.values };
}

function postgresWrite(json: JsonRows, write: BatchWrite): string {
  if ('insert' in write) return json.insert(write.insert, write.rows);
  if ('addTo' in write) {
    const table = write.addTo;
    return `${json.insert(table, write.rows)} on conflict (${write.key.join(', ')}) do update set ${additions(write).join(', ')}`;
  }
  const table = write.update;
  const columns = columnsOf(write.rows);
  const subtract = new Set(write.subtract);
  const set = columns.filter((c) => !write.key.includes(c)).map((c) => (subtract.has(c) ? `${c} = ${table}.${c} - v.${c}` : `${c} = v.${c}`));
  const where = write.key.map((k) => `${table}.${k} = v.${k}`);
  if (write.onlyIf) where.push(`${table}.${write.onlyIf.column} = '${write.onlyIf.is}'`);
  return `update ${table} set ${set.join(', ')} from (${json.select(table, write.rows, columns)}) v where ${where.join(' and ')}${write.counted ? ` returning ${table}.${write.key[0]}` : ''}`;
}

/** The write as SQLite statements: rows in chunks of power-of-two sizes, each chunk's text made once. */
function sqliteWrite(write: BatchWrite): CompiledQuery[] {
  if ('insert' in write) return valuesInserts(write.insert, write.rows);
  const table = 'addTo' in write ? write.addTo : write.update;
  const columns = columnsOf(write.rows);
  const shape = 'addTo' in write ? `add ${write.sums.join(',')} carried ${write.carried?.join(',') ?? ''}` : `update ${write.subtract ?? ''} ${write.onlyIf?.column ?? ''}=${write.onlyIf?.is ?? ''} ${write.counted ?? false}`;
  return chunksOf(write.rows, columns).map(({ count, values }) => {
    const text = cachedText(`${shape}\n${table}\n${columns.join(',')}\n${count}`, () =>
      'addTo' in write ? sqliteAddTo(write, columns, count) : sqliteUpdate(write, columns, count),
    );
    return CompiledQuery.raw(text, values);
  });
}

type UpdateWrite = Extract<BatchWrite, { update: TableName }>;

type AddToWrite = Extract<BatchWrite, { addTo: TableName }>;

/** An addTo's SET clauses: each sum added to the stored one, a carried sum with its carry. */
function additions(write: AddToWrite, q: (name: string) => string = (name) => name): string[] {
  return [
    ...write.sums.map((c) => `${q(c)} = ${q(write.addTo)}.${q(c)} + excluded.${q(c)}`),
    ...(write.carried ?? []).flatMap((c) => carriedAddition(write.addTo, c, q)),
  ];
}

function sqliteAddTo(write: AddToWrite, columns: string[], count: number): string {
  const sums = additions(write, (name) => `"${name}"`).join(', ');
  return `${valuesInsertSql(write.addTo, columns, count)} on conflict (${write.key.map((k) => `"${k}"`).join(', ')}) do update set ${sums}`;
}

/** `update … from` a table of values (SQLite 3.33 and later); a counted update returns a row per row changed. */
function sqliteUpdate(write: UpdateWrite, columns: string[], count: number): string {
  const table = write.update;
  const subtract = new Set(write.subtract);
  const set = columns.filter((c) => !write.key.includes(c)).map((c) => (subtract.has(c) ? `"${c}" = "${table}"."${c}" - v."${c}"` : `"${c}" = v."${c}"`));
  const where = write.key.map((k) => `"${table}"."${k}" = v."${k}"`);
  if (write.onlyIf) where.push(`"${table}"."${write.onlyIf.column}" = '${write.onlyIf.is}'`);
  const row = `(${columns.map(() => '?').join(', ')})`;
  return (
    `with v (${columns.map((c) => `"${c}"`).join(', ')}) as (values ${Array(count).fill(row).join(', ')}) ` +
    `update "${table}" set ${set.join(', ')} from v where ${where.join(' and ')}${write.counted ? ` returning "${table}"."${write.key[0]}"` : ''}`
  );
}

/**
 * Multi-row inserts for SQLite as compiled queries, their texts made once per table, columns and
 * row count: Kysely would build them anew for every batch (by hand, ~7 % of what the gateway
 * allocated). The rows go in chunks of power-of-two sizes, largest first, so a table has a handful
 * of texts whatever its batches' sizes: each text is a prepared statement kept by the statement
 * cache, and one for every count up to 64 rows held ~7 MB for the requests table alone.
 * Values go to the driver as they are, as Kysely's would (a missing one as null).
 */
function valuesInserts(table: string, rows: object[]): CompiledQuery[] {
  const columns = columnsOf(rows);
  return chunksOf(rows, columns).map(({ count, values }) =>
    CompiledQuery.raw(
      cachedText(`insert\n${table}\n${columns.join(',')}\n${count}`, () => valuesInsertSql(table, columns, count)),
      values,
    ),
  );
}

/** SQLite's limit on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER, since 3.32). */
const SQLITE_MAX_PARAMETERS = 32_766;

/**
 * The rows in chunks of power-of-two sizes, largest first, each within SQLite's parameter limit,
 * each chunk's values in column order.
 */
function chunksOf(rows: object[], columns: string[]): { count: number; values: unknown[] }[] {
  const chunks: { count: number; values: unknown[] }[] = [];
  const largest = 2 ** Math.floor(Math.log2(SQLITE_MAX_PARAMETERS / columns.length));
  for (let start = 0; start < rows.length; ) {
    const count = Math.min(largest, 2 ** Math.floor(Math.log2(rows.length - start)));
    const values: unknown[] = [];
    for (let i = start; i < start + count; i++) for (const column of columns) values.push((rows[i] as Record<string, unknown>)[column] ?? null);
    chunks.push({ count, values });
    start += count;
  }
  return chunks;
}

function valuesInsertSql(table: string, columns: string[], count: number): string {
  const row = `(${columns.map(() => '?').join(', ')})`;
  return `insert into "${table}" (${columns.map((c) => `"${c}"`).join(', ')}) values ${Array(count).fill(row).join(', ')}`;
}

function cachedText(key: string, make: () => string): string {
  let text = sqliteTexts.get(key);
  if (text === undefined) {
    text = make();
    if (sqliteTexts.size >= MAX_SQLITE_TEXTS) sqliteTexts.clear();
    sqliteTexts.set(key, text);
  }
  return text;
}

/** Enough for every table's chunk sizes; a bound all the same, since the texts are kept. */
const MAX_SQLITE_TEXTS = 500;
const sqliteTexts = new Map<string, string>();

/** Every row of a list has the same columns (they are built by one function per table). */
function columnsOf<T extends object>(rows: T[]): string[] {
  return Object.keys(rows[0]!);
}

/**
 * Rows as a JSON array of objects with the first row's columns; bigints as strings, which
 * PostgreSQL reads into bigint columns exactly, and a missing value as null. Written by hand
 * rather than by JSON.stringify with a replacer for bigints: the replacer is called for every
 * value, and this was the server's largest function of its own on POST /requests (~4.5 % of its
 * CPU; a request row has 40 columns). By hand it costs ~15 % less in the profile, the flattening
 * of the string the driver does when it measures it included (~16 → ~13.5 µs per record).
 * Anything but a scalar (never written today) still goes through JSON.stringify.
 */
export function jsonRows(rows: object[]): string {
  if (rows.length === 0) return '[]';
  const columns = columnsOf(rows);
  // `{"a":`, `,"b":`, …, made per call: ~3 µs for a request row's 40 columns (by hand), against
  // ~13 µs per row for the rows themselves; a memo saved half of that and was state to keep.
  const names = columns.map((column, i) => `${i === 0 ? '{' : ','}${JSON.stringify(column)}:`);
  let json = '[';
  for (let r = 0; r < rows.length; r++) {
    const row = rows[r] as Record<string, unknown>;
    if (r > 0) json += ',';
    for (let c = 0; c < columns.length; c++) json += names[c]! + jsonValue(row[columns[c]!]);
    json += '}';
  }
  return `${json}]`;
}

/** A JSON.stringify replacer: bigints as their exact decimal text. */
const bigintsAsText = (_key: string, value: unknown): unknown => (typeof value === 'bigint' ? value.toString() : value);

function jsonValue(value: unknown): string {
  switch (typeof value) {
    case 'bigint':
      return `"${value}"`;
    case 'undefined':
      return 'null';
    case 'object':
      return value === null ? 'null' : JSON.stringify(value, bigintsAsText);
    default:
      // A string, number or boolean; a function or symbol (no JSON) as null.
      return JSON.stringify(value) ?? 'null';
  }
}
