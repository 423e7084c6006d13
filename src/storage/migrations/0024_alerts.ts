/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Alert rules (a customer's low balance, a customer's or spend key's spend in a period) and their
 * firings: the background alert round reads the enabled rules in id order and writes a firing row
 * with the webhook event each time a rule's threshold is crossed (decision 0043).
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('alerts')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    // low_balance | spend_threshold
    .addColumn('kind', 'text', (c) => c.notNull())
    // Exactly one subject: a customer, or (spend_threshold only) a spend key.
    .addColumn('connection_id', 'text')
    .addColumn('spend_key_id', 'text')
    .addColumn('threshold', 'bigint', (c) => c.notNull().check(sql`threshold > 0`))
    // day | month | total for spend_threshold; null for low_balance
    .addColumn('period', 'text')
    .addColumn('enabled', 'integer', (c) => c.notNull())
    // The crossing that fired and has not re-armed yet: when, and for spend the period it fired in.
    .addColumn('fired_at', 'text')
    .addColumn('fired_period', 'text')
    // A spend key's lifetime spend when the round first saw the current period (see decision 0043).
    .addColumn('baseline_period', 'text')
    .addColumn('baseline_spend', 'bigint')
    // Bumped by every change of the rule or its state: the round's writes compare and set on it.
    .addColumn('revision', 'integer', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('updated_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('alerts_merchant_idx').on('alerts').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('alerts_enabled_idx').on('alerts').columns(['enabled', 'id']).execute();

  await db.schema
    .createTable('alert_firings')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('alert_id', 'text', (c) => c.notNull())
    // The balance or the period's spend the round read, and the threshold it crossed.
    .addColumn('value', 'bigint', (c) => c.notNull())
    .addColumn('threshold', 'bigint', (c) => c.notNull())
    .addColumn('period_start', 'text')
    .addColumn('event_id', 'text', (c) => c.notNull())
    .addColumn('fired_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('alert_firings_merchant_idx').on('alert_firings').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('alert_firings_alert_idx').on('alert_firings').columns(['alert_id', 'id']).execute();
}
