/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Usage rollups per UTC day for the overview's leaders (decision 0042): the sums per customer and
 * per model for each day, so the top customers and models over a range read one row per group and
 * day for its whole UTC days and the 15-minute rollups (or records) only at its two edges.
 * Backfilled from the customers' 15-minute rollups and from the stored non-pending records.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  // The key leads with (merchant, dimension, day): a range's groups are one range scan.
  await db.schema
    .createTable('usage_rollups_by_day')
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('dimension', 'text', (c) => c.notNull())
    .addColumn('day_start', 'text', (c) => c.notNull())
    .addColumn('key', 'text', (c) => c.notNull())
    .addColumn('requests', 'bigint', (c) => c.notNull())
    .addColumn('tokens', 'bigint', (c) => c.notNull())
    .addColumn('usage_cost', 'bigint', (c) => c.notNull())
    .addColumn('fee', 'bigint', (c) => c.notNull())
    .addColumn('service_charge', 'bigint', (c) => c.notNull())
    .addColumn('request_cost', 'bigint', (c) => c.notNull())
    .addColumn('wallet_cost', 'bigint', (c) => c.notNull())
    .addColumn('merchant_cost', 'bigint', (c) => c.notNull())
    .addPrimaryKeyConstraint('usage_rollups_by_day_pk', ['merchant_id', 'dimension', 'day_start', 'key'])
    .execute();

  const columns = sql.raw('merchant_id, dimension, day_start, key, requests, tokens, usage_cost, fee, service_charge, request_cost, wallet_cost, merchant_cost');
  // Records without a customer are in no customer's row; records without a model are under ''.
  await sql`insert into usage_rollups_by_day (${columns})
    select merchant_id, 'customer', substr(bucket_start, 1, 10) || 'T00:00:00.000Z', connection_id,
      sum(requests), sum(tokens), sum(usage_cost), sum(fee), sum(service_charge), sum(request_cost), sum(wallet_cost), sum(merchant_cost)
    from usage_rollups where connection_id <> ''
    group by merchant_id, substr(bucket_start, 1, 10), connection_id`.execute(db);
  await sql`insert into usage_rollups_by_day (${columns})
    select merchant_id, 'model', substr(created_at, 1, 10) || 'T00:00:00.000Z', coalesce(model, ''),
      count(*), sum(input_tokens + output_tokens), sum(input_cost + output_cost), sum(fee_amount), sum(service_charge_amount),
      sum(total_request_cost), sum(total_wallet_cost), sum(total_merchant_cost)
    from requests where status <> 'pending'
    group by merchant_id, substr(created_at, 1, 10), coalesce(model, '')`.execute(db);
}
