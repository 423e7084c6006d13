import { CompiledQuery, sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStorage, prepared, type Storage } from '../../src/storage/db.ts';
import { inPipelinedTransaction } from '../../src/storage/pipelined-transaction.ts';
import { databasesUnderTest, freshDatabase } from '../helpers/databases.ts';

/**
 * PostgreSQL plumbing of decision 0012: texts marked `prepared` stay prepared on their connection,
 * and a pipelined transaction commits only when its last statement succeeded.
 */
describe.runIf(databasesUnderTest().includes('postgres'))('PostgreSQL statements', () => {
  let storage: Storage;

  beforeAll(async () => {
    storage = openStorage((await freshDatabase('postgres')).url, { poolSize: 1 });
    await sql`create table pipelined_rows (id int primary key)`.execute(storage.db);
  });
  afterAll(async () => {
    await storage?.close();
  });

  const preparedOnConnection = (text: string) =>
    sql<{ n: string }>`select count(*)::text as n from pg_prepared_statements where statement = ${text}`.execute(storage.db);

  it('a text marked prepared is parsed once on its connection and reused; an unmarked one is not kept', async () => {
    const text = prepared('select $1::int + 1 as next');
    const first = await storage.db.executeQuery<{ next: number }>(CompiledQuery.raw(text, [1]));
    const second = await storage.db.executeQuery<{ next: number }>(CompiledQuery.raw(text, [41]));
    expect([first.rows[0]!.next, second.rows[0]!.next]).toEqual([2, 42]);
    expect((await preparedOnConnection(text)).rows[0]!.n).toBe('1');

    const plain = 'select $1::int + 2 as next';
    await storage.db.executeQuery(CompiledQuery.raw(plain, [1]));
    expect((await preparedOnConnection(plain)).rows[0]!.n).toBe('0');
  });

  it('a pipelined transaction commits when its last statement succeeds and writes nothing when it fails', async () => {
    const insert = { text: prepared('insert into pipelined_rows (id) select unnest($1::int[])'), values: [[1, 2]] };
    await inPipelinedTransaction(storage.pipeline!, async (trx) => {
      await trx.begin('select 1', []);
      await trx.commit(insert);
    });
    const failing = { text: insert.text, values: [[3, 1]] }; // 1 is taken: the statement fails
    await expect(
      inPipelinedTransaction(storage.pipeline!, async (trx) => {
        await trx.begin('insert into pipelined_rows (id) values (4)', []);
        await trx.commit(failing);
      }),
    ).rejects.toThrow(/duplicate key/);
    const ids = await sql<{ id: number }>`select id from pipelined_rows order by id`.execute(storage.db);
    expect(ids.rows.map((r) => r.id)).toEqual([1, 2]);
  });
});

describe.runIf(databasesUnderTest().includes('postgres'))('PostgreSQL session settings', () => {
  const jitOf = async (db: Storage['db']) => (await sql<{ jit: string }>`show jit`.execute(db)).rows[0]!.jit;

  it('every connection of the app runs with jit off, from its first statement', async () => {
    const storage = openStorage((await freshDatabase('postgres')).url, { poolSize: 3 });
    try {
      // Three connections at once, each asked on its first statement.
      const answers = await Promise.all([1, 2, 3].map(() => storage.db.connection().execute(jitOf)));
      expect(answers).toEqual(['off', 'off', 'off']);
    } finally {
      await storage.close();
    }
  });

  it('keeps options the URL gives and still turns jit off', async () => {
    const url = new URL((await freshDatabase('postgres')).url);
    url.searchParams.set('options', '-c statement_timeout=12345');
    const storage = openStorage(url.toString(), { poolSize: 1 });
    try {
      expect(await jitOf(storage.db)).toBe('off');
      expect((await sql<{ statement_timeout: string }>`show statement_timeout`.execute(storage.db)).rows[0]!.statement_timeout).toBe('12345ms');
    } finally {
      await storage.close();
    }
  });
});
