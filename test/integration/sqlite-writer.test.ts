import { sql, type Kysely } from 'kysely';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GroupCommitWriter, type BatchJob } from '../../src/ledger/group-commit.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { WriterThreadDied } from '../../src/storage/sqlite-writer.ts';
import { freshDatabase } from '../helpers/databases.ts';

/**
 * A SQLite database file is written by a worker thread (decision 0011, "Writes off the event
 * loop"): reads stay on the thread that serves requests, every write, transaction and checkpoint
 * goes to the writer thread. These prove what the rest of the code relies on.
 */

type Scratch = { notes: { id: number; body: string } };

let storage: Storage;
let deaths: Error[];
const db = () => storage.db as unknown as Kysely<Scratch>;
const count = async () => Number((await sql<{ n: bigint }>`select count(*) as n from notes`.execute(db())).rows[0]!.n);

async function open(url?: string): Promise<Storage> {
  const database = url ?? (await freshDatabase('sqlite')).url;
  return openStorage(database, { onWriterDeath: (error) => deaths.push(error) });
}

beforeEach(async () => {
  deaths = [];
  storage = await open();
  await sql`create table notes (id integer primary key, body text not null)`.execute(db());
});
afterEach(async () => {
  await storage?.close();
});

/** Turns of the event loop taken while `work` runs. */
async function turnsDuring(work: Promise<unknown>): Promise<number> {
  let turns = 0;
  let done = false;
  const tick = (): void => {
    turns++;
    if (!done) setTimeout(tick, 1);
  };
  setTimeout(tick, 1);
  await work;
  done = true;
  return turns;
}

describe('SQLite writer thread', () => {
  it('a file database writes on its writer thread; a write, once answered, is read back at once on this thread', async () => {
    expect(storage.writer?.thread).toBeDefined();
    await db().insertInto('notes').values({ id: 1, body: 'first' }).execute();
    expect(await db().selectFrom('notes').selectAll().execute()).toEqual([{ id: 1n, body: 'first' }]);
  });

  it("the writer's connection keeps a 2 MB page cache, not better-sqlite3's 16 MB (its thread's memory)", async () => {
    const cacheSize = async (runner: Kysely<Scratch>) => (await sql<{ cache_size: bigint }>`pragma cache_size`.execute(runner)).rows[0]!.cache_size;
    // A statement inside a transaction runs on the writer's connection; a read outside one on this thread's.
    expect(await db().transaction().execute((trx) => cacheSize(trx))).toBe(-2000n);
    expect(await cacheSize(db())).toBe(-16000n);
  });

  it('reads do not wait for a transaction open on the writer, and see none of it until it commits', async () => {
    let inserted!: () => void;
    const insertedSignal = new Promise<void>((resolve) => (inserted = resolve));
    let commit!: () => void;
    const mayCommit = new Promise<void>((resolve) => (commit = resolve));
    const transaction = db()
      .transaction()
      .execute(async (trx) => {
        await trx.insertInto('notes').values({ id: 1, body: 'in a transaction' }).execute();
        inserted();
        await mayCommit;
      });
    await insertedSignal;
    expect(await count()).toBe(0);
    commit();
    await transaction;
    expect(await count()).toBe(1);
  });

  it('the event loop keeps turning while the writer runs a long statement (an in-memory database, on this thread, does not)', async () => {
    const longInsert = (target: Kysely<Scratch>) =>
      sql`insert into notes (id, body) with recursive n(i) as (select 1 union all select i + 1 from n where i < 400000) select i, 'x' || i from n`.execute(target);
    expect(await turnsDuring(longInsert(db()))).toBeGreaterThan(3);
    expect(await count()).toBe(400_000);

    const inThread = openStorage('sqlite::memory:');
    try {
      const memory = inThread.db as unknown as Kysely<Scratch>;
      await sql`create table notes (id integer primary key, body text not null)`.execute(memory);
      expect(inThread.writer).toBeUndefined();
      expect(await turnsDuring(longInsert(memory))).toBeLessThanOrEqual(1);
    } finally {
      await inThread.close();
    }
  });

  it('a unique violation on the writer thread is the same error as on this thread', async () => {
    await db().insertInto('notes').values({ id: 1, body: 'a' }).execute();
    await expect(db().insertInto('notes').values({ id: 1, body: 'b' }).execute()).rejects.toMatchObject({
      code: 'SQLITE_CONSTRAINT_PRIMARYKEY',
      name: 'SqliteError',
    });
  });

  it('a transaction its owner left open is rolled back when the connection is let go, and does not take in the next writes', async () => {
    await db()
      .connection()
      .execute(async (conn) => {
        await sql`begin immediate`.execute(conn);
        await conn.insertInto('notes').values({ id: 1, body: 'abandoned' }).execute();
      });
    await db().insertInto('notes').values({ id: 2, body: 'next' }).execute();
    expect(await db().selectFrom('notes').select('id').execute()).toEqual([{ id: 2n }]);
  });

  it('closing waits for every write in flight or waiting for the writer: none is lost', async () => {
    const url = storage.describe;
    const writes = Array.from({ length: 200 }, (_, i) => db().insertInto('notes').values({ id: i, body: `n${i}` }).execute());
    // The first is answered; the others are on the writer thread or waiting for their turn.
    await writes[0];
    await storage.close();
    await Promise.all(writes);
    storage = await open(url);
    expect(await count()).toBe(200);
  });

  it('a writer thread that dies fails the transaction it was in (nothing of it committed), is reported, and the next write starts a new thread', async () => {
    const first = storage.writer!.thread;
    await db().insertInto('notes').values({ id: 1, body: 'before' }).execute();
    const transaction = db()
      .transaction()
      .execute(async (trx) => {
        await trx.insertInto('notes').values({ id: 2, body: 'lost with the thread' }).execute();
        await storage.writer!.thread!.terminate();
        await trx.insertInto('notes').values({ id: 3, body: 'after the death' }).execute();
      });
    await expect(transaction).rejects.toThrow(/writer thread died/);
    expect(deaths).toHaveLength(1);
    expect(deaths[0]).toBeInstanceOf(WriterThreadDied);

    await db().insertInto('notes').values({ id: 4, body: 'on the new thread' }).execute();
    expect(storage.writer!.thread).not.toBe(first);
    expect(await db().selectFrom('notes').select('id').orderBy('id').execute()).toEqual([{ id: 1n }, { id: 4n }]);
  });

  it('a group-commit batch whose writer thread dies is written again, member by member, on the new thread: nothing lost, nothing twice', async () => {
    const writer = new GroupCommitWriter(storage);
    let killed = false;
    const job: BatchJob<number, number> = {
      order: 0,
      locks: () => ({}),
      inTransaction: async (trx, _dialect, ids) => {
        for (const id of ids) {
          await (trx as unknown as Kysely<Scratch>).insertInto('notes').values({ id, body: 'batched' }).execute();
          if (!killed) {
            killed = true;
            await storage.writer!.thread!.terminate();
          }
        }
        return ids;
      },
      alone: async (s, id) => {
        await (s.db as unknown as Kysely<Scratch>).insertInto('notes').values({ id, body: 'alone' }).execute();
        return id;
      },
    };
    expect(await Promise.all([1, 2, 3].map((id) => writer.run(job, id)))).toEqual([1, 2, 3]);
    expect(await db().selectFrom('notes').selectAll().orderBy('id').execute()).toEqual([
      { id: 1n, body: 'alone' },
      { id: 2n, body: 'alone' },
      { id: 3n, body: 'alone' },
    ]);
    expect(deaths).toHaveLength(1);
  });
});
