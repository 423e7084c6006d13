import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { carriedTotal, carryOf } from '../../src/storage/exact-sum.ts';
import { up as carryRollups } from '../../src/storage/migrations/0025_usage_rollups_carry.ts';
import { CARRIED_SUMS } from '../../src/storage/rollups.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const MAX_BIGINT = 2n ** 63n - 1n;

/** Each rollup table and the key columns of a row of it, but for the merchant and the bucket or day. */
const TABLES = {
  usage_rollups: { bucket_start: '2026-03-01T00:00:00.000Z', connection_id: 'conn_a', meter_id: 'meter_x' },
  usage_rollups_by_metadata: { key: 'team', value: 'a', bucket_start: '2026-03-01T00:00:00.000Z', connection_id: 'conn_a', meter_id: '' },
  usage_rollups_grouped: { dimension: 'total', key: '', value: '', bucket_start: '2026-03-01T00:00:00.000Z' },
  usage_rollups_by_day: { dimension: 'model', day_start: '2026-03-01T00:00:00.000Z', key: 'gpt-4o' },
} as const;

/** Sums as a database before the migration held them: small, just under and past 10^18, the largest BIGINT, negative past -10^18. */
const STORED = [0n, 999_999_999_999_999_999n, 10n ** 18n, 9_000_000_000_123_456_789n, MAX_BIGINT, -(2n * 10n ** 18n + 5n), 58_100_000n];

/**
 * Migration 0025 on a database seeded as it stood before it (no carry columns, sums that a single
 * BIGINT held, on SQLite a sum that had overflowed into a float): every stored total is the same
 * afterwards, each column below 10^18 in size with the rest in its carry, integers only.
 */
describe.each(databasesUnderTest())('usage rollup carry migration on %s', (dialect) => {
  let t: TestApp;
  let db: Kysely<Record<string, Record<string, unknown>>>;

  beforeAll(async () => {
    t = await startTestApp(dialect);
    db = t.storage.db as unknown as typeof db;
    // Back to the schema before the migration: its carry columns gone.
    for (const table of Object.keys(TABLES)) {
      for (const column of CARRIED_SUMS) await sql`alter table ${sql.table(table)} drop column ${sql.ref(carryOf(column))}`.execute(db);
    }
  });
  afterAll(async () => t?.close());

  /** A row whose sums are each a different one of STORED, starting at `amount`. */
  const rowOf = (table: keyof typeof TABLES, merchant: string, amount: bigint): Record<string, unknown> => ({
    merchant_id: merchant,
    ...TABLES[table],
    requests: 1n,
    ...Object.fromEntries(CARRIED_SUMS.map((c, i) => [c, STORED[(STORED.indexOf(amount) + i) % STORED.length]!])),
  });

  it('keeps every stored total exact while moving what passes 10^18 into its carry', async () => {
    const expected = new Map<string, Record<string, bigint>>();
    for (const table of Object.keys(TABLES) as (keyof typeof TABLES)[]) {
      for (const [i, amount] of STORED.entries()) {
        const row = rowOf(table, `m_carry_${i}`, amount);
        await db.insertInto(table).values(row).execute();
        expected.set(`${table} ${row.merchant_id}`, Object.fromEntries(CARRIED_SUMS.map((c) => [c, row[c] as bigint])));
      }
    }
    let overflowed = 0;
    if (dialect === 'sqlite') {
      // What SQLite did when a sum passed 2^63: the sum became a float.
      for (const table of Object.keys(TABLES)) {
        await sql`update ${sql.table(table)} set fee = fee + ${MAX_BIGINT} where merchant_id = 'm_carry_4'`.execute(db);
        const stored = await sql<{ kind: string }>`select typeof(fee) as kind from ${sql.table(table)} where merchant_id = 'm_carry_4'`.execute(db);
        expect(stored.rows[0]!.kind).toBe('real');
        overflowed++;
      }
    }

    await carryRollups(db as unknown as Kysely<unknown>);

    for (const table of Object.keys(TABLES) as (keyof typeof TABLES)[]) {
      const rows = await db.selectFrom(table).selectAll().where('merchant_id', 'like', 'm_carry_%').execute();
      expect(rows).toHaveLength(STORED.length);
      for (const row of rows) {
        const want = expected.get(`${table} ${String(row.merchant_id)}`)!;
        for (const column of CARRIED_SUMS) {
          const rest = row[column] as bigint;
          expect(typeof rest).toBe('bigint');
          expect(rest < 10n ** 18n && rest > -(10n ** 18n)).toBe(true);
          const total = carriedTotal(rest, row[carryOf(column)]);
          if (dialect === 'sqlite' && row.merchant_id === 'm_carry_4' && column === 'fee') {
            // The float kept about 16 digits of the true stored sum + 2^63 − 1; so does the repair.
            const truth = want[column]! + MAX_BIGINT;
            expect(total > truth - 2n ** 12n && total < truth + 2n ** 12n).toBe(true);
          } else expect(total).toBe(want[column]);
          if (total > -(10n ** 18n) && total < 10n ** 18n) expect(row[carryOf(column)]).toBeNull();
        }
      }
      if (dialect === 'sqlite') {
        const reals = await sql<{ n: number }>`select count(*) as n from ${sql.table(table)} where ${sql.join(
          [...CARRIED_SUMS, ...CARRIED_SUMS.map(carryOf)].map((c) => sql`typeof(${sql.ref(c)}) = 'real'`),
          sql` or `,
        )}`.execute(db);
        expect(Number(reals.rows[0]!.n)).toBe(0);
      }
    }
    expect(overflowed).toBe(dialect === 'sqlite' ? Object.keys(TABLES).length : 0);
  });
});
