/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Commerce: plans with their credit bundles and linked meters, subscriptions, saved payment
 * methods, payments made through a payment provider, checkout sessions, and the provider events
 * already processed (so an event delivered twice is applied once).
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('plans')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('period_amount', 'bigint', (c) => c.notNull().check(sql`period_amount >= 0`))
    .addColumn('included_credit', 'bigint', (c) => c.notNull().check(sql`included_credit >= 0`))
    .addColumn('billing_interval', 'text', (c) => c.notNull())
    .addColumn('rollover_type', 'text', (c) => c.notNull())
    .addColumn('bundle_rollover_type', 'text', (c) => c.notNull())
    .addColumn('default_auto_top_up_bundle_id', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('deleted_at', 'text')
    .execute();
  await db.schema.createIndex('plans_merchant_idx').on('plans').columns(['merchant_id', 'id']).execute();

  await db.schema
    .createTable('plan_meters')
    .addColumn('plan_id', 'text', (c) => c.notNull().references('plans.id'))
    .addColumn('meter_id', 'text', (c) => c.notNull().references('meters.id'))
    .addPrimaryKeyConstraint('plan_meters_pk', ['plan_id', 'meter_id'])
    .execute();
  await db.schema.createIndex('plan_meters_meter_idx').on('plan_meters').column('meter_id').execute();

  await db.schema
    .createTable('credit_bundles')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('plan_id', 'text', (c) => c.notNull().references('plans.id'))
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('cost', 'bigint', (c) => c.notNull().check(sql`cost >= 0`))
    .addColumn('credit_amount', 'bigint', (c) => c.notNull().check(sql`credit_amount > 0`))
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('deleted_at', 'text')
    .execute();
  await db.schema.createIndex('credit_bundles_merchant_idx').on('credit_bundles').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('credit_bundles_plan_idx').on('credit_bundles').columns(['plan_id', 'id']).execute();

  await db.schema
    .createTable('payment_methods')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('connection_id', 'text', (c) => c.notNull().references('connections.id'))
    .addColumn('provider', 'text', (c) => c.notNull())
    // The provider's own handle of the saved method (a Stripe pm_…, a test-card token).
    .addColumn('provider_ref', 'text', (c) => c.notNull())
    .addColumn('provider_customer_ref', 'text')
    .addColumn('label', 'text', (c) => c.notNull())
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('payment_methods_connection_idx').on('payment_methods').columns(['connection_id', 'id']).execute();

  await db.schema
    .createTable('subscriptions')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('connection_id', 'text', (c) => c.notNull().references('connections.id'))
    .addColumn('plan_id', 'text', (c) => c.notNull().references('plans.id'))
    // active | past_due | cancelled
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('auto_top_up_bundle_id', 'text')
    .addColumn('started_at', 'text', (c) => c.notNull())
    .addColumn('cancelled_at', 'text')
    .addColumn('cycle_start_at', 'text', (c) => c.notNull())
    .addColumn('cycle_end_at', 'text', (c) => c.notNull())
    // A plan change or a cancellation that takes effect at cycle_end_at.
    .addColumn('pending_plan_id', 'text')
    .addColumn('cancel_at_cycle_end', 'integer', (c) => c.notNull().defaultTo(0))
    // Renewal bookkeeping: the instance renewing a subscription claims it until this time.
    .addColumn('claimed_until', 'text')
    .addColumn('failed_attempts', 'integer', (c) => c.notNull().defaultTo(0))
    .addColumn('next_attempt_at', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('subscriptions_merchant_idx').on('subscriptions').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('subscriptions_due_idx').on('subscriptions').columns(['status', 'cycle_end_at']).execute();
  // A customer has at most one live subscription.
  await db.schema
    .createIndex('subscriptions_live_uq')
    .unique()
    .on('subscriptions')
    .column('connection_id')
    .where(sql<boolean>`status <> 'cancelled'`)
    .execute();

  await db.schema
    .createTable('payments')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('connection_id', 'text')
    .addColumn('provider', 'text', (c) => c.notNull())
    .addColumn('provider_ref', 'text')
    // checkout | renewal | auto_top_up
    .addColumn('purpose', 'text', (c) => c.notNull())
    // What the payment is for, unique per purpose: a checkout session, a subscription cycle.
    .addColumn('reference', 'text', (c) => c.notNull())
    .addColumn('amount', 'bigint', (c) => c.notNull().check(sql`amount >= 0`))
    // pending | requires_action | succeeded | failed
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('failure_reason', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('updated_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('payments_reference_uq').unique().on('payments').columns(['purpose', 'reference']).execute();
  await db.schema.createIndex('payments_provider_ref_idx').on('payments').columns(['provider', 'provider_ref']).execute();

  await db.schema
    .createTable('checkout_sessions')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('mode', 'text', (c) => c.notNull())
    .addColumn('origin_url', 'text', (c) => c.notNull())
    .addColumn('reference_id', 'text')
    .addColumn('connection_id', 'text')
    .addColumn('plan_id', 'text')
    .addColumn('credit_bundle_id', 'text')
    .addColumn('subscription_id', 'text')
    .addColumn('token_hash', 'text', (c) => c.notNull())
    .addColumn('expires_at', 'text', (c) => c.notNull())
    .addColumn('completed_at', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('checkout_sessions_token_uq').unique().on('checkout_sessions').column('token_hash').execute();
  await db.schema.createIndex('checkout_sessions_merchant_idx').on('checkout_sessions').columns(['merchant_id', 'id']).execute();

  await db.schema
    .createTable('provider_events')
    .addColumn('provider', 'text', (c) => c.notNull())
    .addColumn('event_id', 'text', (c) => c.notNull())
    .addColumn('type', 'text', (c) => c.notNull())
    .addColumn('received_at', 'text', (c) => c.notNull())
    .addPrimaryKeyConstraint('provider_events_pk', ['provider', 'event_id'])
    .execute();
}
