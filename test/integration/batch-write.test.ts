import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { runWrites, type BatchWrite } from '../../src/storage/batch-write.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

/** A batch's writes (storage/batch-write.ts) on each engine, against a table of the test's own. */
describe.each(databasesUnderTest())('runWrites on %s', (dialect) => {
  let storage: Storage;
  const table = 'batch_items' as never;
  /** Past 2^53: a bigint that a float would round. */
  const BIG = 9_007_199_254_740_993n;

  beforeAll(async () => {
    storage = openStorage((await freshDatabase(dialect)).url, { poolSize: 1 });
    await sql`create table batch_items (id text primary key, status text not null, amount bigint not null, note text)`.execute(storage.db);
  });
  afterAll(async () => {
    await storage?.close();
  });

  const run = (writes: BatchWrite[]) => storage.db.transaction().execute((trx) => runWrites(trx, dialect, writes));
  const stored = async () =>
    (await sql<{ id: string; status: string; amount: string | number | bigint; note: string | null }>`select id, status, amount, note from batch_items order by id`.execute(storage.db)).rows.map(
      (row) => ({ ...row, amount: BigInt(row.amount) }),
    );
  const reset = () => sql`delete from batch_items`.execute(storage.db);

  it('inserts every row once, in the columns of the first, a missing value as null, bigints exact', async () => {
    await reset();
    // 45 rows: on SQLite chunks of 32, 8, 4 and 1.
    const rows = Array.from({ length: 45 }, (_, i) => ({ id: `r${String(i).padStart(2, '0')}`, status: 'active', amount: BIG + BigInt(i), note: i % 2 ? `n${i}` : undefined }));
    expect(await run([{ insert: table, rows }])).toEqual([0]);
    expect(await stored()).toEqual(rows.map((row) => ({ ...row, note: row.note ?? null })));
  });

  it('inserts a batch larger than one SQLite statement can take (its 32,766 parameters)', async () => {
    await reset();
    const rows = Array.from({ length: 9000 }, (_, i) => ({ id: `r${String(i).padStart(4, '0')}`, status: 'active', amount: BigInt(i), note: null }));
    await run([{ insert: table, rows }]);
    const stored = await sql<{ n: number | string; total: number | string }>`select count(*) as n, sum(amount) as total from batch_items`.execute(storage.db);
    expect([Number(stored.rows[0]!.n), Number(stored.rows[0]!.total)]).toEqual([9000, (8999 * 9000) / 2]);
  });

  it('a counted update sets the other columns on the rows with its key where its condition holds, and says how many', async () => {
    await reset();
    await run([{ insert: table, rows: [{ id: 'a', status: 'pending', amount: 1n }, { id: 'b', status: 'error', amount: 2n }, { id: 'c', status: 'pending', amount: 3n }] }]);
    const counts = await run([
      {
        update: table,
        key: ['id'],
        rows: ['a', 'b', 'c', 'missing'].map((id) => ({ id, status: 'completed', amount: BIG, note: `done ${id}` })),
        onlyIf: { column: 'status', is: 'pending' },
        counted: true,
      },
    ]);
    expect(counts).toEqual([2]);
    expect(await stored()).toEqual([
      { id: 'a', status: 'completed', amount: BIG, note: 'done a' },
      { id: 'b', status: 'error', amount: 2n, note: null },
      { id: 'c', status: 'completed', amount: BIG, note: 'done c' },
    ]);
  });

  it('a subtracted column is taken off the stored value', async () => {
    await reset();
    await run([{ insert: table, rows: [{ id: 'a', status: 'active', amount: BIG }, { id: 'b', status: 'settled', amount: 50n }] }]);
    const counts = await run([
      { update: table, key: ['id'], rows: [{ id: 'a', amount: 3n }, { id: 'b', amount: 7n }], subtract: ['amount'], onlyIf: { column: 'status', is: 'active' }, counted: true },
    ]);
    expect(counts).toEqual([1]);
    expect((await stored()).map((row) => row.amount)).toEqual([BIG - 3n, 50n]);
  });

  it('addTo adds the sums to a stored row with the same key and inserts the others', async () => {
    await reset();
    await run([{ insert: table, rows: [{ id: 'a', status: 'x', amount: 10n }] }]);
    await run([{ addTo: table, key: ['id'], sums: ['amount'], rows: [{ id: 'a', status: 'x', amount: BIG }, { id: 'b', status: 'y', amount: 5n }] }]);
    expect(await stored()).toEqual([
      { id: 'a', status: 'x', amount: BIG + 10n, note: null },
      { id: 'b', status: 'y', amount: 5n, note: null },
    ]);
  });

  it('answers a count for each write, in order: 0 for an uncounted one or one without rows', async () => {
    await reset();
    await run([{ insert: table, rows: ['a', 'b', 'c', 'e'].map((id) => ({ id, status: 'pending', amount: 1n })) }]);
    const counts = await run([
      { update: table, key: ['id'], rows: [{ id: 'a', status: 'done' }], onlyIf: { column: 'status', is: 'pending' }, counted: true },
      { update: table, key: ['id'], rows: [], counted: true },
      { insert: table, rows: [{ id: 'd', status: 'pending', amount: 2n }] },
      { update: table, key: ['id'], rows: [{ id: 'b', amount: 5n }, { id: 'c', amount: 5n }], counted: true },
      { update: table, key: ['id'], rows: [{ id: 'e', note: 'uncounted' }] },
    ]);
    expect(counts).toEqual([1, 0, 0, 2, 0]);
    expect((await stored()).map((row) => [row.id, row.status, row.amount, row.note])).toEqual([
      ['a', 'done', 1n, null],
      ['b', 'pending', 5n, null],
      ['c', 'pending', 5n, null],
      ['d', 'pending', 2n, null],
      ['e', 'pending', 1n, 'uncounted'],
    ]);
  });
});

describe.runIf(databasesUnderTest().includes('postgres'))('runWrites on PostgreSQL', () => {
  let storage: Storage;
  beforeAll(async () => {
    storage = openStorage((await freshDatabase('postgres')).url, { poolSize: 1 });
    await sql`create table batch_items (id text primary key, status text not null, amount bigint not null)`.execute(storage.db);
  });
  afterAll(async () => {
    await storage?.close();
  });

  it('sends batches of any size as one statement text, prepared once on its connection', async () => {
    const rows = (n: number, from: number) => Array.from({ length: n }, (_, i) => ({ id: `r${from + i}`, status: 'active', amount: BigInt(i) }));
    for (const [n, from] of [[1, 0], [40, 1], [7, 41]] as const) {
      await storage.db.transaction().execute((trx) =>
        runWrites(trx, 'postgres', [
          { insert: 'batch_items' as never, rows: rows(n, from) },
          { update: 'batch_items' as never, key: ['id'], rows: rows(n, from).map(({ id }) => ({ id, amount: 1n })), subtract: ['amount'], counted: true },
        ]),
      );
    }
    const { rows: prepared } = await sql<{ n: string }>`select count(*)::text as n from pg_prepared_statements where statement like '%batch_items%'`.execute(storage.db);
    expect(prepared[0]!.n).toBe('1');
    const { rows: count } = await sql<{ n: string }>`select count(*)::text as n from batch_items`.execute(storage.db);
    expect(count[0]!.n).toBe('48');
  });
});

describe('runWrites on SQLite', () => {
  const rows = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `r${String(i).padStart(2, '0')}`, status: 'pending', amount: BigInt(i) }));
  /** 45 rows: chunks of 32, 8, 4 and 1, so eight statements in all. */
  const writes = (): BatchWrite[] => [
    { insert: 'batch_items' as never, rows: rows(45) },
    { update: 'batch_items' as never, key: ['id'], rows: rows(45).map(({ id }) => ({ id, status: 'done' })), onlyIf: { column: 'status', is: 'pending' }, counted: true },
  ];
  async function opened(url: string): Promise<Storage> {
    const storage = openStorage(url, { poolSize: 1 });
    await sql`create table batch_items (id text primary key, status text not null, amount bigint not null)`.execute(storage.db);
    return storage;
  }

  it("sends a batch's statements to the writer thread as one message, whatever their number", async () => {
    const storage = await opened((await freshDatabase('sqlite')).url);
    try {
      const before = storage.writeCount!();
      const counts = await storage.db.transaction().execute((trx) => runWrites(trx, 'sqlite', writes()));
      expect(counts).toEqual([0, 45]);
      // Each message counts twice (sent, answered): begin, the statement list, commit.
      expect(storage.writeCount!() - before).toBe(6);
    } finally {
      await storage.close();
    }
  });

  it('runs the same batch on an in-memory database, where one connection does everything', async () => {
    const storage = await opened('sqlite::memory:');
    try {
      const counts = await storage.db.transaction().execute((trx) => runWrites(trx, 'sqlite', writes()));
      expect(counts).toEqual([0, 45]);
      const { rows: done } = await sql<{ n: number }>`select count(*) as n from batch_items where status = 'done'`.execute(storage.db);
      expect(Number(done[0]!.n)).toBe(45);
    } finally {
      await storage.close();
    }
  });
});

describe('runWrites on SQLite, a statement that fails', () => {
  it('ends the list with its own error, and the transaction writes nothing of the batch', async () => {
    const storage = openStorage((await freshDatabase('sqlite')).url, { poolSize: 1 });
    try {
      await sql`create table batch_items (id text primary key, status text not null, amount bigint not null)`.execute(storage.db);
      await sql`insert into batch_items (id, status, amount) values ('taken', 'active', 1)`.execute(storage.db);
      const fresh = [{ id: 'a', status: 'active', amount: 2n }];
      const batch = storage.db.transaction().execute((trx) =>
        runWrites(trx, 'sqlite', [
          { insert: 'batch_items' as never, rows: fresh },
          { insert: 'batch_items' as never, rows: [{ id: 'taken', status: 'active', amount: 3n }] },
          { update: 'batch_items' as never, key: ['id'], rows: [{ id: 'taken', status: 'done' }], counted: true },
        ]),
      );
      await expect(batch).rejects.toMatchObject({ code: 'SQLITE_CONSTRAINT_PRIMARYKEY' });
      const { rows } = await sql<{ id: string; status: string }>`select id, status from batch_items order by id`.execute(storage.db);
      expect(rows).toEqual([{ id: 'taken', status: 'active' }]);
    } finally {
      await storage.close();
    }
  });
});
