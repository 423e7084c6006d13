/**
 * What request records add to the usage rollups (15-minute buckets, per customer and meter, per
 * metadata pair as well, and at the grain reports read: decision 0042), and the writes that add it: one description for a single record's
 * write (storage/requests.ts), a charge batch (batch-write.ts) and a settlement batch.
 */
import type { BatchWrite } from './batch-write.ts';
import type { RequestRow } from './requests.ts';
import { carriedParts, carryOf } from './exact-sum.ts';
import type { UsageRollupSums, UsageRollupsByDayTable, UsageRollupsByMetadataTable, UsageRollupsGroupedTable, UsageRollupsTable } from './schema.ts';

const BUCKET_MS = 15 * 60 * 1000;

/** Start of the 15-minute UTC bucket holding `iso`. */
function bucketStart(iso: string): string {
  const t = Date.parse(iso);
  return new Date(Math.floor(t / BUCKET_MS) * BUCKET_MS).toISOString();
}

/** The writes that add these records to every rollup, summed per row (runWrites' `addTo`). */
export function rollupWrites(records: RequestRow[]): BatchWrite[] {
  return [
    { addTo: 'usage_rollups', key: ROLLUP_KEY, sums: COUNTED_SUMS, carried: CARRIED_SUMS, rows: rollupAdditions(records) },
    { addTo: 'usage_rollups_by_metadata', key: METADATA_ROLLUP_KEY, sums: COUNTED_SUMS, carried: CARRIED_SUMS, rows: metadataRollupAdditions(records) },
    { addTo: 'usage_rollups_grouped', key: GROUPED_ROLLUP_KEY, sums: COUNTED_SUMS, carried: CARRIED_SUMS, rows: groupedRollupAdditions(records) },
    { addTo: 'usage_rollups_by_day', key: DAY_ROLLUP_KEY, sums: COUNTED_SUMS, carried: CARRIED_SUMS, rows: dayRollupAdditions(records) },
  ];
}

/**
 * What records add to the daily rollups the overview's leaders read: one row per (merchant,
 * UTC day, customer) and per (merchant, UTC day, model; '' when none), in key order.
 */
function dayRollupAdditions(rows: RequestRow[]): UsageRollupsByDayTable[] {
  const sums = sumsById<Omit<UsageRollupsByDayTable, keyof UsageRollupSums>>();
  const add = (row: RequestRow, day: string, dimension: UsageRollupsByDayTable['dimension'], key: string) =>
    sums.add(JSON.stringify([row.merchant_id, dimension, day, key]), row, () => ({ merchant_id: row.merchant_id, dimension, day_start: day, key }));
  for (const row of rows) {
    // created_at is ISO UTC text: its first ten characters are the UTC date.
    const day = `${row.created_at.slice(0, 10)}T00:00:00.000Z`;
    if (row.connection_id) add(row, day, 'customer', row.connection_id);
    add(row, day, 'model', row.model ?? '');
  }
  return sums.inIdOrder();
}

/**
 * What records add to the rollups at a report's grain: one row per (merchant, bucket) for the
 * total, per customer, per meter and per metadata pair (a record without a customer or meter is
 * in no customer's or meter's group), summed in memory, in key order.
 */
function groupedRollupAdditions(rows: RequestRow[]): UsageRollupsGroupedTable[] {
  const sums = sumsById<Omit<UsageRollupsGroupedTable, keyof UsageRollupSums>>();
  const bucketOf = bucketCache();
  const add = (row: RequestRow, bucket: string, dimension: UsageRollupsGroupedTable['dimension'], key: string, value: string) =>
    sums.add(JSON.stringify([row.merchant_id, dimension, key, value, bucket]), row, () => ({ merchant_id: row.merchant_id, dimension, key, value, bucket_start: bucket }));
  for (const row of rows) {
    const bucket = bucketOf(row.created_at);
    add(row, bucket, 'total', '', '');
    if (row.connection_id) add(row, bucket, 'customer', row.connection_id, '');
    if (row.meter_id) add(row, bucket, 'meter', row.meter_id, '');
    for (const [key, value] of Object.entries(JSON.parse(row.metadata) as Record<string, string>)) add(row, bucket, 'metadata', key, value);
  }
  return sums.inIdOrder();
}

/**
 * What records add to their 15-minute usage rollups: one row per (merchant, bucket, customer,
 * meter), summed in memory, in key order (concurrent writers lock rollup rows in one order).
 */
function rollupAdditions(rows: RequestRow[]): UsageRollupsTable[] {
  const sums = sumsById<Omit<UsageRollupsTable, keyof UsageRollupSums>>();
  const bucketOf = bucketCache();
  for (const row of rows) {
    const key = {
      merchant_id: row.merchant_id,
      bucket_start: bucketOf(row.created_at),
      connection_id: row.connection_id ?? '',
      meter_id: row.meter_id ?? '',
    };
    sums.add(`${key.merchant_id}\n${key.bucket_start}\n${key.connection_id}\n${key.meter_id}`, row, () => key);
  }
  return sums.inIdOrder();
}

/**
 * What records add to their metadata-pair rollups: one row per (merchant, key, value, bucket,
 * customer, meter) for every pair a record carries, summed in memory, in key order.
 */
function metadataRollupAdditions(rows: RequestRow[]): UsageRollupsByMetadataTable[] {
  const sums = sumsById<Omit<UsageRollupsByMetadataTable, keyof UsageRollupSums>>();
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
      sums.add(JSON.stringify(Object.values(keyColumns)), row, () => keyColumns);
    }
  }
  return sums.inIdOrder();
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

/**
 * Rollup rows summed in memory, one per id (its key columns as text), handed back in id order
 * (concurrent writers lock rollup rows in one order) with each carried sum as its stored parts. A
 * row is made from its key columns, with every sum at zero, the first time its id comes up.
 */
function sumsById<K extends object>() {
  const byId = new Map<string, K & Record<RollupSum, bigint>>();
  return {
    add(id: string, row: RequestRow, keyColumns: () => K): void {
      let sum = byId.get(id);
      if (sum === undefined) {
        sum = withZeroSums(keyColumns());
        byId.set(id, sum);
      }
      addRecordTo(sum, row);
    },
    inIdOrder: () => inIdOrder(byId).map(asStored),
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

/**
 * A row summed in memory as the rollup stores it: each carried sum split into its remainder and
 * carry (exact-sum.ts), which the upsert adds to the stored parts. Done in place: the row is new.
 */
function asStored<K extends object>(row: K & Record<RollupSum, bigint>): K & UsageRollupSums {
  const stored = row as Record<string, unknown>;
  for (const column of CARRIED_SUMS) {
    const { rest, carry } = carriedParts(row[column]);
    stored[column] = rest;
    stored[carryOf(column)] = carry;
  }
  return row as unknown as K & UsageRollupSums;
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

/**
 * The sums kept exact at any size with a carry column (decision 0042): tokens and money, which
 * a quarter-hour of large records can take past 2^63. The count of requests, one per record,
 * cannot get there.
 */
export const CARRIED_SUMS = ['tokens', 'usage_cost', 'fee', 'service_charge', 'request_cost', 'wallet_cost', 'merchant_cost'] as const satisfies readonly RollupSum[];
const COUNTED_SUMS = ['requests'] as const satisfies readonly RollupSum[];

/** The primary keys the rollup upserts conflict on. */
const ROLLUP_KEY = ['merchant_id', 'bucket_start', 'connection_id', 'meter_id'] as const;
const METADATA_ROLLUP_KEY = ['merchant_id', 'key', 'value', 'bucket_start', 'connection_id', 'meter_id'] as const;
const GROUPED_ROLLUP_KEY = ['merchant_id', 'dimension', 'key', 'value', 'bucket_start'] as const;
const DAY_ROLLUP_KEY = ['merchant_id', 'dimension', 'day_start', 'key'] as const;

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
