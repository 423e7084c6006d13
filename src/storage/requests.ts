import type { Transaction } from 'kysely';
import type { Database, RequestsTable } from './schema.ts';

export type RequestRow = RequestsTable;

const BUCKET_MS = 15 * 60 * 1000;

/** Start of the 15-minute UTC bucket holding `iso`. */
export function bucketStart(iso: string): string {
  const t = Date.parse(iso);
  return new Date(Math.floor(t / BUCKET_MS) * BUCKET_MS).toISOString();
}

/**
 * Writes a request record with its metadata rows and (unless it is pending) adds it to the usage
 * rollup, in the caller's transaction. A second record with the same (merchant, request_id) fails on the unique index.
 */
export async function insertRequestRecord(trx: Transaction<Database>, row: RequestRow): Promise<RequestRow> {
  await trx.insertInto('requests').values(row).execute();
  const metadata = Object.entries(JSON.parse(row.metadata) as Record<string, string>);
  if (metadata.length > 0) {
    await trx
      .insertInto('request_metadata')
      .values(metadata.map(([key, value]) => ({ request_pk: row.id, merchant_id: row.merchant_id, key, value, created_at: row.created_at })))
      .execute();
  }
  if (row.status !== 'pending') await addToRollup(trx, row);
  return row;
}

/**
 * Completes a record written as `pending` at admission with its settled usage and costs, and only
 * then adds it to the usage rollup (pending records are not usage yet).
 */
export async function completePendingRecord(trx: Transaction<Database>, row: RequestRow): Promise<RequestRow> {
  const { id, merchant_id: _m, request_id: _r, created_at, metadata: _md, ...settled } = row;
  const stored = await trx
    .updateTable('requests')
    .set(settled)
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .returningAll()
    .executeTakeFirst();
  if (!stored) throw new Error(`request record ${id} is not pending`);
  await addToRollup(trx, { ...stored, created_at });
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
  if (stored) await addToRollup(trx, stored);
  return stored !== undefined;
}

async function addToRollup(trx: Transaction<Database>, row: RequestRow): Promise<void> {
  const add = {
    requests: 1n,
    tokens: row.input_tokens + row.output_tokens,
    usage_cost: row.input_cost + row.output_cost,
    fee: row.fee_amount,
    service_charge: row.service_charge_amount,
    request_cost: row.total_request_cost,
    wallet_cost: row.total_wallet_cost,
    merchant_cost: row.total_merchant_cost,
  };
  await trx
    .insertInto('usage_rollups')
    .values({
      merchant_id: row.merchant_id,
      bucket_start: bucketStart(row.created_at),
      connection_id: row.connection_id ?? '',
      meter_id: row.meter_id ?? '',
      ...add,
    })
    .onConflict((oc) =>
      oc.columns(['merchant_id', 'bucket_start', 'connection_id', 'meter_id']).doUpdateSet((eb) => ({
        requests: eb('usage_rollups.requests', '+', eb.ref('excluded.requests')),
        tokens: eb('usage_rollups.tokens', '+', eb.ref('excluded.tokens')),
        usage_cost: eb('usage_rollups.usage_cost', '+', eb.ref('excluded.usage_cost')),
        fee: eb('usage_rollups.fee', '+', eb.ref('excluded.fee')),
        service_charge: eb('usage_rollups.service_charge', '+', eb.ref('excluded.service_charge')),
        request_cost: eb('usage_rollups.request_cost', '+', eb.ref('excluded.request_cost')),
        wallet_cost: eb('usage_rollups.wallet_cost', '+', eb.ref('excluded.wallet_cost')),
        merchant_cost: eb('usage_rollups.merchant_cost', '+', eb.ref('excluded.merchant_cost')),
      })),
    )
    .execute();
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
