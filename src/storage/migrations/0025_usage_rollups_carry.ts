/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Usage rollup sums exact at any size (decision 0042): every sum but the count of requests gets a
 * `<sum>_carry` column, how many 10^18 the total holds beyond its own column (null for none), and
 * writers carry into it (storage/exact-sum.ts). A stored sum already at or past 10^18 moves that
 * part into its carry here. On SQLite, where an overflowing sum was stored as a float, such a
 * value becomes integers again, as exact as the float still was (PostgreSQL refused those writes).
 */
import { PostgresAdapter, sql, type Kysely } from 'kysely';

const TABLES = ['usage_rollups', 'usage_rollups_by_metadata', 'usage_rollups_grouped', 'usage_rollups_by_day'];
const CARRIED = ['tokens', 'usage_cost', 'fee', 'service_charge', 'request_cost', 'wallet_cost', 'merchant_cost'];
const CARRY = '1000000000000000000';

export async function up(db: Kysely<unknown>): Promise<void> {
  const sqlite = !(db.getExecutor().adapter instanceof PostgresAdapter);
  for (const table of TABLES) {
    for (const column of CARRIED) await db.schema.alterTable(table).addColumn(`${column}_carry`, 'bigint').execute();
    // The same SQL on both engines: integer division truncates; on a float it does not, so it is cast.
    const set = CARRIED.flatMap((c) => [
      `${c}_carry = nullif(cast(${c} / ${CARRY} as bigint), 0)`,
      `${c} = cast(${c} - cast(${c} / ${CARRY} as bigint) * ${CARRY} as bigint)`,
    ]);
    const outside = CARRIED.map((c) => `${c} >= ${CARRY} or ${c} <= -${CARRY}${sqlite ? ` or typeof(${c}) = 'real'` : ''}`);
    await sql.raw(`update ${table} set ${set.join(', ')} where ${outside.join(' or ')}`).execute(db);
  }
}
