/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * What a delivery's last attempt got back, for the dashboard's delivery view: the start of the
 * receiver's answer (at most 1 KiB) and how long the exchange took.
 */
import type { Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('webhook_deliveries').addColumn('last_response_body', 'text').execute();
  await db.schema.alterTable('webhook_deliveries').addColumn('last_duration_ms', 'integer').execute();
}
