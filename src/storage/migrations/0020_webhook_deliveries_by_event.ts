/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * The deliveries of one event, for pruning delivered events after the retention period: the
 * (webhook_id, event_id) index cannot find them by event alone.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.createIndex('webhook_deliveries_by_event_idx').on('webhook_deliveries').column('event_id').execute();
}
