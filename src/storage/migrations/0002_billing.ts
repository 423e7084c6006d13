/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Billing: wallet buckets and holds, the append-only ledger, request records, usage rollups.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  // balance = cycle_credit + bundle_credit + prepaid; held = sum of active holds.
  await db.schema.alterTable('wallets').addColumn('cycle_credit', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
  await db.schema.alterTable('wallets').addColumn('bundle_credit', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
  await db.schema
    .alterTable('wallets')
    .addColumn('held', 'bigint', (c) => c.notNull().defaultTo(0).check(sql`held >= 0`))
    .execute();

  await db.schema
    .createTable('ledger_transactions')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('kind', 'text', (c) => c.notNull())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('reference', 'text')
    .addColumn('description', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  // Settlement happens once per request: the database refuses a second charge.
  await db.schema
    .createIndex('ledger_transactions_reference_uq')
    .unique()
    .on('ledger_transactions')
    .columns(['kind', 'reference'])
    .where(sql<boolean>`reference is not null`)
    .execute();

  await db.schema
    .createTable('ledger_postings')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('transaction_id', 'text', (c) => c.notNull().references('ledger_transactions.id'))
    .addColumn('account', 'text', (c) => c.notNull())
    .addColumn('amount', 'bigint', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('ledger_postings_account_idx').on('ledger_postings').column('account').execute();
  await db.schema.createIndex('ledger_postings_tx_idx').on('ledger_postings').column('transaction_id').execute();

  await db.schema
    .createTable('holds')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('wallet_id', 'text', (c) => c.notNull().references('wallets.id'))
    .addColumn('reference', 'text', (c) => c.notNull())
    .addColumn('amount', 'bigint', (c) => c.notNull().check(sql`amount >= 0`))
    .addColumn('status', 'text', (c) => c.notNull().check(sql`status in ('active', 'settled', 'released', 'expired')`))
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('holds_status_expiry_idx').on('holds').columns(['status', 'expires_at']).execute();
  await db.schema.createIndex('holds_wallet_idx').on('holds').columns(['wallet_id', 'status']).execute();

  await db.schema
    .createTable('requests')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('request_id', 'text', (c) => c.notNull())
    .addColumn('body_hash', 'text')
    .addColumn('status', 'text', (c) => c.notNull().check(sql`status in ('pending', 'completed', 'error')`))
    .addColumn('connection_id', 'text')
    .addColumn('meter_id', 'text')
    .addColumn('provider', 'text', (c) => c.notNull())
    .addColumn('model', 'text')
    .addColumn('endpoint', 'text', (c) => c.notNull())
    .addColumn('provider_key_type', 'text', (c) => c.notNull())
    .addColumn('response_id', 'text')
    .addColumn('provider_timestamp', 'text')
    .addColumn('metadata', 'text', (c) => c.notNull())
    .addColumn('input_tokens', 'bigint', (c) => c.notNull())
    .addColumn('output_tokens', 'bigint', (c) => c.notNull())
    .addColumn('input_characters', 'bigint', (c) => c.notNull())
    .addColumn('output_characters', 'bigint', (c) => c.notNull())
    .addColumn('input_seconds', 'text', (c) => c.notNull())
    .addColumn('output_seconds', 'text', (c) => c.notNull())
    .addColumn('input_cost', 'bigint', (c) => c.notNull())
    .addColumn('output_cost', 'bigint', (c) => c.notNull())
    .addColumn('base_cost_charged', 'integer', (c) => c.notNull())
    .addColumn('base_cost_payer', 'text', (c) => c.notNull())
    .addColumn('fee_amount', 'bigint', (c) => c.notNull())
    .addColumn('rate_type', 'text', (c) => c.notNull())
    .addColumn('token_basis', 'text', (c) => c.notNull())
    .addColumn('breakdown', 'text', (c) => c.notNull())
    .addColumn('service_charge_amount', 'bigint', (c) => c.notNull())
    .addColumn('service_charge_payer', 'text', (c) => c.notNull())
    .addColumn('total_request_cost', 'bigint', (c) => c.notNull())
    .addColumn('total_wallet_cost', 'bigint', (c) => c.notNull())
    .addColumn('total_merchant_cost', 'bigint', (c) => c.notNull())
    .addColumn('usage_estimated', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('completed_at', 'text')
    .addCheckConstraint(
      'requests_costs_add_up',
      sql`total_request_cost = total_wallet_cost + total_merchant_cost`,
    )
    .execute();
  await db.schema.createIndex('requests_request_id_uq').unique().on('requests').columns(['merchant_id', 'request_id']).execute();
  await db.schema.createIndex('requests_merchant_idx').on('requests').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('requests_connection_idx').on('requests').columns(['merchant_id', 'connection_id', 'id']).execute();
  await db.schema.createIndex('requests_meter_idx').on('requests').columns(['merchant_id', 'meter_id', 'id']).execute();
  await db.schema.createIndex('requests_created_idx').on('requests').columns(['merchant_id', 'created_at']).execute();

  await db.schema
    .createTable('request_metadata')
    .addColumn('request_pk', 'text', (c) => c.notNull().references('requests.id'))
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('key', 'text', (c) => c.notNull())
    .addColumn('value', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addPrimaryKeyConstraint('request_metadata_pk', ['request_pk', 'key'])
    .execute();
  await db.schema
    .createIndex('request_metadata_lookup_idx')
    .on('request_metadata')
    .columns(['merchant_id', 'key', 'value', 'created_at'])
    .execute();

  // Per 15 minutes, so a day in any UTC offset (whole, half or quarter hours) is a sum of buckets.
  await db.schema
    .createTable('usage_rollups')
    .addColumn('merchant_id', 'text', (c) => c.notNull())
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
    .addPrimaryKeyConstraint('usage_rollups_pk', ['merchant_id', 'bucket_start', 'connection_id', 'meter_id'])
    .execute();
  await db.schema
    .createIndex('usage_rollups_connection_idx')
    .on('usage_rollups')
    .columns(['merchant_id', 'connection_id', 'bucket_start'])
    .execute();
  await db.schema
    .createIndex('usage_rollups_meter_idx')
    .on('usage_rollups')
    .columns(['merchant_id', 'meter_id', 'bucket_start'])
    .execute();

  await db.schema
    .createTable('meter_usage_counters')
    .addColumn('meter_id', 'text', (c) => c.notNull())
    .addColumn('connection_id', 'text', (c) => c.notNull())
    .addColumn('period_start', 'text', (c) => c.notNull())
    .addColumn('units', 'bigint', (c) => c.notNull())
    .addPrimaryKeyConstraint('meter_usage_counters_pk', ['meter_id', 'connection_id', 'period_start'])
    .execute();

  // The outbox: events are written in the same transaction as the change that caused them;
  // the webhook dispatcher delivers them later.
  await db.schema
    .createTable('events')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('type', 'text', (c) => c.notNull())
    .addColumn('payload', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('events_merchant_idx').on('events').columns(['merchant_id', 'id']).execute();
}
