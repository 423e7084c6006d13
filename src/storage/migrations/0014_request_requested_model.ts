/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * A request record names the model the provider says it served (`model`, e.g.
 * `gpt-4o-mini-2024-07-18`); when the request named another (`gpt-4o-mini`), that name is kept
 * beside it. Null when both are the same, and for records written before.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('requests').addColumn('requested_model', 'text').execute();
}
