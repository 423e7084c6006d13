/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Reliability (decision 0019): a spend key remembers that a settled charge exceeded its reservation
 * (1), as a wallet does (0015): a key with a spend limit admits nothing more until the requests
 * in flight on it have settled.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('spend_keys').addColumn('overrun', 'integer', (c) => c.notNull().defaultTo(0)).execute();
}
