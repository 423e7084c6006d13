import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { ulid } from 'ulid';

export type TestDatabase = { dialect: 'sqlite' | 'postgres'; url: string };

/**
 * The engines every storage-touching suite runs on: SQLite always; PostgreSQL when
 * TEST_DATABASE_URL is set. In CI a missing PostgreSQL is a failure, never a silent skip.
 */
export function databasesUnderTest(): TestDatabase['dialect'][] {
  if (process.env.TEST_DATABASE_URL) return ['sqlite', 'postgres'];
  if (process.env.CI) throw new Error('CI must set TEST_DATABASE_URL so the PostgreSQL suites run.');
  return ['sqlite'];
}

/** The test run's name, by which the global setup drops the run's databases at its end. */
const runName = () => process.env.TOLLGATE_TEST_RUN ?? 'adhoc';

/** A new temp directory named for the test run, so the global teardown removes it with the run. */
export function runTempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), `tollgate-test-${runName()}-`));
  // Outside a test run (a script or a file run without the global setup) no teardown names this
  // directory, so the process that made it removes it as it exits.
  if (process.env.TOLLGATE_TEST_RUN === undefined) removeAtExit(dir);
  return dir;
}

const removedAtExit = new Set<string>();
function removeAtExit(dir: string): void {
  if (removedAtExit.size === 0) process.once('exit', () => removedAtExit.forEach((d) => rmSync(d, { recursive: true, force: true })));
  removedAtExit.add(dir);
}

/** An operator price-overrides file (PRICE_OVERRIDES_FILE) in the run's temp directory. */
export function priceOverridesFile(prices: unknown): string {
  const file = join(runTempDir(), 'prices.json');
  writeFileSync(file, JSON.stringify(prices));
  return file;
}

/** A fresh, empty database of the given engine: a temp SQLite file, or a new PostgreSQL schema. */
export async function freshDatabase(dialect: TestDatabase['dialect']): Promise<TestDatabase> {
  if (dialect === 'sqlite') return { dialect, url: `sqlite:${join(runTempDir(), 'test.db')}` };
  const base = process.env.TEST_DATABASE_URL;
  if (!base) throw new Error('TEST_DATABASE_URL is not set');
  const schema = `t_${runName()}_${ulid().toLowerCase()}`;
  const client = new pg.Client({ connectionString: base });
  await client.connect();
  try {
    await client.query(`create schema ${schema}`);
  } finally {
    await client.end();
  }
  const url = new URL(base);
  url.searchParams.set('options', `-c search_path=${schema}`);
  return { dialect, url: url.toString() };
}
