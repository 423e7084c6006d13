/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * A request record keeps how many of its input tokens were read from, or written to, the
 * provider's prompt cache: they are priced differently, so the record shows what its cost
 * was computed from. Both are parts of input_tokens; 0 for records written before.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('requests').addColumn('cached_input_tokens', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
  await db.schema.alterTable('requests').addColumn('cache_write_input_tokens', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
}
