/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * A subscription's cycles are counted from an anchor: when it started, or when a plan change gave
 * it another billing interval (a monthly cycle keeps the anchor's day of the month).
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('subscriptions').addColumn('cycle_anchor_at', 'text').execute();
  await sql`update subscriptions set cycle_anchor_at = started_at`.execute(db);
}
