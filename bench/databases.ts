import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/** A database a benchmark fills, and how to drop it afterwards (bench data must not pile up). */
export type BenchDatabase = { url: string; drop(): Promise<void> };

/** The PostgreSQL benchmarks run against: BENCH_DATABASE_URL, else TEST_DATABASE_URL; none to skip them. */
export const benchPostgresUrl = (): string | undefined => process.env.BENCH_DATABASE_URL ?? process.env.TEST_DATABASE_URL;

export function freshSqlite(): BenchDatabase {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-bench-'));
  return { url: `sqlite:${join(dir, 'bench.db')}`, drop: async () => rmSync(dir, { recursive: true, force: true }) };
}

/** A new schema in the base database; the returned URL selects it. */
export async function freshPostgresSchema(base: string): Promise<BenchDatabase> {
  const schema = `bench_${Date.now()}`;
  const run = async (statement: string) => {
    const client = new pg.Client({ connectionString: base });
    await client.connect();
    try {
      await client.query(statement);
    } finally {
      await client.end();
    }
  };
  await run(`create schema ${schema}`);
  const url = new URL(base);
  url.searchParams.set('options', `-c search_path=${schema}`);
  return { url: url.toString(), drop: () => run(`drop schema ${schema} cascade`) };
}
