import { describe, expect, it } from 'vitest';
import { valuesInsert } from '../../src/storage/batch-write.ts';

describe('valuesInsert (SQLite multi-row inserts)', () => {
  it('lists each row in the columns of the first, values in the same order, a missing one as null', () => {
    const query = valuesInsert('events', [
      { id: 'a', amount: 1n, note: 'x' },
      { id: 'b', amount: 2n, note: undefined },
    ]);
    expect(query.sql).toBe('insert into "events" ("id", "amount", "note") values (?, ?, ?), (?, ?, ?)');
    expect(query.parameters).toEqual(['a', 1n, 'x', 'b', 2n, null]);
  });

  it('makes the same text for the same table, columns and row count, and another for another count', () => {
    const one = (id: string) => ({ id, amount: 1n });
    expect(valuesInsert('events', [one('a'), one('b')]).sql).toBe(valuesInsert('events', [one('c'), one('d')]).sql);
    expect(valuesInsert('events', [one('a')]).sql).not.toBe(valuesInsert('events', [one('a'), one('b')]).sql);
  });
});
