/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Usage rollups per metadata pair: the 15-minute sums of usage_rollups, once for every
 * (key, value) a record carries, so GET /usage filtered by one pair reads at most 96 rows a day
 * per (connection, meter) instead of every matching record. Backfilled here from the completed
 * and failed records already stored (pending ones are not usage yet); writers add to it from now on.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  // The key leads with (merchant, key, value, bucket): a one-pair report is a range scan of it.
  await db.schema
    .createTable('usage_rollups_by_metadata')
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('key', 'text', (c) => c.notNull())
    .addColumn('value', 'text', (c) => c.notNull())
    .addColumn('bucket_start', 'text', (c) => c.notNull())
    .addColumn('connection_id', 'text', (c) => c.notNull())
    .addColumn('meter_id', 'text', (c) => c.notNull())
    .addColumn('requests', 'bigint', (c) => c.notNull())
    .addColumn('tokens', 'bigint', (c) => c.notNull())
    .addColumn('usage_cost', 'bigint', (c) => c.notNull())
    .addColumn('fee', 'bigint', (c) => c.notNull())
    .addColumn('service_charge', 'bigint', (c) => c.notNull())
    .addColumn('request_cost', 'bigint', (c) => c.notNull())
    .addColumn('wallet_cost', 'bigint', (c) => c.notNull())
    .addColumn('merchant_cost', 'bigint', (c) => c.notNull())
    .addPrimaryKeyConstraint('usage_rollups_by_metadata_pk', ['merchant_id', 'key', 'value', 'bucket_start', 'connection_id', 'meter_id'])
    .execute();

  // The bucket is cut out of the ISO created_at text (the same SQL on both engines); records
  // without a connection or meter roll up under '', as in usage_rollups.
  await sql`
    insert into usage_rollups_by_metadata (merchant_id, key, value, bucket_start, connection_id, meter_id,
      requests, tokens, usage_cost, fee, service_charge, request_cost, wallet_cost, merchant_cost)
    select m.merchant_id, m.key, m.value,
      substr(r.created_at, 1, 14) || case
        when substr(r.created_at, 15, 2) < '15' then '00'
        when substr(r.created_at, 15, 2) < '30' then '15'
        when substr(r.created_at, 15, 2) < '45' then '30'
        else '45' end || ':00.000Z',
      coalesce(r.connection_id, ''), coalesce(r.meter_id, ''),
      count(*), sum(r.input_tokens + r.output_tokens), sum(r.input_cost + r.output_cost), sum(r.fee_amount),
      sum(r.service_charge_amount), sum(r.total_request_cost), sum(r.total_wallet_cost), sum(r.total_merchant_cost)
    from request_metadata m
    join requests r on r.id = m.request_pk
    where r.status <> 'pending'
    group by 1, 2, 3, 4, 5, 6`.execute(db);
}
