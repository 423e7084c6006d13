import type { Storage } from './db.ts';
import { exactSumColumns, exactSumOf } from './exact-sum.ts';
import { newestFirstPage } from './pages.ts';
import type { BillingInterval, PaymentsTable, PaymentStatus } from './schema.ts';

export type PaymentPurpose = PaymentsTable['purpose'];
export type PaymentListRow = Pick<PaymentsTable, 'id' | 'connection_id' | 'provider' | 'provider_ref' | 'purpose' | 'amount' | 'status' | 'failure_reason' | 'created_at'>;

/** Which payments a report covers: created in [from, before), optionally of one purpose or status. */
export type PaymentFilters = { from?: string; before?: string; purpose?: PaymentPurpose; status?: PaymentStatus };

function filtered(storage: Storage, merchantId: string, f: PaymentFilters) {
  return storage.db
    .selectFrom('payments')
    .where('merchant_id', '=', merchantId)
    .$if(f.from !== undefined, (q) => q.where('created_at', '>=', f.from!))
    .$if(f.before !== undefined, (q) => q.where('created_at', '<', f.before!))
    .$if(f.purpose !== undefined, (q) => q.where('purpose', '=', f.purpose!))
    .$if(f.status !== undefined, (q) => q.where('status', '=', f.status!));
}

/** One page of a merchant's payments, newest first (one extra row says more exist). */
export async function listPayments(storage: Storage, merchantId: string, f: PaymentFilters, page: { cursor?: string; limit: number }): Promise<PaymentListRow[]> {
  const rows = await filtered(storage, merchantId, f)
    .select(['id', 'connection_id', 'provider', 'provider_ref', 'purpose', 'amount', 'status', 'failure_reason', 'created_at'])
    .$call((q) => newestFirstPage(q, page))
    .execute();
  return rows.map((r) => ({ ...r, amount: BigInt(r.amount) }));
}

/** The money received: succeeded payments in the range, by purpose (count and exact sum). */
export async function receivedByPurpose(storage: Storage, merchantId: string, f: Pick<PaymentFilters, 'from' | 'before'>): Promise<Map<PaymentPurpose, { count: number; amount: bigint }>> {
  const rows = await filtered(storage, merchantId, { ...f, status: 'succeeded' })
    .select((eb) => ['purpose', eb.fn.countAll<number>().as('count'), ...exactSumColumns('amount', 'amount')])
    .groupBy('purpose')
    .execute();
  return new Map(rows.map((r) => [r.purpose, { count: Number(r.count), amount: exactSumOf(r, 'amount') }]));
}

/**
 * Live subscriptions (active or past due, a pending cancellation included until it applies):
 * how many, and the sum of their plans' period prices per billing interval.
 */
export async function liveSubscriptionPrices(storage: Storage, merchantId: string): Promise<{ count: number; sums: Map<BillingInterval, bigint> }> {
  const rows = await storage.db
    .selectFrom('subscriptions')
    .innerJoin('plans', 'plans.id', 'subscriptions.plan_id')
    .where('subscriptions.merchant_id', '=', merchantId)
    .where('subscriptions.status', 'in', ['active', 'past_due'])
    .select((eb) => ['plans.billing_interval', eb.fn.countAll<number>().as('count'), ...exactSumColumns('plans.period_amount', 'price')])
    .groupBy('plans.billing_interval')
    .execute();
  return {
    count: rows.reduce((n, r) => n + Number(r.count), 0),
    sums: new Map(rows.map((r) => [r.billing_interval, exactSumOf(r, 'price')])),
  };
}

/** The money given back: refunds that succeeded, created in the range (count and exact sum). */
export async function refundedInRange(storage: Storage, merchantId: string, f: Pick<PaymentFilters, 'from' | 'before'>): Promise<{ count: number; amount: bigint }> {
  const row = await storage.db
    .selectFrom('refunds')
    .where('merchant_id', '=', merchantId)
    .where('status', '=', 'succeeded')
    .$if(f.from !== undefined, (q) => q.where('created_at', '>=', f.from!))
    .$if(f.before !== undefined, (q) => q.where('created_at', '<', f.before!))
    .select((eb) => [eb.fn.countAll<number>().as('count'), ...exactSumColumns('amount', 'amount')])
    .executeTakeFirst();
  return { count: Number(row?.count ?? 0), amount: row ? exactSumOf(row, 'amount') : 0n };
}
