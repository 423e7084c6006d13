/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('merchants')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('email', 'text')
    .addColumn('password_hash', 'text')
    .addColumn('service_charge_rate', 'bigint')
    .addColumn('wallet_id', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('merchants_email_uq').unique().on('merchants').column('email').execute();

  await db.schema
    .createTable('wallets')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('owner_type', 'text', (c) => c.notNull().check(sqlIn('owner_type', ['merchant', 'connection'])))
    .addColumn('balance', 'bigint', (c) => c.notNull().defaultTo(0))
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();

  await db.schema
    .createTable('secret_keys')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('key_hash', 'text', (c) => c.notNull().unique())
    .addColumn('key_hint', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('revoked_at', 'text')
    .execute();
  await db.schema.createIndex('secret_keys_merchant_idx').on('secret_keys').columns(['merchant_id', 'id']).execute();

  await db.schema
    .createTable('meters')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('slug', 'text', (c) => c.notNull())
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('secret', 'text', (c) => c.notNull().unique())
    .addColumn('rate_type', 'text', (c) => c.notNull().check(sqlIn('rate_type', ['fixed', 'percentage'])))
    .addColumn('tier_type', 'text', (c) =>
      c.notNull().check(sqlIn('tier_type', ['tokens_1m', 'characters_1m', 'minutes', 'requests'])),
    )
    .addColumn('token_basis', 'text', (c) => c.notNull().check(sqlIn('token_basis', ['input+output', 'output'])))
    .addColumn('base_cost_payer', 'text', (c) => c.notNull().check(sqlIn('base_cost_payer', ['wallet', 'merchant'])))
    .addColumn('service_charge_payer', 'text', (c) =>
      c.notNull().check(sqlIn('service_charge_payer', ['wallet', 'merchant'])),
    )
    .addColumn('tiers', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('deleted_at', 'text')
    .execute();
  await db.schema.createIndex('meters_merchant_idx').on('meters').columns(['merchant_id', 'id']).execute();
  // A slug names one live meter of a merchant; deleted meters keep theirs for old records.
  await db.schema
    .createIndex('meters_slug_uq')
    .unique()
    .on('meters')
    .columns(['merchant_id', 'slug'])
    .where(sqlIsNull('deleted_at'))
    .execute();

  await db.schema
    .createTable('connections')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('wallet_id', 'text', (c) => c.notNull().references('wallets.id'))
    .addColumn('secret', 'text', (c) => c.notNull().unique())
    .addColumn('reference_id', 'text')
    .addColumn('first_name', 'text')
    .addColumn('last_name', 'text')
    .addColumn('email', 'text')
    .addColumn('phone', 'text')
    .addColumn('metadata', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('deleted_at', 'text')
    .execute();
  await db.schema.createIndex('connections_merchant_idx').on('connections').columns(['merchant_id', 'id']).execute();
  await db.schema
    .createIndex('connections_reference_uq')
    .unique()
    .on('connections')
    .columns(['merchant_id', 'reference_id'])
    .where(sqlIsNull('deleted_at'))
    .execute();

  await db.schema
    .createTable('idempotency_keys')
    .addColumn('scope', 'text', (c) => c.notNull())
    .addColumn('key', 'text', (c) => c.notNull())
    .addColumn('request_hash', 'text', (c) => c.notNull())
    .addColumn('state', 'text', (c) => c.notNull().check(sqlIn('state', ['in_flight', 'done'])))
    .addColumn('response_status', 'integer')
    .addColumn('response_body', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .addPrimaryKeyConstraint('idempotency_keys_pk', ['scope', 'key'])
    .execute();
  await db.schema.createIndex('idempotency_keys_expiry_idx').on('idempotency_keys').column('expires_at').execute();
}

// Kysely's schema builder takes raw SQL for CHECK and partial-index predicates.
function sqlIn(column: string, values: string[]) {
  return sql`${sql.ref(column)} in (${sql.join(values.map((v) => sql.lit(v)))})`;
}

function sqlIsNull(column: string) {
  return sql<boolean>`${sql.ref(column)} is null`;
}
