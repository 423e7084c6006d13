import type { Kysely, Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import type { Database, PaymentMethodsTable, PaymentsTable, PlansTable, SubscriptionsTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type SubscriptionRow = SubscriptionsTable;
export type PaymentMethodRow = PaymentMethodsTable;
export type PaymentRow = PaymentsTable;
type Db = Kysely<Database> | Transaction<Database>;

type PlanTerms = Pick<PlansTable, 'name' | 'period_amount' | 'included_credit' | 'billing_interval' | 'rollover_type' | 'bundle_rollover_type'>;

/** A subscription with everything its API shape shows: plan terms, the wallet's credit buckets, the customer's contact. */
export type SubscriptionView = SubscriptionRow & {
  plan: PlanTerms;
  pending_plan: (PlanTerms & { id: string }) | null;
  wallet_id: string;
  cycle_credit: bigint;
  bundle_credit: bigint;
  contact: { phone: string | null; email: string | null; first_name: string | null; last_name: string | null };
};

/** `active` lists the subscriptions still running (past-due ones included, since they still renew). */
export type StatusFilter = 'active' | 'cancelled' | 'all';

function selectViews(db: Db) {
  return db
    .selectFrom('subscriptions')
    .innerJoin('plans', 'plans.id', 'subscriptions.plan_id')
    .leftJoin('plans as pending', 'pending.id', 'subscriptions.pending_plan_id')
    .innerJoin('connections', 'connections.id', 'subscriptions.connection_id')
    .innerJoin('wallets', 'wallets.id', 'connections.wallet_id')
    .selectAll('subscriptions')
    .select([
      'plans.name as plan_name',
      'plans.period_amount as plan_period_amount',
      'plans.included_credit as plan_included_credit',
      'plans.billing_interval as plan_billing_interval',
      'plans.rollover_type as plan_rollover_type',
      'plans.bundle_rollover_type as plan_bundle_rollover_type',
      'pending.name as pending_name',
      'pending.period_amount as pending_period_amount',
      'pending.included_credit as pending_included_credit',
      'pending.billing_interval as pending_billing_interval',
      'pending.rollover_type as pending_rollover_type',
      'pending.bundle_rollover_type as pending_bundle_rollover_type',
      'wallets.id as wallet_id',
      'wallets.cycle_credit',
      'wallets.bundle_credit',
      'connections.phone',
      'connections.email',
      'connections.first_name',
      'connections.last_name',
    ])
    .where('subscriptions.status', '<>', 'incomplete');
}

type ViewRow = Awaited<ReturnType<ReturnType<typeof selectViews>['executeTakeFirstOrThrow']>>;

function toView(r: ViewRow): SubscriptionView {
  const {
    plan_name, plan_period_amount, plan_included_credit, plan_billing_interval, plan_rollover_type, plan_bundle_rollover_type,
    pending_name, pending_period_amount, pending_included_credit, pending_billing_interval, pending_rollover_type, pending_bundle_rollover_type,
    wallet_id, cycle_credit, bundle_credit, phone, email, first_name, last_name, ...row
  } = r;
  return {
    ...row,
    plan: {
      name: plan_name,
      period_amount: BigInt(plan_period_amount),
      included_credit: BigInt(plan_included_credit),
      billing_interval: plan_billing_interval,
      rollover_type: plan_rollover_type,
      bundle_rollover_type: plan_bundle_rollover_type,
    },
    pending_plan:
      row.pending_plan_id && pending_name !== null
        ? {
            id: row.pending_plan_id,
            name: pending_name,
            period_amount: BigInt(pending_period_amount!),
            included_credit: BigInt(pending_included_credit!),
            billing_interval: pending_billing_interval!,
            rollover_type: pending_rollover_type!,
            bundle_rollover_type: pending_bundle_rollover_type!,
          }
        : null,
    wallet_id,
    cycle_credit: BigInt(cycle_credit),
    bundle_credit: BigInt(bundle_credit),
    contact: { phone, email, first_name, last_name },
  };
}

export async function findSubscriptionView(db: Db, merchantId: string, id: string): Promise<SubscriptionView | undefined> {
  const row = await selectViews(db).where('subscriptions.merchant_id', '=', merchantId).where('subscriptions.id', '=', id).executeTakeFirst();
  return row && toView(row);
}

/** The customer's running subscription, or else its latest cancelled one. */
export async function findCustomerSubscriptionView(storage: Storage, merchantId: string, connectionId: string): Promise<SubscriptionView | undefined> {
  const row = await selectViews(storage.db)
    .where('subscriptions.merchant_id', '=', merchantId)
    .where('subscriptions.connection_id', '=', connectionId)
    .orderBy((eb) => eb.case().when('subscriptions.status', '=', 'cancelled').then(1).else(0).end())
    .orderBy('subscriptions.id', 'desc')
    .executeTakeFirst();
  return row && toView(row);
}

export async function listSubscriptionViews(
  storage: Storage,
  merchantId: string,
  opts: { status: StatusFilter; customerId?: string; cursor?: string; limit: number },
): Promise<(SubscriptionView & { id: string })[]> {
  const rows = await selectViews(storage.db)
    .where('subscriptions.merchant_id', '=', merchantId)
    .$if(opts.status === 'active', (q) => q.where('subscriptions.status', 'in', ['active', 'past_due']))
    .$if(opts.status === 'cancelled', (q) => q.where('subscriptions.status', '=', 'cancelled'))
    .$if(opts.customerId !== undefined, (q) => q.where('subscriptions.connection_id', '=', opts.customerId!))
    .$call((q) => newestFirstPage(q, opts, 'subscriptions.id'))
    .execute();
  return rows.map(toView);
}

/** What a customer object shows of its subscription (the one not cancelled), by customer id. */
export type SubscriptionSummary = { subscription_id: string; plan_id: string; name: string; status: 'active' | 'past_due' };

export async function liveSubscriptionSummaries(db: Db, connectionIds: readonly string[]): Promise<Map<string, SubscriptionSummary>> {
  if (connectionIds.length === 0) return new Map();
  const rows = await db
    .selectFrom('subscriptions')
    .innerJoin('plans', 'plans.id', 'subscriptions.plan_id')
    .select(['subscriptions.connection_id', 'subscriptions.id', 'subscriptions.plan_id', 'subscriptions.status', 'plans.name'])
    .where('subscriptions.connection_id', 'in', [...new Set(connectionIds)])
    // A reservation still being paid (`incomplete`) is not a subscription yet.
    .where('subscriptions.status', 'in', ['active', 'past_due'])
    .execute();
  return new Map(
    rows.map((r) => [r.connection_id, { subscription_id: r.id, plan_id: r.plan_id, name: r.name, status: r.status as SubscriptionSummary['status'] }]),
  );
}

/** A customer's usage on a meter, as far as plan credit goes. */
export type MeteredCustomer = { connectionId: string; meterId: string };

/**
 * Of these customers' usage on these meters, the (customer, meter) pairs that draw the customer's
 * plan credit: the meter is linked to the plan of the customer's live (active or past-due)
 * subscription. Only such usage spends cycle and bundle credit; any other is paid from the
 * prepaid balance (decision 0016). Keyed by `planCreditKey`.
 */
export async function pairsDrawingPlanCredit(db: Db, connectionIds: readonly string[], meterIds: readonly string[]): Promise<Set<string>> {
  if (connectionIds.length === 0 || meterIds.length === 0) return new Set();
  const rows = await db
    .selectFrom('subscriptions')
    .innerJoin('plan_meters', 'plan_meters.plan_id', 'subscriptions.plan_id')
    .select(['subscriptions.connection_id', 'plan_meters.meter_id'])
    .where('subscriptions.connection_id', 'in', [...new Set(connectionIds)])
    .where('plan_meters.meter_id', 'in', [...new Set(meterIds)])
    .where('subscriptions.status', 'in', ['active', 'past_due'])
    .execute();
  return new Set(rows.map((r) => planCreditKey({ connectionId: r.connection_id, meterId: r.meter_id })));
}

export const planCreditKey = (pair: MeteredCustomer): string => `${pair.connectionId}\n${pair.meterId}`;

/** Whether this customer's usage on this meter draws its plan credit (see pairsDrawingPlanCredit). */
export async function drawsPlanCredit(db: Db, pair: MeteredCustomer): Promise<boolean> {
  return (await pairsDrawingPlanCredit(db, [pair.connectionId], [pair.meterId])).has(planCreditKey(pair));
}

export async function findSubscription(db: Db, merchantId: string, id: string): Promise<SubscriptionRow | undefined> {
  return db.selectFrom('subscriptions').selectAll().where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
}

export async function updateSubscription(
  db: Db,
  id: string,
  changes: Partial<Omit<SubscriptionRow, 'id' | 'merchant_id' | 'connection_id' | 'created_at'>>,
): Promise<void> {
  await db.updateTable('subscriptions').set(changes).where('id', '=', id).execute();
}

/**
 * Removes a subscription reservation (status `incomplete`: its first period not paid), never a
 * subscription that started; true when it was there to remove.
 */
export async function deleteReservation(db: Db, id: string): Promise<boolean> {
  const result = await db.deleteFrom('subscriptions').where('id', '=', id).where('status', '=', 'incomplete').executeTakeFirst();
  return Number(result.numDeletedRows) === 1;
}

export async function insertPaymentMethod(db: Db, row: Omit<PaymentMethodRow, 'id'>): Promise<PaymentMethodRow> {
  const full = { id: newId('paymentMethod'), ...row };
  await db.insertInto('payment_methods').values(full).execute();
  return full;
}

/** The method saved last is the one charged off-session. */
export async function latestPaymentMethod(db: Db, connectionId: string): Promise<PaymentMethodRow | undefined> {
  return db.selectFrom('payment_methods').selectAll().where('connection_id', '=', connectionId).orderBy('id', 'desc').executeTakeFirst();
}

/** Records a payment about to be attempted; `null` when one with this purpose and reference exists already. */
export async function insertPayment(db: Db, row: Omit<PaymentRow, 'id' | 'credit_reference'>): Promise<PaymentRow | null> {
  const full = { id: newId('payment'), ...row, credit_reference: null };
  const inserted = await db
    .insertInto('payments')
    .values(full)
    .onConflict((oc) => oc.columns(['purpose', 'reference']).doNothing())
    .executeTakeFirst();
  return Number(inserted.numInsertedOrUpdatedRows ?? 0n) === 1 ? full : null;
}

export async function findPayment(db: Db, purpose: PaymentRow['purpose'], reference: string): Promise<PaymentRow | undefined> {
  return db.selectFrom('payments').selectAll().where('purpose', '=', purpose).where('reference', '=', reference).executeTakeFirst();
}

/**
 * Moves a payment from one of `from` to `to`; false when it was not in one of them (another
 * instance, or an earlier delivery of the same provider event, got there first).
 */
export async function transitionPayment(
  db: Db,
  id: string,
  from: PaymentRow['status'][],
  to: { status: PaymentRow['status']; provider_ref?: string | null; failure_reason?: string | null; reference?: string; updated_at: string },
): Promise<boolean> {
  const result = await db.updateTable('payments').set(to).where('id', '=', id).where('status', 'in', from).executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}
