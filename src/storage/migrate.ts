import { Migrator, type Migration, type MigrationProvider } from 'kysely';
import type { Storage } from './db.ts';
import * as m0001 from './migrations/0001_foundation.ts';

/** The ordered, frozen list. New migrations are appended, never inserted or edited. */
const MIGRATIONS: Record<string, Migration> = {
  '0001_foundation': m0001,
};

const provider: MigrationProvider = { getMigrations: async () => MIGRATIONS };

const SQLITE_BUSY_RETRIES = 20;

/**
 * Brings the schema to the latest version. On PostgreSQL, Kysely holds an advisory lock so
 * instances starting together take turns; on SQLite a second writer gets SQLITE_BUSY and retries,
 * finding the work done.
 */
export async function migrateToLatest(storage: Storage): Promise<string[]> {
  const migrator = new Migrator({ db: storage.db, provider });
  for (let attempt = 0; ; attempt++) {
    const { error, results } = await migrator.migrateToLatest();
    if (!error) return (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName);
    if (storage.dialect === 'sqlite' && isBusy(error) && attempt < SQLITE_BUSY_RETRIES) {
      await new Promise((r) => setTimeout(r, 50 + Math.random() * 100));
      continue;
    }
    throw error instanceof Error ? error : new Error(String(error));
  }
}

function isBusy(error: unknown): boolean {
  return typeof error === 'object' && error !== null && 'code' in error && String(error.code).startsWith('SQLITE_BUSY');
}
