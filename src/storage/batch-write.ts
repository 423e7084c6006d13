/**
 * Multi-row writes of a batch, on both engines. `insertRows` and `runWrites` are the one helper
 * for a batch's writes inside a Kysely transaction (settlements; POST /requests on SQLite): on
 * SQLite multi-row inserts whose texts are made once (valuesInserts), on PostgreSQL every write a
 * data-modifying CTE of one statement, rows as one JSON parameter per table. `JsonRows` builds the
 * same JSON inserts into statements of fixed text, prepared once per connection (the POST
 * /requests batch statement, the one-statement admission).
 */
import { CompiledQuery, sql, type Compilable, type Insertable, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { prepared } from './db.ts';
import {
  insertMetadataRows,
  METADATA_ROLLUP_KEY,
  ROLLUP_KEY,
  ROLLUP_SUMS,
  upsertMetadataRollups,
  upsertRollups,
  type RequestRow,
} from './requests.ts';
import type {
  Database,
  EventsTable,
  LedgerPostingsTable,
  LedgerTransactionsTable,
  MeterUsageCountersTable,
  RequestMetadataTable,
  UsageRollupsByMetadataTable,
  UsageRollupsTable,
  WalletsTable,
} from './schema.ts';

/** Every row a batch of charged requests writes, built in memory under the batch's locks. */
export type BatchRows = {
  requests: RequestRow[];
  metadata: RequestMetadataTable[];
  rollups: UsageRollupsTable[];
  metadataRollups: UsageRollupsByMetadataTable[];
  wallets: Pick<WalletsTable, 'id' | 'balance' | 'cycle_credit' | 'bundle_credit'>[];
  counters: MeterUsageCountersTable[];
  transactions: LedgerTransactionsTable[];
  postings: LedgerPostingsTable[];
  events: EventsTable[];
};

/**
 * Writes a batch on SQLite (which has no round trips: one statement per table), unless a
 * request's (merchant, request_id) is taken already: then only the requests rows may have been
 * written, and the ids of the taken records come back for the caller to roll the transaction back.
 * PostgreSQL writes a batch with batchStatement instead.
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
  await insertMetadataRows(trx, rows.metadata);
  await upsertRollups(trx, rows.rollups);
  await upsertMetadataRollups(trx, rows.metadataRollups);
  if (rows.wallets.length > 0) {
    const { text, values } = updateWalletsSql(rows.wallets);
    await trx.executeQuery(CompiledQuery.raw(text, values));
  }
  if (rows.counters.length > 0) {
    await trx
      .insertInto('meter_usage_counters')
      .values(rows.counters)
      .onConflict((oc) => oc.columns(['meter_id', 'connection_id', 'period_start']).doUpdateSet((eb) => ({ units: eb.ref('excluded.units') })))
      .execute();
  }
  const inserts: BatchWrite[] = [];
  for (const [table, list] of [['ledger_transactions', rows.transactions], ['ledger_postings', rows.postings], ['events', rows.events]] as const) {
    if (list.length > 0) inserts.push(insertRows('sqlite', table, list));
  }
  await runWrites(trx, 'sqlite', inserts);
  return new Set(inserted.map((r) => r.id));
}

/**
 * A batch as one PostgreSQL statement of data-modifying CTEs (a round trip per statement is most
 * of the cost, and each is made while the batch's rows are locked), prepared once per connection:
 * each table's rows travel as one JSON parameter that json_populate_recordset types by the table's
 * own row type, so the text does not change with the batch's size and PostgreSQL parses and plans
 * it once (that was as much as running it). A request whose (merchant, request_id) is taken fails
 * the statement on the unique index named by REQUEST_ID_TAKEN (see takenRequests).
 */
export function batchStatement(rows: BatchRows): { text: string; values: string[] } {
  const json = new JsonRows();
  const parts = [`inserted as (${json.insert('requests', inKeyOrder(rows.requests))} returning id)`];
  if (rows.metadata.length > 0) parts.push(`metadata as (${json.insert('request_metadata', rows.metadata)})`);
  const addToRollups = (table: string, key: readonly string[], list: object[]) =>
    `${json.insert(table, list)} on conflict (${key.join(', ')}) do update set ${ROLLUP_SUMS.map((c) => `${c} = ${table}.${c} + excluded.${c}`).join(', ')}`;
  if (rows.rollups.length > 0) parts.push(`rollups as (${addToRollups('usage_rollups', ROLLUP_KEY, rows.rollups)})`);
  if (rows.metadataRollups.length > 0) {
    parts.push(`metadata_rollups as (${addToRollups('usage_rollups_by_metadata', METADATA_ROLLUP_KEY, rows.metadataRollups)})`);
  }
  if (rows.wallets.length > 0) {
    parts.push(
      'wallets_written as (update wallets set balance = v.balance, cycle_credit = v.cycle_credit, bundle_credit = v.bundle_credit ' +
        `from (${json.select('wallets', rows.wallets)}) v where wallets.id = v.id)`,
    );
  }
  if (rows.counters.length > 0) {
    parts.push(
      `counters as (${json.insert('meter_usage_counters', rows.counters)} on conflict (meter_id, connection_id, period_start) do update set units = excluded.units)`,
    );
  }
  if (rows.transactions.length > 0) parts.push(`transactions as (${json.insert('ledger_transactions', rows.transactions)})`);
  if (rows.postings.length > 0) parts.push(`postings as (${json.insert('ledger_postings', rows.postings)})`);
  if (rows.events.length > 0) parts.push(`events_written as (${json.insert('events', rows.events)})`);
  return { text: prepared(`with ${parts.join(',\n')} select count(*) from inserted`), values: json.values };
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

/**
 * A write of a batch: a Kysely query, or a multi-row insert made without Kysely (insertRows: on
 * SQLite its chunks' statements, on PostgreSQL one statement with the rows as JSON). `counted`
 * ones return a row per row they changed.
 */
export type BatchWrite = { counted?: boolean } & (
  | { query: Compilable & { execute(): Promise<unknown[]> }; sqlite?: never; json?: never }
  | { sqlite: CompiledQuery[]; query?: never; json?: never }
  | { json: RawBuilder<unknown>; query?: never; sqlite?: never }
);

/** A multi-row insert for the engine: no row is built by Kysely (by hand, ~7 % of what the gateway allocated). */
export function insertRows<T extends keyof Database & string>(dialect: 'sqlite' | 'postgres', table: T, rows: Insertable<Database[T]>[]): BatchWrite {
  return dialect === 'sqlite' ? { sqlite: valuesInserts(table, rows) } : { json: jsonInsert(table, rows) };
}

/**
 * Runs a batch's writes. On PostgreSQL they go as one statement (each a data-modifying CTE), so
 * the batch pays one round trip for them; on SQLite one after the other (no round trips there).
 * Returns, for each counted write, how many rows it changed.
 */
export async function runWrites(trx: Transaction<Database>, dialect: 'sqlite' | 'postgres', writes: BatchWrite[]): Promise<number[]> {
  if (dialect === 'sqlite' || writes.length === 1) {
    const counts: number[] = [];
    for (const write of writes) {
      if (write.sqlite) {
        for (const insert of write.sqlite) await trx.executeQuery(insert);
        counts.push(0);
      } else if (write.json) {
        await write.json.execute(trx);
        counts.push(0);
      } else {
        const rows = await write.query.execute();
        counts.push(write.counted ? rows.length : 0);
      }
    }
    return counts;
  }
  if (writes.length === 0) return [];
  const name = (i: number) => sql.ref(`w${i}`);
  const ctes = sql.join(writes.map((write, i) => sql`${name(i)} as (${write.json ?? write.query!})`));
  const counted = writes.map((write, i) => (write.counted ? sql`(select count(*) from ${name(i)})` : sql`0`));
  // An array, not a function of one argument per write: PostgreSQL functions take at most 100
  // arguments, and a batch of 256 settlements updates as many pending records.
  const { rows } = await sql<{ counts: string }>`with ${ctes} select array_to_string(array[${sql.join(counted)}]::bigint[], ',') as counts`.execute(trx);
  return rows[0]!.counts.split(',').map(Number);
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
  const queries: CompiledQuery[] = [];
  for (let start = 0; start < rows.length; ) {
    const count = largestPowerOfTwoAtMost(rows.length - start);
    const values: unknown[] = [];
    for (let i = start; i < start + count; i++) for (const column of columns) values.push((rows[i] as Record<string, unknown>)[column] ?? null);
    queries.push(CompiledQuery.raw(valuesInsertText(table, columns, count), values));
    start += count;
  }
  return queries;
}

function largestPowerOfTwoAtMost(n: number): number {
  return 2 ** Math.floor(Math.log2(n));
}

function valuesInsertText(table: string, columns: string[], count: number): string {
  const key = `${table}\n${columns.join(',')}\n${count}`;
  let text = valuesInsertTexts.get(key);
  if (text === undefined) {
    const row = `(${columns.map(() => '?').join(', ')})`;
    text = `insert into "${table}" (${columns.map((c) => `"${c}"`).join(', ')}) values ${Array(count).fill(row).join(', ')}`;
    if (valuesInsertTexts.size >= MAX_VALUES_INSERT_TEXTS) valuesInsertTexts.clear();
    valuesInsertTexts.set(key, text);
  }
  return text;
}

/** Enough for every table's chunk sizes; a bound all the same, since the texts are kept. */
const MAX_VALUES_INSERT_TEXTS = 500;
const valuesInsertTexts = new Map<string, string>();

/**
 * A multi-row insert for PostgreSQL whose rows travel as one JSON parameter, typed by the table's
 * own row type (as JsonRows does). Kysely would make, and pg serialize, a parameter per value; on
 * PostgreSQL the gateway's own CPU, not the database's, bounds its throughput (by hand, at 32
 * connections: ~1.0 core for the gateway, ~0.4 for PostgreSQL), so PostgreSQL's extra JSON work is
 * the cheaper side (A/B: ~10 % more requests per second).
 */
function jsonInsert(table: string, rows: object[]): RawBuilder<unknown> {
  const columns = sql.join(columnsOf(rows).map((column) => sql.ref(column)));
  return sql`insert into ${sql.table(table)} (${columns}) select ${columns} from json_populate_recordset(null::${sql.table(table)}, ${jsonRows(rows)}::json)`;
}

/** Every row of a list has the same columns (they are built by one function per table). */
function columnsOf<T extends object>(rows: T[]): string[] {
  return Object.keys(rows[0]!);
}

/** Rows as a JSON array; bigints as strings, which PostgreSQL reads into bigint columns exactly. */
export function jsonRows(rows: object[]): string {
  return JSON.stringify(rows, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
}

/** Sets balances read and changed under this transaction's locks, in one statement (SQLite). */
function updateWalletsSql(wallets: BatchRows['wallets']): { text: string; values: unknown[] } {
  const values = wallets.flatMap((w) => [w.id, w.balance, w.cycle_credit, w.bundle_credit]);
  const rows = wallets.map(() => '(?, ?, ?, ?)').join(', ');
  return {
    text:
      `with v (id, balance, cycle_credit, bundle_credit) as (values ${rows}) ` +
      'update wallets set balance = v.balance, cycle_credit = v.cycle_credit, bundle_credit = v.bundle_credit from v where wallets.id = v.id',
    values,
  };
}
