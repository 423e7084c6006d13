import { sql, type AliasedRawBuilder, type RawBuilder } from 'kysely';

/**
 * A sum of a money column that no number of rows can overflow. SQLite's SUM of integers fails
 * with "integer overflow" once a running total passes 2^63 (PostgreSQL's would not, it sums
 * BIGINT as NUMERIC, but both engines take the same query). So each amount is split into a high
 * part (amount / 10^9) and a low part (amount % 10^9); both engines divide toward zero and give the
 * remainder the amount's sign, so amount = high * 10^9 + low exactly. Each part is below 10^10
 * in size: their sums stay exact for about a billion rows, and the caller joins them as a bigint.
 */
const SPLIT = 1_000_000_000n;

type Summed = string | RawBuilder<unknown>;
const expressionOf = (summed: Summed) => (typeof summed === 'string' ? sql.ref(summed) : summed);

/** The two parts of the sum of a column (by name) or of an expression, as `<alias>_high` and `<alias>_low`. */
export function exactSumColumns<A extends string>(summed: Summed, alias: A): [AliasedRawBuilder<unknown, `${A}_high`>, AliasedRawBuilder<unknown, `${A}_low`>] {
  const e = expressionOf(summed);
  return [sql<unknown>`sum(${e} / ${sql.lit(Number(SPLIT))})`.as(`${alias}_high`), sql<unknown>`sum(${e} % ${sql.lit(Number(SPLIT))})`.as(`${alias}_low`)];
}

/**
 * The same sum for ORDER BY: exact on PostgreSQL (NUMERIC throughout), a double on SQLite, which
 * orders totals correctly to 15 significant digits and never overflows.
 */
export function exactSumForOrdering(summed: Summed): RawBuilder<unknown> {
  const e = expressionOf(summed);
  return sql`sum(${e} / ${sql.lit(Number(SPLIT))}) + sum(${e} % ${sql.lit(Number(SPLIT))}) / 1e9`;
}

/** The bigint total of the two parts exactSumColumns selected (0 for a group with no rows). */
export function exactSumOf(row: object, alias: string): bigint {
  const parts = row as Record<string, unknown>;
  return partOf(parts[`${alias}_high`]) * SPLIT + partOf(parts[`${alias}_low`]);
}

function partOf(value: unknown): bigint {
  if (value === null || value === undefined) return 0n;
  if (typeof value === 'bigint') return value;
  // PostgreSQL answers NUMERIC as text; SQLite answers an integer.
  return BigInt(String(value));
}
