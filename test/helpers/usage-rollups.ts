import type { Kysely } from 'kysely';
import { carriedTotal, carryOf } from '../../src/storage/exact-sum.ts';
import type { Database } from '../../src/storage/schema.ts';

const SUMS = ['requests', 'tokens', 'usage_cost', 'fee', 'service_charge', 'request_cost', 'wallet_cost', 'merchant_cost'] as const;

/** A metadata rollup row with its sums as decimal strings, so rows from either engine compare equal. */
export type MetadataRollup = {
  merchant_id: string;
  key: string;
  value: string;
  bucket_start: string;
  connection_id: string;
  meter_id: string;
} & Record<(typeof SUMS)[number], string>;

const keyOf = (r: Omit<MetadataRollup, (typeof SUMS)[number]>) =>
  JSON.stringify([r.merchant_id, r.key, r.value, r.bucket_start, r.connection_id, r.meter_id]);

function sorted(rows: MetadataRollup[]): MetadataRollup[] {
  return [...rows].sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : keyOf(a) > keyOf(b) ? 1 : 0));
}

/** What usage_rollups_by_metadata holds for these merchants. */
export async function storedMetadataRollups(db: Kysely<Database>, merchantIds: string[]): Promise<MetadataRollup[]> {
  if (merchantIds.length === 0) return [];
  const rows = await db.selectFrom('usage_rollups_by_metadata').selectAll().where('merchant_id', 'in', merchantIds).execute();
  return sorted(
    rows.map((r) => ({
      merchant_id: r.merchant_id,
      key: r.key,
      value: r.value,
      bucket_start: r.bucket_start,
      connection_id: r.connection_id,
      meter_id: r.meter_id,
      // A carried sum is its column and its carry together (exact-sum.ts); requests has no carry.
      ...(Object.fromEntries(SUMS.map((s) => [s, String(s === 'requests' ? r[s] : carriedTotal(r[s], r[carryOf(s)]))])) as Record<(typeof SUMS)[number], string>),
    })),
  );
}

/**
 * The same rows recounted here from the raw records: every non-pending record, once per row it has
 * in request_metadata, summed per (merchant, key, value, 15-minute UTC bucket of created_at,
 * connection or '', meter or '').
 */
export async function recountMetadataRollups(db: Kysely<Database>, merchantIds: string[]): Promise<MetadataRollup[]> {
  if (merchantIds.length === 0) return [];
  const records = await db
    .selectFrom('requests')
    .selectAll()
    .where('merchant_id', 'in', merchantIds)
    .where('status', '!=', 'pending')
    .execute();
  const byId = new Map(records.map((r) => [r.id, r]));
  const pairs = await db.selectFrom('request_metadata').selectAll().where('merchant_id', 'in', merchantIds).execute();
  const sums = new Map<string, MetadataRollup>();
  for (const pair of pairs) {
    const record = byId.get(pair.request_pk);
    if (!record) continue;
    const quarterHour = 15 * 60 * 1000;
    const key = {
      merchant_id: record.merchant_id,
      key: pair.key,
      value: pair.value,
      bucket_start: new Date(Math.floor(Date.parse(record.created_at) / quarterHour) * quarterHour).toISOString(),
      connection_id: record.connection_id ?? '',
      meter_id: record.meter_id ?? '',
    };
    const n = (v: unknown) => BigInt(String(v));
    const add: Record<(typeof SUMS)[number], bigint> = {
      requests: 1n,
      tokens: n(record.input_tokens) + n(record.output_tokens),
      usage_cost: n(record.input_cost) + n(record.output_cost),
      fee: n(record.fee_amount),
      service_charge: n(record.service_charge_amount),
      request_cost: n(record.total_request_cost),
      wallet_cost: n(record.total_wallet_cost),
      merchant_cost: n(record.total_merchant_cost),
    };
    const before = sums.get(keyOf(key));
    sums.set(keyOf(key), {
      ...key,
      ...(Object.fromEntries(SUMS.map((s) => [s, String((before ? BigInt(before[s]) : 0n) + add[s])])) as Record<(typeof SUMS)[number], string>),
    });
  }
  return sorted([...sums.values()]);
}
