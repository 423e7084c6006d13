import { CompiledQuery, type Transaction } from 'kysely';
import type { Storage } from './db.ts';
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
 * Writes a batch, unless a request's (merchant, request_id) is taken already: then only the
 * requests rows may have been written, and the ids of the taken records come back for the caller
 * to roll the transaction back. PostgreSQL gets one statement (a round trip per statement is most
 * of the cost, and every one of them is made while the batch's rows are locked); SQLite, which has
 * no round trips, one statement per table.
 */
export async function writeBatch(trx: Transaction<Database>, dialect: Storage['dialect'], rows: BatchRows): Promise<{ taken: string[] }> {
  if (rows.requests.length === 0) return { taken: [] };
  const inserted = dialect === 'postgres' ? await writeInOneStatement(trx, rows) : await writeTableByTable(trx, dialect, rows);
  if (inserted.size === rows.requests.length) return { taken: [] };
  return { taken: rows.requests.filter((r) => !inserted.has(r.id)).map((r) => r.id) };
}

/** Requests rows in (merchant, request_id) order: two writers of the same ids wait in one order and cannot deadlock. */
function inKeyOrder(requests: RequestRow[]): RequestRow[] {
  const key = (r: RequestRow) => `${r.merchant_id}\n${r.request_id}`;
  return [...requests].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

async function writeTableByTable(trx: Transaction<Database>, dialect: Storage['dialect'], rows: BatchRows): Promise<Set<string>> {
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
    const p = new Placeholders(dialect);
    await trx.executeQuery(CompiledQuery.raw(updateWalletsSql(p, rows.wallets), p.values));
  }
  if (rows.counters.length > 0) {
    await trx
      .insertInto('meter_usage_counters')
      .values(rows.counters)
      .onConflict((oc) => oc.columns(['meter_id', 'connection_id', 'period_start']).doUpdateSet((eb) => ({ units: eb.ref('excluded.units') })))
      .execute();
  }
  if (rows.transactions.length > 0) await trx.insertInto('ledger_transactions').values(rows.transactions).execute();
  if (rows.postings.length > 0) await trx.insertInto('ledger_postings').values(rows.postings).execute();
  if (rows.events.length > 0) await trx.insertInto('events').values(rows.events).execute();
  return new Set(inserted.map((r) => r.id));
}

/**
 * One statement of data-modifying CTEs. Metadata rows are inserted only for the requests rows that
 * were (their foreign key needs them); if any request was taken the caller rolls it all back.
 */
async function writeInOneStatement(trx: Transaction<Database>, rows: BatchRows): Promise<Set<string>> {
  const p = new Placeholders('postgres');
  const parts: string[] = [
    `inserted as (${insertSql(p, 'requests', inKeyOrder(rows.requests))} on conflict (merchant_id, request_id) do nothing returning id)`,
  ];
  if (rows.metadata.length > 0) {
    const columns = Object.keys(rows.metadata[0]!) as (keyof RequestMetadataTable)[];
    parts.push(
      `metadata as (insert into request_metadata (${columns.join(', ')}) select ${columns.map((c) => `v.${c}`).join(', ')} ` +
        `from (values ${valuesSql(p, rows.metadata, columns)}) as v(${columns.join(', ')}) where v.request_pk in (select id from inserted))`,
    );
  }
  if (rows.rollups.length > 0) parts.push(`rollups as (${addToRollupsSql(p, 'usage_rollups', ROLLUP_KEY, rows.rollups)})`);
  if (rows.metadataRollups.length > 0) {
    parts.push(`metadata_rollups as (${addToRollupsSql(p, 'usage_rollups_by_metadata', METADATA_ROLLUP_KEY, rows.metadataRollups)})`);
  }
  if (rows.wallets.length > 0) parts.push(`wallets_written as (${updateWalletsSql(p, rows.wallets, false)})`);
  if (rows.counters.length > 0) {
    parts.push(
      `counters as (${insertSql(p, 'meter_usage_counters', rows.counters)} on conflict (meter_id, connection_id, period_start) do update set units = excluded.units)`,
    );
  }
  if (rows.transactions.length > 0) parts.push(`transactions as (${insertSql(p, 'ledger_transactions', rows.transactions)})`);
  if (rows.postings.length > 0) parts.push(`postings as (${insertSql(p, 'ledger_postings', rows.postings)})`);
  if (rows.events.length > 0) parts.push(`events_written as (${insertSql(p, 'events', rows.events)})`);
  const result = await trx.executeQuery<{ id: string }>(CompiledQuery.raw(`with ${parts.join(',\n')} select id from inserted`, p.values));
  return new Set(result.rows.map((r) => r.id));
}

/**
 * Sets balances read and changed under this transaction's locks. The casts type the VALUES
 * columns on PostgreSQL, where bare parameters in VALUES arrive as text.
 */
function updateWalletsSql(p: Placeholders, wallets: BatchRows['wallets'], withCte = true): string {
  const values = wallets
    .map((w) => `(${p.add(w.id)}, cast(${p.add(w.balance)} as bigint), cast(${p.add(w.cycle_credit)} as bigint), cast(${p.add(w.bundle_credit)} as bigint))`)
    .join(', ');
  const set = 'balance = v.balance, cycle_credit = v.cycle_credit, bundle_credit = v.bundle_credit';
  return withCte
    ? `with v (id, balance, cycle_credit, bundle_credit) as (values ${values}) update wallets set ${set} from v where wallets.id = v.id`
    : `update wallets set ${set} from (values ${values}) as v (id, balance, cycle_credit, bundle_credit) where wallets.id = v.id`;
}

/** Inserts rollup rows, adding their sums to the rows already under the same key. */
function addToRollupsSql<T extends object>(p: Placeholders, table: string, key: readonly string[], rows: T[]): string {
  const sums = ROLLUP_SUMS.map((c) => `${c} = ${table}.${c} + excluded.${c}`).join(', ');
  return `${insertSql(p, table, rows)} on conflict (${key.join(', ')}) do update set ${sums}`;
}

/** `insert into <table> (<columns of the first row>) values …`; every row has the same columns. */
function insertSql<T extends object>(p: Placeholders, table: string, rows: T[]): string {
  const columns = Object.keys(rows[0]!) as (keyof T & string)[];
  return `insert into ${table} (${columns.join(', ')}) values ${valuesSql(p, rows, columns)}`;
}

function valuesSql<T extends object>(p: Placeholders, rows: T[], columns: (keyof T & string)[]): string {
  return rows.map((row) => `(${columns.map((c) => p.add(row[c])).join(', ')})`).join(', ');
}

/**
 * Parameters of a statement built here: values never enter the SQL text, only placeholders do.
 * (Table and column names do, but they come from this code, never from input.)
 */
class Placeholders {
  readonly values: unknown[] = [];
  constructor(readonly dialect: Storage['dialect']) {}
  add(value: unknown): string {
    this.values.push(value);
    return this.dialect === 'postgres' ? `$${this.values.length}` : '?';
  }
}
