/**
 * The bytes each recorded request leaves on disk, per table and per index (`--only footprint`).
 * Requests go through a real server's POST /v1/requests (so every row is the one the server
 * writes: record, metadata, ledger, balance events, rollups), with 2.5 metadata pairs on average,
 * one of them a user id of high cardinality. Sizes are read before and after, from
 * pg_table_size / pg_relation_size on PostgreSQL and from the dbstat table on SQLite; the
 * difference divided by the requests recorded is the footprint.
 */
import autocannon from 'autocannon';
import BetterSqlite from 'better-sqlite3';
import { sql } from 'kysely';
import type { Storage } from '../src/storage/db.ts';

type Row = { scenario: string; engine: string; result: string; target: string };

/** The tables a recorded request adds rows to, records and ledger first. */
const RECORD_TABLES = ['requests', 'request_metadata', 'ledger_transactions', 'ledger_postings', 'holds', 'events', 'meter_usage_counters'] as const;
/** The usage rollups, kept beside the records (decision 0042). */
const ROLLUP_TABLES = ['usage_rollups', 'usage_rollups_by_metadata', 'usage_rollups_grouped', 'usage_rollups_by_day'] as const;

/** Bytes of each table (heap, or the table's own B-tree on SQLite) and of each of its indexes, by name. */
type Sizes = Map<string, { table: string; bytes: number; index: boolean }>;

export type FootprintOptions = {
  engine: string;
  storage: Storage;
  /** The database file, for SQLite (read with a connection of its own, so dbstat sees every commit). */
  sqlitePath?: string;
  serverUrl: string;
  requests: number;
  customers: { customerId: string }[];
  meterSlug: string;
  headers: Record<string, string>;
};

export async function benchFootprint(opts: FootprintOptions): Promise<Row[]> {
  const before = await sizesOf(opts);
  const recorded = await recordRequests(opts);
  const after = await sizesOf(opts);
  const perRequest = (name: string) => ((after.get(name)?.bytes ?? 0) - (before.get(name)?.bytes ?? 0)) / recorded;
  const rows: Row[] = [];
  const tableLine = (table: string) => {
    const parts = [...after].filter(([, s]) => s.table === table);
    const total = parts.reduce((sum, [name]) => sum + perRequest(name), 0);
    const detail = parts.map(([name, s]) => `${s.index ? name : 'rows'} ${perRequest(name).toFixed(0)}`).join(', ');
    return { total, text: `${table} ${total.toFixed(0)} B (${detail})` };
  };
  const group = (label: string, tables: readonly string[], target: string) => {
    const lines = tables.map(tableLine);
    const total = lines.reduce((sum, l) => sum + l.total, 0);
    console.log(`${opts.engine} ${label}: ${total.toFixed(0)} B per request`);
    for (const l of lines) console.log(`  ${l.text}`);
    rows.push({
      scenario: `Bytes per recorded request, ${label} (${recorded.toLocaleString('en')} requests through POST /v1/requests, 2.5 metadata pairs)`,
      engine: opts.engine,
      result: `${total.toFixed(0)} B: ${lines.map((l) => l.text).join('; ')}`,
      target,
    });
    return total;
  };
  const records = group('records, metadata, ledger and balance events', RECORD_TABLES, opts.engine === 'postgres' ? '≤ 1,536 B' : '≤ 1,229 B');
  const rollups = group('usage rollups', ROLLUP_TABLES, '—');
  rows.push({ scenario: 'Bytes per recorded request, all of the above', engine: opts.engine, result: `${(records + rollups).toFixed(0)} B`, target: '—' });
  return rows;
}

/** Posts the requests (16 connections), each with its own request_id; answers how many were recorded. */
async function recordRequests(opts: FootprintOptions): Promise<number> {
  let n = 0;
  const result = await autocannon({
    url: `${opts.serverUrl}/v1/requests`,
    method: 'POST',
    headers: opts.headers,
    connections: 16,
    amount: opts.requests,
    requests: [
      {
        setupRequest: (req) => {
          const i = n++;
          return { ...req, body: JSON.stringify(requestBody(opts, i)) };
        },
      },
    ],
  });
  if (result.non2xx > 0 || result['2xx'] !== opts.requests) throw new Error(`footprint: ${result['2xx']} of ${opts.requests} requests recorded (${result.non2xx} refused)`);
  return result['2xx'];
}

/** Metadata as a merchant at scale sends it: a feature (few values), a user id (thousands), and on every other request a plan. */
function requestBody(opts: FootprintOptions, i: number): object {
  const metadata: Record<string, string> = { feature: ['chat', 'search', 'summarize', 'translate'][i % 4]!, user_id: `user_${(i * 7919) % 10_000}` };
  if (i % 2 === 0) metadata.plan = i % 6 === 0 ? 'pro' : 'free';
  return {
    request_id: `footprint-${i}`,
    customer_id: opts.customers[i % opts.customers.length]!.customerId,
    meter_slug: opts.meterSlug,
    provider: 'openai',
    model: 'gpt-4o-mini',
    input_tokens: 800 + (i % 400),
    output_tokens: 200 + (i % 100),
    metadata,
  };
}

async function sizesOf(opts: FootprintOptions): Promise<Sizes> {
  const tables = [...RECORD_TABLES, ...ROLLUP_TABLES];
  return opts.engine === 'postgres' ? postgresSizes(opts.storage, tables) : sqliteSizes(opts.sqlitePath!, tables);
}

/** Heap with its TOAST, free-space and visibility maps (pg_table_size), and each index (pg_relation_size). */
async function postgresSizes(storage: Storage, tables: readonly string[]): Promise<Sizes> {
  const sizes: Sizes = new Map();
  for (const table of tables) {
    const { rows } = await sql<{ name: string; bytes: string; index: boolean }>`
      select ${table} as name, pg_table_size(to_regclass(${table}))::text as bytes, false as index
      union all
      select c.relname, pg_relation_size(i.indexrelid)::text, true
      from pg_index i join pg_class c on c.oid = i.indexrelid
      where i.indrelid = to_regclass(${table})`.execute(storage.db);
    for (const r of rows) sizes.set(r.name, { table, bytes: Number(r.bytes), index: r.index });
  }
  return sizes;
}

/** Pages of each B-tree (dbstat), a table's own and each of its indexes' (automatic ones included). */
function sqliteSizes(path: string, tables: readonly string[]): Sizes {
  const db = new BetterSqlite(path, { readonly: true });
  try {
    const sizes: Sizes = new Map();
    const trees = db
      .prepare(`select m.name, m.tbl_name as tbl, m.type, coalesce(sum(s.pgsize), 0) as bytes from sqlite_schema m left join dbstat s on s.name = m.name where m.type in ('table', 'index') group by m.name`)
      .all() as { name: string; tbl: string; type: string; bytes: number }[];
    for (const t of trees) if (tables.includes(t.tbl)) sizes.set(t.name, { table: t.tbl, bytes: t.bytes, index: t.type === 'index' });
    return sizes;
  } finally {
    db.close();
  }
}
