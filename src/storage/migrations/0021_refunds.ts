/**
 * FROZEN: a migration that has shipped is never edited. Add a new file instead.
 * Refunds of payments (one row per refund, written before the provider is asked, its id the
 * provider's idempotency key), the merchant's list of payments, and the reconciliation's search
 * for payments whose outcome was never recorded.
 */
import { sql, type Kysely } from 'kysely';

export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema
    .createTable('refunds')
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('merchant_id', 'text', (c) => c.notNull().references('merchants.id'))
    .addColumn('payment_id', 'text', (c) => c.notNull().references('payments.id'))
    // The money given back to the customer.
    .addColumn('amount', 'bigint', (c) => c.notNull().check(sql`amount > 0`))
    // The credit taken back from the wallet for it (zero for a payment that was never credited).
    .addColumn('credit_amount', 'bigint', (c) => c.notNull().check(sql`credit_amount >= 0`))
    .addColumn('wallet_id', 'text')
    // prepaid | bundle: the bucket the credit is taken back from
    .addColumn('bucket', 'text')
    .addColumn('provider_ref', 'text')
    // pending | succeeded | failed
    .addColumn('status', 'text', (c) => c.notNull())
    .addColumn('reason', 'text')
    .addColumn('failure_reason', 'text')
    .addColumn('created_at', 'text', (c) => c.notNull())
    .addColumn('updated_at', 'text', (c) => c.notNull())
    .execute();
  await db.schema.createIndex('refunds_payment_idx').on('refunds').columns(['payment_id', 'id']).execute();
  await db.schema.createIndex('refunds_merchant_status_idx').on('refunds').columns(['merchant_id', 'status']).execute();
  await db.schema.createIndex('payments_merchant_idx').on('payments').columns(['merchant_id', 'id']).execute();
  await db.schema.createIndex('payments_status_created_idx').on('payments').columns(['status', 'created_at']).execute();
}
