import { describe, expect, it, vi } from 'vitest';
import { GroupCommitWriter, type BatchJob } from '../../src/ledger/group-commit.ts';
import { useTestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * The gateway's group-commit writer, its batching: work handed in together is written together, a
 * failing batch runs each member alone, work that may wait waits for more, and a backlog makes
 * producers wait for room.
 */

/**
 * A job that records each batch it is given and holds the first one until `release()`, so a test
 * can queue work behind a batch being written. `waitMs` makes it work that may wait.
 */
function jobHoldingFirstBatch<T>(waitMs?: number) {
  const batches: T[][] = [];
  let release!: () => void;
  const firstBatchHeld = new Promise<void>((r) => (release = r));
  const job: BatchJob<T, T> = {
    order: 0,
    locks: () => ({}),
    waitMs,
    inTransaction: async (_trx, _dialect, inputs) => {
      batches.push(inputs);
      if (batches.length === 1) await firstBatchHeld;
      return inputs;
    },
    alone: async (_storage, input) => input,
  };
  return { job, batches, release };
}

describe.each(databasesUnderTest())('gateway writer on %s', (dialect) => {
  const t = useTestApp(dialect);

  it('work handed in together runs in one batch; a failing batch runs each member alone', async () => {
    const writer = new GroupCommitWriter(t.storage);
    const batches: string[][] = [];
    const job: BatchJob<string, string> = {
      order: 0,
      locks: () => ({}),
      inTransaction: async (_trx, _dialect, inputs) => {
        batches.push(inputs);
        if (inputs.includes('bad')) throw new Error('one bad member');
        return inputs.map((i) => `batched ${i}`);
      },
      alone: async (_storage, input) => {
        if (input === 'bad') throw new Error('bad alone');
        return `alone ${input}`;
      },
    };
    expect(await Promise.all(['a', 'b', 'c'].map((i) => writer.run(job, i)))).toEqual(['batched a', 'batched b', 'batched c']);
    expect(batches).toEqual([['a', 'b', 'c']]);

    const outcomes = await Promise.allSettled(['d', 'bad', 'e'].map((i) => writer.run(job, i)));
    expect(outcomes.map((o) => (o.status === 'fulfilled' ? o.value : (o.reason as Error).message))).toEqual([
      'alone d',
      'bad alone',
      'alone e',
    ]);
    await writer.drain();
  });

  it('work that may wait, queued while a batch is written, waits for more to join it instead of following at once', async () => {
    const writer = new GroupCommitWriter(t.storage);
    const { job: lazy, batches, release } = jobHoldingFirstBatch<string>(1000);
    const eager: BatchJob<string, string> = { ...lazy, waitMs: undefined };
    const first = writer.run(eager, 'a');
    await vi.waitFor(() => expect(batches).toEqual([['a']]));
    const second = writer.run(lazy, 'b');
    release();
    await first;
    // 'b' came while 'a' was written: it waits, and 'c', handed in well after 'a' was done, joins it.
    await new Promise((r) => setTimeout(r, 50));
    const third = writer.run(lazy, 'c');
    expect(await Promise.all([second, third])).toEqual(['b', 'c']);
    expect(batches).toEqual([['a'], ['b', 'c']]);

    // A drain does not wait: what is queued is written at once.
    const started = Date.now();
    const fourth = writer.run(lazy, 'd');
    await writer.drain();
    expect(await fourth).toBe('d');
    expect(Date.now() - started).toBeLessThan(900);
  });

  it.each([
    { maxBatch: undefined, full: 64 },
    { maxBatch: 256, full: 256 },
  ])('a full batch ($full) of work that may wait goes at once, so a backlog cannot build up while the writer waits', async ({ maxBatch, full }) => {
    const writer = new GroupCommitWriter(t.storage, undefined, { maxBatch });
    const { job: lazy, batches, release } = jobHoldingFirstBatch<number>(10_000);
    const sizes = () => batches.map((b) => b.length);
    const first = writer.run({ ...lazy, waitMs: undefined }, 0);
    await vi.waitFor(() => expect(sizes()).toEqual([1]));
    // A full batch and more arrive while the first batch is written.
    const total = full + 6;
    const backlog = Array.from({ length: total }, (_, i) => writer.run(lazy, i + 1));
    release();
    await first;
    const written = Promise.all(backlog.slice(0, full)).then(() => 'written');
    expect(await Promise.race([written, new Promise((r) => setTimeout(() => r('still waiting'), 3_000))])).toBe('written');
    expect(sizes().slice(0, 2)).toEqual([1, full]);
    await writer.drain();
    expect(await Promise.all(backlog)).toEqual(Array.from({ length: total }, (_, i) => i + 1));
  });

  it('past four full batches queued, new work is told to wait for room, until a batch takes the queue below that', async () => {
    const writer = new GroupCommitWriter(t.storage, undefined, { maxBatch: 2 });
    const { job, batches, release } = jobHoldingFirstBatch<number>();
    const first = writer.run(job, 0);
    await vi.waitFor(() => expect(batches).toEqual([[0]]));
    // Seven queued behind the held batch: below 4 × 2, so no producer waits.
    const queued = Array.from({ length: 7 }, (_, i) => writer.run(job, i + 1));
    expect(writer.room()).toBeUndefined();
    queued.push(writer.run(job, 8));
    const room = writer.room();
    expect(room).toBeInstanceOf(Promise);
    let roomMade = false;
    void room!.then(() => (roomMade = true));
    await new Promise((r) => setTimeout(r, 50));
    expect(roomMade).toBe(false);

    release();
    await first;
    await vi.waitFor(() => expect(roomMade).toBe(true));
    expect(await Promise.all(queued)).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(writer.room()).toBeUndefined();
    await writer.drain();
  });
});
