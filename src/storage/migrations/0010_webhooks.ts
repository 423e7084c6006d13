/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Webhook endpoints and their deliveries (decision 0017). Events already exist (0002); each gains
 * `dispatched_at`, set once the dispatcher has made the event's deliveries, so a partial index
 * finds the events still to fan out without a scan.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('webhooks')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull())
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('url', 'text', (c) => c.notNull())
    // JSON array of the event names the merchant chose, or null for every event.
    .addColumn('events', 'text')
    .addColumn('secret', 'text', (c) => c.notNull())
    // The secret before the last rotation signs too until previous_secret_expires_at.
    .addColumn('previous_secret', 'text')
    .addColumn('previous_secret_expires_at', 'text')
    // Start of the current run of deliveries that all failed; null after any success.
    .addColumn('failing_since', 'text')
    .addColumn('disabled_at', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('webhooks_merchant_idx').on('webhooks').columns(['merchant_id', 'id']).execute();

  await db.schema
    .createTable('webhook_deliveries')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('webhook_id', 'text', (c) => c.notNull())
    .addColumn('event_id', 'text', (c) => c.notNull())
    .addColumn('event_type', 'text', (c) => c.notNull())
    // pending (waiting for next_attempt_at; also while an attempt runs), succeeded, failed.
    .addColumn('state', 'text', (c) => c.notNull())
    .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('next_attempt_at', 'text')
    .addColumn('last_attempt_at', 'text')
    .addColumn('last_status_code', 'integer')
    .addColumn('last_error', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema
    .createIndex('webhook_deliveries_event_uq')
    .unique()
    .on('webhook_deliveries')
    .columns(['webhook_id', 'event_id'])
    .execute();
  await db.schema.createIndex('webhook_deliveries_webhook_idx').on('webhook_deliveries').columns(['webhook_id', 'id']).execute();
  await db.schema
    .createIndex('webhook_deliveries_due_idx')
    .on('webhook_deliveries')
    .columns(['next_attempt_at'])
    .where(sql.ref('state'), '=', 'pending')
    .execute();

  await db.schema.alterTable('events').addColumn('dispatched_at', 'text').execute();
  // Events written before webhooks existed had nobody to go to.
  await sql`update events set dispatched_at = created_at`.execute(db);
  await db.schema.createIndex('events_undispatched_idx').on('events').column('id').where(sql.ref('dispatched_at'), 'is', null).execute();
}
