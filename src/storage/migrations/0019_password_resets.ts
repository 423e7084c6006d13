/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * One-time password-reset links an operator issues (`tollgate admin reset-link`): stored only as
 * SHA-256 hashes, expiring, spent once (decision 0030).
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('password_resets')
    .addColumn('token_hash', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .addColumn('used_at', 'text')
    .execute();
  await db.schema.createIndex('password_resets_merchant_idx').on('password_resets').column('merchant_id').execute();
}
