import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { jsonRows } from '../../src/storage/batch-write.ts';

/** What PostgreSQL's json_populate_recordset receives: every row with the first row's columns. */
const withFirstRowsColumns = (rows: Record<string, unknown>[]) =>
  rows.map((row) => Object.fromEntries(Object.keys(rows[0]!).map((column) => [column, row[column] ?? null])));

/** The rows as JSON.stringify writes them with bigints as text: what jsonRows must equal. */
const withBigintsAsText = (rows: object[]) => JSON.stringify(rows, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));

describe('jsonRows (the rows of a PostgreSQL batch write as one JSON parameter)', () => {
  const bigint = fc.bigInt({ min: -(2n ** 80n), max: 2n ** 80n });
  const value = fc.oneof(
    fc.string({ unit: 'binary' }),
    bigint,
    fc.double(),
    fc.integer(),
    fc.boolean(),
    fc.constant(null),
    fc.constant(undefined),
    // Not written today, but taken: an object or array, bigints inside it as text too.
    fc.dictionary(fc.string(), fc.oneof(bigint, fc.string()), { maxKeys: 3 }),
    fc.array(bigint, { maxLength: 3 }),
  );
  const columns = fc.uniqueArray(fc.string({ unit: 'binary', minLength: 1, maxLength: 12 }), { minLength: 1, maxLength: 8 });

  it('is valid JSON holding every row in the first row’s columns, bigints (also inside objects) as exact decimal strings, a missing value as null', () => {
    fc.assert(
      fc.property(
        columns.chain((names) => fc.array(fc.array(value, { minLength: names.length, maxLength: names.length }), { minLength: 1, maxLength: 6 }).map((values) => ({ names, values }))),
        ({ names, values }) => {
          const rows = values.map((row) => Object.fromEntries(names.map((name, i) => [name, row[i]])));
          expect(JSON.parse(jsonRows(rows))).toEqual(JSON.parse(withBigintsAsText(withFirstRowsColumns(rows))));
        },
      ),
    );
  });

  it('writes a row missing one of the first row’s columns with that column null, and ignores columns the first row lacks', () => {
    const rows = [{ id: 'a', amount: 12345678901234567890n }, { id: 'b', note: 'x' }];
    expect(JSON.parse(jsonRows(rows))).toEqual([
      { id: 'a', amount: '12345678901234567890' },
      { id: 'b', amount: null },
    ]);
  });

  it('writes no rows as an empty array', () => {
    expect(jsonRows([])).toBe('[]');
  });
});
