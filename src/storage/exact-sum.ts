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
// An expression in parentheses: `a + b` must be split as a whole.
const expressionOf = (summed: Summed) => (typeof summed === 'string' ? sql.ref(summed) : sql`(${summed})`);

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

/**
 * The bigint total of the parts exactSumColumns (or carriedSumColumns, which adds `<alias>_carry`)
 * selected: 0 for a group with no rows.
 */
export function exactSumOf(row: object, alias: string): bigint {
  const parts = row as Record<string, unknown>;
  return partOf(parts[`${alias}_carry`]) * CARRY + partOf(parts[`${alias}_high`]) * SPLIT + partOf(parts[`${alias}_low`]);
}

/**
 * A running total kept in one row (a usage rollup's sums, decision 0042) is two BIGINT columns:
 * the column itself holds the total's remainder by CARRY (always below it in size) and
 * `<column>_carry` how many CARRYs the total holds besides (NULL for none: no bytes on either
 * engine, and nearly every row has none). Adding to a row carries in SQL (carriedAddition), so no
 * column ever passes 2^63 and SQLite never turns one into a float; the total is exact at any size.
 * CARRY is the largest single amount (MAX_AMOUNT_UNITS): two remainders added stay far from 2^63.
 */
export const CARRY = 10n ** 18n;

/** The column holding how many CARRYs a carried total holds beyond its own column. */
export const carryOf = <C extends string>(column: C): `${C}_carry` => `${column}_carry`;

/** A total as the two parts a carried column stores: the remainder, and the carry (null for none). */
export function carriedParts(total: bigint): { rest: bigint; carry: bigint | null } {
  const carry = total / CARRY;
  return { rest: total % CARRY, carry: carry === 0n ? null : carry };
}

/** The total a carried column's two stored parts hold. */
export function carriedTotal(rest: unknown, carry: unknown): bigint {
  return partOf(carry) * CARRY + partOf(rest);
}

/**
 * The SET clauses of an upsert that adds the incoming row's carried total (`excluded`) to the
 * stored one, the same SQL on both engines (integer division and remainder truncate toward zero
 * on both): the remainders' sum stays under 2 × CARRY, so it never overflows, and what passes
 * CARRY moves into the carry. `q` quotes an identifier as the caller's statement does.
 */
export function carriedAddition(table: string, column: string, q: (name: string) => string = (name) => name): string[] {
  const stored = `${q(table)}.${q(column)}`;
  const added = `(${stored} + excluded.${q(column)})`;
  const carry = q(carryOf(column));
  return [
    `${q(column)} = ${added} % ${CARRY}`,
    `${carry} = nullif(coalesce(${q(table)}.${carry}, 0) + coalesce(excluded.${carry}, 0) + ${added} / ${CARRY}, 0)`,
  ];
}

/**
 * The exact sum over rows of a carried column (`<ref>` and `<ref>_carry`): exactSumColumns' two
 * parts of the column and the sum of the carries, as `<alias>_high`, `<alias>_low` and
 * `<alias>_carry`, which exactSumOf joins.
 */
export function carriedSumColumns<A extends string>(ref: string, alias: A): [...ReturnType<typeof exactSumColumns<A>>, AliasedRawBuilder<unknown, `${A}_carry`>] {
  return [...exactSumColumns(ref, alias), sql<unknown>`sum(${sql.ref(carryOf(ref))})`.as(`${alias}_carry`)];
}

/** exactSumForOrdering of a carried column: the carries count too (a double on SQLite, exact on PostgreSQL). */
export function carriedSumForOrdering(ref: string): RawBuilder<unknown> {
  // exactSumForOrdering counts in SPLITs.
  return sql`coalesce(sum(${sql.ref(carryOf(ref))}), 0) * ${sql.raw(String(CARRY / SPLIT))} + ${exactSumForOrdering(ref)}`;
}

function partOf(value: unknown): bigint {
  if (value === null || value === undefined) return 0n;
  if (typeof value === 'bigint') return value;
  // PostgreSQL answers NUMERIC as text; SQLite answers an integer.
  return BigInt(String(value));
}
