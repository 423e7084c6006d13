/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Dashboard sign-in sessions, one-time CLI authorization codes (both stored only as SHA-256
 * hashes), and server secrets generated once per installation (the cookie-signing key), so every
 * instance signs and verifies cookies with the same key (decision 0018).
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('dashboard_sessions')
    .addColumn('token_hash', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    // Synchronizer token: every state-changing form of this session must echo it.
    .addColumn('csrf_token', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('dashboard_sessions_merchant_idx').on('dashboard_sessions').column('merchant_id').execute();

  await db.schema
    .createTable('cli_auth_codes')
    .addColumn('code_hash', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .addColumn('used_at', 'text')
    .execute();

  await db.schema
    .createTable('server_secrets')
    .addColumn('name', 'text', (c) => c.primaryKey())
    .addColumn('value', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
}

