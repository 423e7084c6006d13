import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { openStorage } from '../../src/storage/db.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { freshDatabase } from '../helpers/databases.ts';

/**
 * Kysely lists every schema's tables before it migrates. Other users of the same PostgreSQL (a
 * second test run tearing down, an operator cleaning up) drop schemas at any moment; a drop in the
 * middle of that listing must not fail our migration of our own schema. In the reliability suite,
 * which runs one file at a time, because the churn would reach every other file's migrations too.
 */

const postgres = process.env.TEST_DATABASE_URL;
const MIGRATIONS_UNDER_CHURN = 6;

describe.runIf(postgres)('migrations on postgres while other schemas come and go', () => {
  it('migrate every fresh schema although other schemas are dropped during the listing', async () => {
    const churn = startSchemaChurn(postgres!);
    try {
      for (let i = 0; i < MIGRATIONS_UNDER_CHURN; i++) {
        const storage = openStorage((await freshDatabase('postgres')).url);
        try {
          const applied = await migrateToLatest(storage);
          expect(applied.length).toBeGreaterThan(0);
        } finally {
          await storage.close();
        }
      }
    } finally {
      const dropped = await churn.stop();
      console.log(`vanishing schemas: ${MIGRATIONS_UNDER_CHURN} migrations while ${dropped} other schemas were dropped, discrepancies=0`);
      expect(dropped).toBeGreaterThan(0);
    }
  });
});

/** Creates and drops schemas full of tables, back to back, until stopped; returns how many it dropped. */
function startSchemaChurn(url: string): { stop(): Promise<number> } {
  let running = true;
  let dropped = 0;
  const loop = (async () => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      for (let n = 0; running; n++) {
        const schema = `churn_${process.pid}_${n}`;
        const tables = Array.from({ length: 30 }, (_, i) => `create table ${schema}.t${i} (id int primary key, v text);`).join('');
        await client.query(`create schema ${schema}; ${tables}`);
        await client.query(`drop schema ${schema} cascade`);
        dropped++;
      }
    } finally {
      await client.end();
    }
  })();
  return {
    async stop() {
      running = false;
      await loop;
      return dropped;
    },
  };
}
