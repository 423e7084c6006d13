/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Spend keys (drop-in provider keys with budgets, limits and allow-lists), their in-flight
 * reservations, and wallet keys (a wallet owner's credential for managing its spend keys).
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('spend_keys')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('wallet_id', 'text', (c) => c.notNull())
    .addColumn('connection_id', 'text')
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('request_shape', 'text', (c) => c.notNull())
    .addColumn('key_hash', 'text', (c) => c.notNull())
    .addColumn('key_preview', 'text', (c) => c.notNull())
    // JSON arrays of strings, or null (no restriction).
    .addColumn('allowed_models', 'text')
    .addColumn('allowed_providers', 'text')
    .addColumn('spend_limit_amount', 'bigint')
    .addColumn('spend_limit_cycle', 'text')
    .addColumn('request_limit_count', 'bigint')
    .addColumn('request_limit_cycle', 'text')
    .addColumn('rate_rpm', 'bigint')
    .addColumn('rate_burst', 'bigint')
    .addColumn('expires_at', 'text')
    // Counters. current_* belong to the cycle window starting at *_cycle_start.
    .addColumn('spend_cycle_start', 'text', (c) => c.notNull())
    .addColumn('current_spend', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('reserved_spend', 'bigint', (c) => c.notNull().defaultTo(0).check(sql`reserved_spend >= 0`))
    .addColumn('total_spend', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('request_cycle_start', 'text', (c) => c.notNull())
    .addColumn('current_requests', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('total_requests', 'bigint', (c) => c.notNull().defaultTo(0))
    // The cycle start for which spend_key.limit_reached was last emitted, per limit.
    .addColumn('spend_event_cycle', 'text')
    .addColumn('request_event_cycle', 'text')
    // Token bucket (database mode): 1 token = 60000 units, so refill is exactly `rpm` units per ms.
    .addColumn('bucket_units', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('bucket_at_ms', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('last_used_at', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('revoked_at', 'text')
    .execute();
  await db.schema.createIndex('spend_keys_key_hash_uq').unique().on('spend_keys').column('key_hash').execute();
  await db.schema.createIndex('spend_keys_merchant_idx').on('spend_keys').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('spend_keys_wallet_idx').on('spend_keys').columns(['wallet_id', 'id']).execute();

  // One row per admitted, not yet settled request of a spend key: what it reserved.
  await db.schema
    .createTable('spend_key_reservations')
    .addColumn('request_pk', 'text', (c) => c.primaryKey())
    .addColumn('spend_key_id', 'text', (c) => c.notNull())
    .addColumn('amount', 'bigint', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();

  await db.schema
    .createTable('wallet_keys')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('wallet_id', 'text', (c) => c.notNull())
    .addColumn('connection_id', 'text')
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('key_hash', 'text', (c) => c.notNull())
    .addColumn('key_preview', 'text', (c) => c.notNull())
    .addColumn('last_used_at', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('revoked_at', 'text')
    .execute();
  await db.schema.createIndex('wallet_keys_key_hash_uq').unique().on('wallet_keys').column('key_hash').execute();
  await db.schema.createIndex('wallet_keys_merchant_idx').on('wallet_keys').columns(['merchant_id', 'id']).execute();
}
