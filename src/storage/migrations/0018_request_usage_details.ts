/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * A request record keeps the parts of its usage that are billed inside another count or by
 * another unit: the reasoning (thinking) tokens inside output_tokens, the images an image
 * generation made, and the unit its base cost was priced by (tokens, minutes of audio, images or
 * characters; null when no provider price was known). 0 and null for records written before.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('requests').addColumn('reasoning_tokens', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
  await db.schema.alterTable('requests').addColumn('output_images', 'bigint', (c) => c.notNull().defaultTo(0)).execute();
  await db.schema.alterTable('requests').addColumn('price_unit', 'text').execute();
}
