import type { Transaction } from 'kysely';
import type { Database, RequestMetadataTable, RequestsTable, UsageRollupsByMetadataTable, UsageRollupsTable } from './schema.ts';

export type RequestRow = RequestsTable;

const BUCKET_MS = 15 * 60 * 1000;

/** Start of the 15-minute UTC bucket holding `iso`. */
function bucketStart(iso: string): string {
  const t = Date.parse(iso);
  return new Date(Math.floor(t / BUCKET_MS) * BUCKET_MS).toISOString();
}

/**
 * Writes a request record with its metadata rows and (unless it is pending) adds it to the usage
 * rollups, in the caller's transaction. A second record with the same (merchant, request_id) fails on the unique index.
 */
export async function insertRequestRecord(trx: Transaction<Database>, row: RequestRow): Promise<RequestRow> {
  await trx.insertInto('requests').values(row).execute();
  await insertMetadata(trx, [row]);
  if (row.status !== 'pending') await addToRollups(trx, [row]);
  return row;
}

async function insertMetadata(trx: Transaction<Database>, rows: RequestRow[]): Promise<void> {
  await insertMetadataRows(trx, metadataRows(rows));
}

export async function insertMetadataRows(trx: Transaction<Database>, rows: RequestMetadataTable[]): Promise<void> {
  if (rows.length > 0) await trx.insertInto('request_metadata').values(rows).execute();
}

/** One row per metadata pair of each record (filters and GET /usage read these). */
export function metadataRows(records: RequestRow[]): RequestMetadataTable[] {
  return records.flatMap((row) =>
    Object.entries(JSON.parse(row.metadata) as Record<string, string>).map(([key, value]) => ({
      request_pk: row.id,
      merchant_id: row.merchant_id,
      key,
      value,
      created_at: row.created_at,
    })),
  );
}

/**
 * Completes a record written as `pending` at admission with its settled usage and costs, and only
 * then adds it to the usage rollups (pending records are not usage yet). The record keeps its
 * admission time as created_at and rolls up under it, where a metadata-filtered usage report that
 * reads the records (two or more pairs) counts it too.
 */
export async function completePendingRecord(trx: Transaction<Database>, row: RequestRow): Promise<RequestRow> {
  const { id, merchant_id: _m, request_id: _r, created_at: _c, metadata: _md, ...settled } = row;
  const stored = await trx
    .updateTable('requests')
    .set(settled)
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .returningAll()
    .executeTakeFirst();
  if (!stored) throw new Error(`request record ${id} is not pending`);
  await addToRollups(trx, [stored]);
  return stored;
}

/** Marks a pending record `error` (upstream failure, expired hold) and counts it as a request with no cost. */
export async function failPendingRecord(trx: Transaction<Database>, id: string, at: string): Promise<boolean> {
  const stored = await trx
    .updateTable('requests')
    .set({ status: 'error', completed_at: at })
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .returningAll()
    .executeTakeFirst();
  if (stored) await addToRollups(trx, [stored]);
  return stored !== undefined;
}

/** Adds records to both usage rollups: per (connection, meter), and per metadata pair as well. */
async function addToRollups(trx: Transaction<Database>, rows: RequestRow[]): Promise<void> {
  await upsertRollups(trx, rollupAdditions(rows));
  await upsertMetadataRollups(trx, metadataRollupAdditions(rows));
}

/**
 * What records add to their 15-minute usage rollups: one row per (merchant, bucket, customer,
 * meter), summed in memory, in key order (concurrent writers lock rollup rows in one order).
 */
export function rollupAdditions(rows: RequestRow[]): UsageRollupsTable[] {
  const byKey = new Map<string, UsageRollupsTable>();
  const bucketOf = bucketCache();
  for (const row of rows) {
    const key = {
      merchant_id: row.merchant_id,
      bucket_start: bucketOf(row.created_at),
      connection_id: row.connection_id ?? '',
      meter_id: row.meter_id ?? '',
    };
    const id = `${key.merchant_id}\n${key.bucket_start}\n${key.connection_id}\n${key.meter_id}`;
    const sum = byKey.get(id) ?? withZeroSums(key);
    addRecordTo(sum, row);
    byKey.set(id, sum);
  }
  return inIdOrder(byKey);
}

/**
 * What records add to their metadata-pair rollups: one row per (merchant, key, value, bucket,
 * customer, meter) for every pair a record carries, summed in memory, in key order.
 */
export function metadataRollupAdditions(rows: RequestRow[]): UsageRollupsByMetadataTable[] {
  const byKey = new Map<string, UsageRollupsByMetadataTable>();
  const bucketOf = bucketCache();
  for (const row of rows) {
    const pairs = Object.entries(JSON.parse(row.metadata) as Record<string, string>);
    if (pairs.length === 0) continue;
    const bucket = bucketOf(row.created_at);
    for (const [key, value] of pairs) {
      const keyColumns = {
        merchant_id: row.merchant_id,
        key,
        value,
        bucket_start: bucket,
        connection_id: row.connection_id ?? '',
        meter_id: row.meter_id ?? '',
      };
      // JSON, not a separator: keys and values are caller text and must not run into each other.
      const id = JSON.stringify(Object.values(keyColumns));
      const sum = byKey.get(id) ?? withZeroSums(keyColumns);
      addRecordTo(sum, row);
      byKey.set(id, sum);
    }
  }
  return inIdOrder(byKey);
}

/** Bucket starts by creation time: a batch's records mostly share theirs, so each is worked out once. */
function bucketCache(): (createdAt: string) => string {
  const buckets = new Map<string, string>();
  return (createdAt) => {
    let bucket = buckets.get(createdAt);
    if (bucket === undefined) {
      bucket = bucketStart(createdAt);
      buckets.set(createdAt, bucket);
    }
    return bucket;
  };
}

function addRecordTo(sum: Record<RollupSum, bigint>, row: RequestRow): void {
  sum.requests += 1n;
  sum.tokens += row.input_tokens + row.output_tokens;
  sum.usage_cost += row.input_cost + row.output_cost;
  sum.fee += row.fee_amount;
  sum.service_charge += row.service_charge_amount;
  sum.request_cost += row.total_request_cost;
  sum.wallet_cost += row.total_wallet_cost;
  sum.merchant_cost += row.total_merchant_cost;
}

function inIdOrder<T>(byId: Map<string, T>): T[] {
  return [...byId.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([, v]) => v);
}

/** The rollup columns that accumulate; everything else in a rollup row is its key. */
export const ROLLUP_SUMS = [
  'requests',
  'tokens',
  'usage_cost',
  'fee',
  'service_charge',
  'request_cost',
  'wallet_cost',
  'merchant_cost',
] as const;
type RollupSum = (typeof ROLLUP_SUMS)[number];

/** The primary keys the rollup upserts conflict on (here, and the batches' runWrites). */
export const ROLLUP_KEY = ['merchant_id', 'bucket_start', 'connection_id', 'meter_id'] as const;
export const METADATA_ROLLUP_KEY = ['merchant_id', 'key', 'value', 'bucket_start', 'connection_id', 'meter_id'] as const;

/** Adds `additions` to usage_rollups, inserting the rows not there yet (a single record's write; batches use runWrites). */
async function upsertRollups(trx: Transaction<Database>, additions: UsageRollupsTable[]): Promise<void> {
  if (additions.length === 0) return;
  await trx
    .insertInto('usage_rollups')
    .values(additions)
    .onConflict((oc) =>
      oc
        .columns([...ROLLUP_KEY])
        .doUpdateSet((eb) => Object.fromEntries(ROLLUP_SUMS.map((c) => [c, eb(`usage_rollups.${c}`, '+', eb.ref(`excluded.${c}`))]))),
    )
    .execute();
}

/** The same for usage_rollups_by_metadata. */
async function upsertMetadataRollups(trx: Transaction<Database>, additions: UsageRollupsByMetadataTable[]): Promise<void> {
  if (additions.length === 0) return;
  await trx
    .insertInto('usage_rollups_by_metadata')
    .values(additions)
    .onConflict((oc) =>
      oc
        .columns([...METADATA_ROLLUP_KEY])
        .doUpdateSet((eb) =>
          Object.fromEntries(ROLLUP_SUMS.map((c) => [c, eb(`usage_rollups_by_metadata.${c}`, '+', eb.ref(`excluded.${c}`))])),
        ),
    )
    .execute();
}

/** A new rollup row: its key columns with every sum at zero (assigned, not spread: V8 spreads slowly). */
function withZeroSums<K extends object>(key: K): K & Record<RollupSum, bigint> {
  const sums: Record<RollupSum, bigint> = {
    requests: 0n,
    tokens: 0n,
    usage_cost: 0n,
    fee: 0n,
    service_charge: 0n,
    request_cost: 0n,
    wallet_cost: 0n,
    merchant_cost: 0n,
  };
  return Object.assign(key, sums);
}

export async function findRequestByRequestId(
  db: Transaction<Database> | import('kysely').Kysely<Database>,
  merchantId: string,
  requestId: string,
): Promise<RequestRow | undefined> {
  return db
    .selectFrom('requests')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('request_id', '=', requestId)
    .executeTakeFirst();
}
