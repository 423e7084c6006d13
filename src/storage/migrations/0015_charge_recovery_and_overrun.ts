/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Reliability (decision 0019):
 * - A forwarded request's pending record keeps what its hold was estimated from (usage and
 *   costs, JSON): a request whose settlement a crash lost is charged that estimate on recovery
 *   instead of going free. Null for records written before, and for standard-endpoint records.
 * - A wallet remembers that settled charges exceeded their holds (1): it admits nothing more
 *   until the requests in flight on it have settled.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('requests').addColumn('hold_estimate', 'text').execute();
  await db.schema.alterTable('wallets').addColumn('overrun', 'integer', (c) => c.notNull().defaultTo(0)).execute();
}
