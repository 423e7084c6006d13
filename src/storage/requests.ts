import type { Transaction } from 'kysely';
import { runWrites } from './batch-write.ts';
import type { Storage } from './db.ts';
import { rollupWrites } from './rollups.ts';
import type { Database, RequestMetadataTable, RequestsTable } from './schema.ts';

type Dialect = Storage['dialect'];

export type RequestRow = RequestsTable;

/**
 * Writes a request record with its metadata rows and (unless it is pending) adds it to the usage
 * rollups, in the caller's transaction. A second record with the same (merchant, request_id) fails on the unique index.
 */
export async function insertRequestRecord(trx: Transaction<Database>, dialect: Dialect, row: RequestRow): Promise<RequestRow> {
  await trx.insertInto('requests').values(row).execute();
  await insertMetadata(trx, [row]);
  if (row.status !== 'pending') await addToRollups(trx, dialect, [row]);
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
export async function completePendingRecord(trx: Transaction<Database>, dialect: Dialect, row: RequestRow): Promise<RequestRow> {
  const { id, merchant_id: _m, request_id: _r, created_at: _c, metadata: _md, ...settled } = row;
  const stored = await trx
    .updateTable('requests')
    .set(settled)
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .returningAll()
    .executeTakeFirst();
  if (!stored) throw new Error(`request record ${id} is not pending`);
  await addToRollups(trx, dialect, [stored]);
  return stored;
}

/** Marks a pending record `error` (upstream failure, expired hold) and counts it as a request with no cost. */
export async function failPendingRecord(trx: Transaction<Database>, dialect: Dialect, id: string, at: string): Promise<boolean> {
  const stored = await trx
    .updateTable('requests')
    .set({ status: 'error', completed_at: at })
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .returningAll()
    .executeTakeFirst();
  if (stored) await addToRollups(trx, dialect, [stored]);
  return stored !== undefined;
}

/** Adds records to every usage rollup (rollupWrites). */
async function addToRollups(trx: Transaction<Database>, dialect: Dialect, rows: RequestRow[]): Promise<void> {
  await runWrites(trx, dialect, rollupWrites(rows));
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
