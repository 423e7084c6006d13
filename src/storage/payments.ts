import type { Kysely, Transaction } from 'kysely';
import { exactSumColumns, exactSumOf } from './exact-sum.ts';
import type { Database, PaymentsTable, RefundsTable } from './schema.ts';

/**
 * A merchant's payment by id, its refunds, and the refund rows' writes. Payments are written by
 * the commerce flows through storage/subscriptions.ts (insertPayment, transitionPayment) and
 * listed through storage/payment-reports.ts.
 */
export type RefundRow = RefundsTable;
type Db = Kysely<Database> | Transaction<Database>;

export async function findMerchantPayment(db: Db, merchantId: string, id: string): Promise<PaymentsTable | undefined> {
  return db.selectFrom('payments').selectAll().where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
}

/** A payment's refunds, oldest first. */
export async function refundsOf(db: Db, paymentId: string): Promise<RefundRow[]> {
  return db.selectFrom('refunds').selectAll().where('payment_id', '=', paymentId).orderBy('id').execute();
}

/** What the payments' refunds that are not refused add up to (pending ones count: their money may be on its way back). */
export async function refundedAmounts(db: Db, paymentIds: string[]): Promise<Map<string, bigint>> {
  if (paymentIds.length === 0) return new Map();
  const rows = await db
    .selectFrom('refunds')
    .select(['payment_id', ...exactSumColumns('amount', 'total')])
    .where('payment_id', 'in', paymentIds)
    .where('status', '<>', 'failed')
    .groupBy('payment_id')
    .execute();
  return new Map(rows.map((r) => [r.payment_id, exactSumOf(r, 'total')]));
}

export async function insertRefund(db: Db, row: RefundRow): Promise<void> {
  await db.insertInto('refunds').values(row).execute();
}

/** Moves a pending refund to its outcome, once: false when another caller settled it first. */
export async function settleRefundRow(db: Db, id: string, to: Pick<RefundRow, 'status' | 'provider_ref' | 'failure_reason' | 'updated_at'>): Promise<boolean> {
  const result = await db.updateTable('refunds').set(to).where('id', '=', id).where('status', '=', 'pending').executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}
