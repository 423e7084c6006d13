import { sql, type AliasedRawBuilder } from 'kysely';

/**
 * A sum of a money column that no number of rows can overflow. SQLite's SUM of integers fails
 * with "integer overflow" once a running total passes 2^63 (PostgreSQL's would not, it sums
 * BIGINT as NUMERIC, but both engines take the same query). So each amount is split into a high
 * part (amount / 10^9) and a low part (amount % 10^9); both engines divide toward zero and give the
 * remainder the amount's sign, so amount = high * 10^9 + low exactly. Each part is below 10^10
 * in size: their sums stay exact for about a billion rows, and the caller joins them as a bigint.
 */
const SPLIT = 1_000_000_000n;

export function exactSumColumns<A extends string>(column: string, alias: A): [AliasedRawBuilder<unknown, `${A}_high`>, AliasedRawBuilder<unknown, `${A}_low`>] {
  return [
    sql<unknown>`sum(${sql.ref(column)} / ${sql.lit(Number(SPLIT))})`.as(`${alias}_high`),
    sql<unknown>`sum(${sql.ref(column)} % ${sql.lit(Number(SPLIT))})`.as(`${alias}_low`),
  ];
}

/** The bigint total of the two parts exactSumColumns selected (0 for a group with no rows). */
export function exactSumOf<A extends string>(row: Record<`${A}_high` | `${A}_low`, unknown>, alias: A): bigint {
  return partOf(row[`${alias}_high`]) * SPLIT + partOf(row[`${alias}_low`]);
}

function partOf(value: unknown): bigint {
  if (value === null || value === undefined) return 0n;
  if (typeof value === 'bigint') return value;
  // PostgreSQL answers NUMERIC as text; SQLite answers an integer.
  return BigInt(String(value));
}
