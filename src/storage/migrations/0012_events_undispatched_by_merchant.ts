/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * The dispatcher fans out only the events of merchants that have webhooks (decision 0017), so the
 * index of events not yet fanned out leads with the merchant.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.dropIndex('events_undispatched_idx').execute();
  await db.schema
    .createIndex('events_undispatched_by_merchant_idx')
    .on('events')
    .columns(['merchant_id', 'id'])
    .where(sql.ref('dispatched_at'), 'is', null)
    .execute();
}
