import { Migrator, sql, type Kysely, type Migration, type MigrationProvider } from 'kysely';
import type { Storage } from './db.ts';
import type { Database } from './schema.ts';
import * as m0001 from './migrations/0001_foundation.ts';
import * as m0002 from './migrations/0002_billing.ts';
import * as m0003 from './migrations/0003_request_metadata_order.ts';
import * as m0004 from './migrations/0004_spend_keys.ts';
import * as m0005 from './migrations/0005_ledger_constraints.ts';
import * as m0006 from './migrations/0006_request_cache_tokens.ts';
import * as m0007 from './migrations/0007_usage_rollups_by_metadata.ts';
import * as m0008 from './migrations/0008_ledger_balance_per_statement.ts';
import * as m0009 from './migrations/0009_commerce.ts';
import * as m0010 from './migrations/0010_webhooks.ts';
import * as m0011 from './migrations/0011_dashboard.ts';
import * as m0012 from './migrations/0012_events_undispatched_by_merchant.ts';
import * as m0013 from './migrations/0013_subscription_cycle_anchor.ts';
import * as m0014 from './migrations/0014_request_requested_model.ts';
import * as m0015 from './migrations/0015_charge_recovery_and_overrun.ts';
import * as m0016 from './migrations/0016_spend_key_overrun.ts';
import * as m0017 from './migrations/0017_checkout_contact.ts';
import * as m0018 from './migrations/0018_request_usage_details.ts';
import * as m0019 from './migrations/0019_password_resets.ts';
import * as m0020 from './migrations/0020_webhook_deliveries_by_event.ts';
import * as m0021 from './migrations/0021_refunds.ts';
import * as m0022 from './migrations/0022_usage_rollups_grouped.ts';
import * as m0023 from './migrations/0023_usage_rollups_per_day.ts';
import * as m0024 from './migrations/0024_alerts.ts';
import * as m0025 from './migrations/0025_usage_rollups_carry.ts';
import * as m0026 from './migrations/0026_payment_credit_reference.ts';
import * as m0027 from './migrations/0027_webhook_delivery_answers.ts';

/** The ordered, frozen list. New migrations are appended, never inserted or edited. */
const MIGRATIONS: Record<string, Migration> = {
  '0001_foundation': m0001,
  '0002_billing': m0002,
  '0003_request_metadata_order': m0003,
  '0004_spend_keys': m0004,
  '0005_ledger_constraints': m0005,
  '0006_request_cache_tokens': m0006,
  '0007_usage_rollups_by_metadata': m0007,
  '0008_ledger_balance_per_statement': m0008,
  '0009_commerce': m0009,
  '0010_webhooks': m0010,
  '0011_dashboard': m0011,
  '0012_events_undispatched_by_merchant': m0012,
  '0013_subscription_cycle_anchor': m0013,
  '0014_request_requested_model': m0014,
  '0015_charge_recovery_and_overrun': m0015,
  '0016_spend_key_overrun': m0016,
  '0017_checkout_contact': m0017,
  '0018_request_usage_details': m0018,
  '0019_password_resets': m0019,
  '0020_webhook_deliveries_by_event': m0020,
  '0021_refunds': m0021,
  '0022_usage_rollups_grouped': m0022,
  '0023_usage_rollups_per_day': m0023,
  '0024_alerts': m0024,
  '0025_usage_rollups_carry': m0025,
  '0026_payment_credit_reference': m0026,
  '0027_webhook_delivery_answers': m0027,
};

const provider: MigrationProvider = { getMigrations: async () => MIGRATIONS };

/** Our own lock id: Kysely's lock is taken only after it creates its bookkeeping tables, which races. */
const PG_MIGRATION_LOCK = 7_311_204_551n;

/**
 * Brings the schema to the latest version. On PostgreSQL one session-level advisory lock spans the
 * whole run, so instances starting together take turns; on SQLite the run holds the write lock.
 */
export async function migrateToLatest(storage: Storage): Promise<string[]> {
  if (storage.dialect === 'postgres') {
    return storage.db.connection().execute(async (conn) => {
      await sql`select pg_advisory_lock(${sql.lit(PG_MIGRATION_LOCK)})`.execute(conn);
      try {
        // Kysely looks for its bookkeeping tables in every schema; pin it to the one we migrate.
        const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(conn);
        return await runMigratorRetryingVanishedObjects(conn, rows[0]?.schema);
      } finally {
        await sql`select pg_advisory_unlock(${sql.lit(PG_MIGRATION_LOCK)})`.execute(conn);
      }
    });
  }
  // SQLite DDL runs outside Kysely's transactions; one IMMEDIATE transaction makes the run atomic
  // and makes a second process wait on the write lock, then find the work done.
  return storage.db.connection().execute(async (conn) => {
    await sql`begin immediate`.execute(conn);
    try {
      const applied = await runMigrator(conn);
      await sql`commit`.execute(conn);
      return applied;
    } catch (e) {
      await sql`rollback`.execute(conn);
      throw e;
    }
  });
}

/**
 * Kysely finds its bookkeeping tables by listing the tables of every schema in the database. When
 * another database user drops a schema or table in the middle of that listing (another instance's
 * tests tearing down, an operator cleaning up), PostgreSQL answers "schema … does not exist" about
 * a schema that is not ours. Nothing was migrated yet at that point (each migration runs in its own
 * transaction after the listing), so the run is simply tried again; our own schema missing fails
 * the same way every time and is still reported (test/reliability/vanishing-schemas.reliability.ts).
 */
const VANISHED_OBJECT_CODES = new Set(['3F000', '42P01']);
const MIGRATION_ATTEMPTS = 10;

async function runMigratorRetryingVanishedObjects(db: Kysely<Database>, schema?: string): Promise<string[]> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await runMigrator(db, schema);
    } catch (e) {
      const code = (e as { code?: unknown }).code;
      if (attempt >= MIGRATION_ATTEMPTS || typeof code !== 'string' || !VANISHED_OBJECT_CODES.has(code)) throw e;
    }
  }
}

async function runMigrator(db: Kysely<Database>, schema?: string): Promise<string[]> {
  const migrator = new Migrator({ db, provider, migrationTableSchema: schema });
  const { error, results } = await migrator.migrateToLatest();
  if (error) throw error instanceof Error ? error : new Error(String(error));
  return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
}
