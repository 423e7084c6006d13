import { readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/**
 * Every test database of one run is named for the run (see helpers/databases.ts): its PostgreSQL
 * schemas and SQLite directories are dropped when the run ends, so repeated runs on one machine
 * (CI's included) do not pile them up. Another run's databases, even one still going, are left.
 */
export function setup(): () => Promise<void> {
  const run = `${Date.now().toString(36)}${process.pid.toString(36)}`;
  process.env.TOLLGATE_TEST_RUN = run;
  return async () => {
    for (const entry of readdirSync(tmpdir())) {
      if (entry.startsWith(`tollgate-test-${run}-`)) rmSync(join(tmpdir(), entry), { recursive: true, force: true });
    }
    await dropSchemasOf(run);
  };
}

async function dropSchemasOf(run: string): Promise<void> {
  if (!process.env.TEST_DATABASE_URL) return;
  const client = new pg.Client({ connectionString: process.env.TEST_DATABASE_URL });
  await client.connect();
  try {
    const { rows } = await client.query<{ name: string }>('select nspname as name from pg_namespace where nspname like $1', [`t\\_${run}\\_%`]);
    for (const { name } of rows) await client.query(`drop schema ${client.escapeIdentifier(name)} cascade`);
  } finally {
    await client.end();
  }
}
