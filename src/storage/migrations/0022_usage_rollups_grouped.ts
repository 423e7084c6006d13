/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Usage rollups at the grain reports ask for (decision 0042): the 15-minute sums once per merchant
 * ('total'), per customer, per meter and per metadata pair, without the other dimensions in the
 * key, so GET /usage with no filter, one customer, one meter or one pair reads at most 96 rows a
 * day however many requests there were. Backfilled here from the finer rollups already stored
 * (they hold the same sums per connection and meter); writers add to it from now on.
 */
import { sql, type Kysely } from 'kysely';

const SUMS = sql.raw('requests, tokens, usage_cost, fee, service_charge, request_cost, wallet_cost, merchant_cost');
const SUMMED = sql.raw(
  'sum(requests), sum(tokens), sum(usage_cost), sum(fee), sum(service_charge), sum(request_cost), sum(wallet_cost), sum(merchant_cost)',
);

export async function up(db: Kysely<unknown>): Promise<void> {
  // The key leads with (merchant, dimension, key, value, bucket): one group's report is a range scan.
  await db.schema
    .createTable('usage_rollups_grouped')
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('dimension', 'text', (c) => c.notNull())
    .addColumn('key', 'text', (c) => c.notNull())
    .addColumn('value', 'text', (c) => c.notNull())
    .addColumn('bucket_start', 'text', (c) => c.notNull())
    .addColumn('requests', 'bigint', (c) => c.notNull())
    .addColumn('tokens', 'bigint', (c) => c.notNull())
    .addColumn('usage_cost', 'bigint', (c) => c.notNull())
    .addColumn('fee', 'bigint', (c) => c.notNull())
    .addColumn('service_charge', 'bigint', (c) => c.notNull())
    .addColumn('request_cost', 'bigint', (c) => c.notNull())
    .addColumn('wallet_cost', 'bigint', (c) => c.notNull())
    .addColumn('merchant_cost', 'bigint', (c) => c.notNull())
    .addPrimaryKeyConstraint('usage_rollups_grouped_pk', ['merchant_id', 'dimension', 'key', 'value', 'bucket_start'])
    .execute();

  const insert = sql`insert into usage_rollups_grouped (merchant_id, dimension, key, value, bucket_start, ${SUMS})`;
  await sql`${insert}
    select merchant_id, 'total', '', '', bucket_start, ${SUMMED}
    from usage_rollups group by merchant_id, bucket_start`.execute(db);
  // Records without a customer or meter are in the total but in no customer's or meter's group.
  await sql`${insert}
    select merchant_id, 'customer', connection_id, '', bucket_start, ${SUMMED}
    from usage_rollups where connection_id <> '' group by merchant_id, connection_id, bucket_start`.execute(db);
  await sql`${insert}
    select merchant_id, 'meter', meter_id, '', bucket_start, ${SUMMED}
    from usage_rollups where meter_id <> '' group by merchant_id, meter_id, bucket_start`.execute(db);
  await sql`${insert}
    select merchant_id, 'metadata', key, value, bucket_start, ${SUMMED}
    from usage_rollups_by_metadata group by merchant_id, key, value, bucket_start`.execute(db);
}
