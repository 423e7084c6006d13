import { describe, expect, it } from 'vitest';
import { insertRows } from '../../src/storage/batch-write.ts';

/** The SQLite statements of a multi-row insert. */
const valuesInserts = (table: 'events', rows: object[]) => insertRows('sqlite', table, rows as never).sqlite!;

describe('insertRows on SQLite (multi-row inserts)', () => {
  it('lists each row in the columns of the first, values in the same order, a missing one as null', () => {
    const [query, ...rest] = valuesInserts('events', [
      { id: 'a', amount: 1n, note: 'x' },
      { id: 'b', amount: 2n, note: undefined },
    ]);
    expect(rest).toEqual([]);
    expect(query!.sql).toBe('insert into "events" ("id", "amount", "note") values (?, ?, ?), (?, ?, ?)');
    expect(query!.parameters).toEqual(['a', 1n, 'x', 'b', 2n, null]);
  });

  it('splits the rows into chunks of power-of-two sizes, largest first, every row once and in order', () => {
    const rows = Array.from({ length: 45 }, (_, i) => ({ id: `r${i}` }));
    const queries = valuesInserts('events', rows);
    expect(queries.map((q) => q.parameters.length)).toEqual([32, 8, 4, 1]);
    expect(queries.flatMap((q) => q.parameters)).toEqual(rows.map((r) => r.id));
  });

  it('makes one text per table, columns and chunk size, so any batch size reuses a few', () => {
    const rows = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `r${i}`, amount: 1n }));
    const texts = new Set<string>();
    for (let n = 1; n <= 64; n++) for (const q of valuesInserts('events', rows(n))) texts.add(q.sql);
    expect(texts.size).toBe(7);
    expect(valuesInserts('events', rows(2))[0]!.sql).toBe(valuesInserts('events', rows(2))[0]!.sql);
    expect(valuesInserts('events', rows(1))[0]!.sql).not.toBe(valuesInserts('events', rows(2))[0]!.sql);
  });
});
