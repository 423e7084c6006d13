import type { Transaction } from 'kysely';
import { nextCycleEnd } from '../domain/billing-cycle.ts';
import { newId } from '../domain/ids.ts';
import { fundWallet } from '../ledger/funding.ts';
import type { Clock } from '../domain/clock.ts';
import { ProviderUnavailableError, type ChargeOutcome, type PaymentProvider, type SavedMethod } from '../payments/types.ts';
import type { Storage } from '../storage/db.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { findPlanIncludingDeleted, type PlanRow } from '../storage/plans.ts';
import type { Database } from '../storage/schema.ts';
import {
  deleteReservation,
  findPayment,
  findSubscriptionView,
  insertPayment,
  latestPaymentMethod,
  transitionPayment,
  type PaymentMethodRow,
  type PaymentRow,
  type SubscriptionRow,
} from '../storage/subscriptions.ts';
import { enqueueEvent, type EventType } from '../webhooks/outbox.ts';
import { presentSubscription } from './subscription-view.ts';
import type { CommerceState } from './state.ts';

/**
 * What the commerce code needs: storage, the payment provider, and the app's clock. `faultAt`
 * (tests only) is called at the step that credits a payment, inside its transaction: a throw there
 * is a crash at that step, which the reconciliation must recover from.
 */
export type CommerceDeps = { storage: Storage; payments: PaymentProvider; clock: Clock; faultAt?: (step: 'credit') => void };
/** What checkout payments and auto top-ups also need: what they keep in process (the app's). */
export type PurchaseDeps = CommerceDeps & { commerceState: CommerceState };
export type Customer = { id: string; wallet_id: string };

export type StartOutcome =
  | { ok: true; subscription: SubscriptionRow }
  | { ok: false; reason: 'subscription_exists' | 'payment_method_required' | 'payment_failed' | 'not_found'; message: string };

/** The saved method as the provider knows it. */
export const savedMethodOf = (row: PaymentMethodRow): SavedMethod => ({
  providerRef: row.provider_ref,
  customerRef: row.provider_customer_ref,
  label: row.label,
});

/**
 * Emits a subscription event whose data is the subscription as the API lists it, read in the
 * caller's transaction after its change (plus `extra`, e.g. a failure's reason).
 */
export async function emitSubscriptionEvent(
  trx: Transaction<Database>,
  type: Extract<EventType, `subscription.${string}`>,
  sub: SubscriptionRow,
  at: string,
  extra?: Record<string, unknown>,
): Promise<void> {
  const view = await findSubscriptionView(trx, sub.merchant_id, sub.id);
  if (!view) throw new RangeError(`no subscription ${sub.id}`);
  await enqueueEvent(trx, { merchantId: sub.merchant_id, type, data: { ...presentSubscription(view), ...extra }, at });
}

/** A new subscription row starting at `at`, in the given status. */
function newSubscriptionRow(merchantId: string, customer: Customer, plan: PlanRow, at: Date, status: SubscriptionRow['status']): SubscriptionRow {
  const start = at.toISOString();
  return {
    id: newId('subscription'),
    merchant_id: merchantId,
    connection_id: customer.id,
    plan_id: plan.id,
    status,
    auto_top_up_bundle_id: plan.default_auto_top_up_bundle_id,
    started_at: start,
    cancelled_at: null,
    cycle_start_at: start,
    cycle_end_at: nextCycleEnd(at, plan.billing_interval, at).toISOString(),
    cycle_anchor_at: start,
    pending_plan_id: null,
    cancel_at_cycle_end: 0,
    claimed_until: null,
    failed_attempts: 0,
    next_attempt_at: null,
    created_at: start,
  };
}

/**
 * Grants the first cycle's credit and emits `subscription.created`, in the caller's transaction;
 * `paidBy` is the payment of the first period, if any.
 */
async function beginFirstCycle(trx: Transaction<Database>, sub: SubscriptionRow, customer: Customer, plan: PlanRow, paidBy: string | null): Promise<void> {
  await grantCycleCredit(trx, sub, customer.wallet_id, plan, `${sub.id}:${sub.cycle_start_at}`, sub.cycle_start_at, { paidBy });
  await emitSubscriptionEvent(trx, 'subscription.created', sub, sub.cycle_start_at);
}

/**
 * Funds the wallet's cycle bucket with `plan`'s included credit for a cycle starting at `at`: a
 * subscription's first cycle, each renewal and an upgrade all grant it here. `reference` makes the
 * grant happen once per cycle; `note` tells a grant apart in the ledger's description. `paidBy`,
 * the payment of the period, is linked to the grant (its `credit_reference`), so that a refund of
 * it knows the credit it paid for (decision 0044).
 */
export async function grantCycleCredit(
  trx: Transaction<Database>,
  sub: Pick<SubscriptionRow, 'merchant_id'>,
  walletId: string,
  plan: Pick<PlanRow, 'name' | 'included_credit'>,
  reference: string,
  at: string,
  opts: { note?: string; paidBy?: string | null } = {},
): Promise<bigint> {
  const granted = await fundWallet(trx, {
    merchantId: sub.merchant_id,
    walletId,
    bucket: 'cycle',
    amount: BigInt(plan.included_credit),
    source: 'plan_credit',
    reference,
    description: `${plan.name}: cycle credit${opts.note ? ` (${opts.note})` : ''}`,
    at,
  });
  if (opts.paidBy) await trx.updateTable('payments').set({ credit_reference: reference }).where('id', '=', opts.paidBy).execute();
  return granted;
}

/**
 * Creates an active subscription whose first period is already paid (or free), in the caller's
 * transaction: the checkout completion uses this once the provider confirmed its payment.
 * Throws a unique violation when the customer already has a live subscription.
 */
export async function insertPaidSubscription(
  trx: Transaction<Database>,
  merchantId: string,
  customer: Customer,
  plan: PlanRow,
  at: Date,
  paidBy: string | null,
): Promise<SubscriptionRow> {
  const sub = newSubscriptionRow(merchantId, customer, plan, at, 'active');
  await trx.insertInto('subscriptions').values(sub).execute();
  await beginFirstCycle(trx, sub, customer, plan, paidBy);
  return sub;
}

/**
 * POST /v1/subscriptions: a free plan starts at once; a paid one charges the customer's saved
 * payment method for the first period and starts only when the provider confirms it. The row is
 * reserved first (status `incomplete`), so two concurrent requests cannot both charge.
 */
export async function startSubscription(deps: CommerceDeps, merchantId: string, customer: Customer, plan: PlanRow, at: Date): Promise<StartOutcome> {
  const { storage } = deps;
  const periodAmount = BigInt(plan.period_amount);
  const method = periodAmount > 0n ? await latestPaymentMethod(storage.db, customer.id) : undefined;
  if (periodAmount > 0n && !method) {
    return { ok: false, reason: 'payment_method_required', message: 'The plan is paid and the customer has no saved payment method; use a checkout session.' };
  }
  const reserved = newSubscriptionRow(merchantId, customer, plan, at, periodAmount > 0n ? 'incomplete' : 'active');
  try {
    if (periodAmount === 0n) {
      await storage.db.transaction().execute(async (trx) => {
        await trx.insertInto('subscriptions').values(reserved).execute();
        await beginFirstCycle(trx, reserved, customer, plan, null);
      });
      return { ok: true, subscription: reserved };
    }
    await storage.db.insertInto('subscriptions').values(reserved).execute();
  } catch (e) {
    if (isUniqueViolation(e)) return { ok: false, reason: 'subscription_exists', message: 'The customer already has a subscription that is not cancelled.' };
    throw e;
  }
  return chargeFirstPeriod(deps, reserved, customer, plan, method!, at);
}

async function chargeFirstPeriod(
  deps: CommerceDeps,
  sub: SubscriptionRow,
  customer: Customer,
  plan: PlanRow,
  method: PaymentMethodRow,
  at: Date,
): Promise<StartOutcome> {
  const { storage } = deps;
  const stamp = at.toISOString();
  const payment = (await insertPayment(storage.db, {
    merchant_id: sub.merchant_id,
    connection_id: customer.id,
    provider: deps.payments.id,
    provider_ref: null,
    purpose: 'renewal',
    reference: firstPeriodReference(sub),
    amount: BigInt(plan.period_amount),
    status: 'pending',
    failure_reason: null,
    created_at: stamp,
    updated_at: stamp,
  }))!;
  return chargeReservation(deps, sub, customer, plan, method, payment, at);
}

/** The first period's payment reference of a subscription (its first cycle, first attempt). */
const firstPeriodReference = (sub: SubscriptionRow) => `${sub.id}:${sub.cycle_start_at}:1`;

/**
 * Charges a reservation's first period (its payment row's id is the idempotency key, so asking
 * again answers the first outcome) and records the outcome: the subscription starts, or the
 * reservation is deleted. Both by compare-and-set, so two callers settle it once.
 */
async function chargeReservation(
  deps: CommerceDeps,
  sub: SubscriptionRow,
  customer: Customer,
  plan: PlanRow,
  method: PaymentMethodRow | undefined,
  payment: PaymentRow,
  at: Date,
): Promise<StartOutcome> {
  const { storage, payments } = deps;
  const stamp = at.toISOString();
  // A provider that does not answer (ProviderUnavailableError, a 503) leaves the reservation and
  // its pending payment as they are: settleOrphanedReservations asks again with the same key.
  const outcome: ChargeOutcome = method
    ? await payments.chargeSaved({ amount: payment.amount, idempotencyKey: payment.id, description: `${plan.name}: first period`, method: savedMethodOf(method) })
    : { status: 'failed', providerRef: null, reason: 'The customer has no saved payment method.' };
  if (outcome.status !== 'succeeded') {
    const reason = outcome.status === 'failed' ? outcome.reason : 'The payment needs the customer to confirm it; use a checkout session.';
    await storage.db.transaction().execute(async (trx) => {
      await transitionPayment(trx, payment.id, ['pending'], { status: 'failed', provider_ref: outcome.providerRef, failure_reason: reason, updated_at: stamp });
      await deleteReservation(trx, sub.id);
    });
    return { ok: false, reason: 'payment_failed', message: reason };
  }
  const active = await startPaidReservation(deps, sub, customer, plan, payment, outcome.providerRef, stamp);
  if (!active) return { ok: false, reason: 'not_found', message: 'The customer was deleted while its first period was being charged; the payment is recorded for a refund.' };
  return { ok: true, subscription: active };
}

/**
 * A reservation whose first period the provider confirmed starts, in the transaction that marks
 * its payment succeeded, only if that compare-and-set happened (the request, the orphan settler
 * and the provider's event may all learn of it). A reservation whose customer was deleted
 * meanwhile never starts: the payment is recorded as `cycle_closed`, for a refund, the
 * reservation is removed and nothing is credited (undefined). The customer's row is locked
 * first (on PostgreSQL; SQLite runs one writer), so a deletion either comes before and is seen
 * here, or waits and then finds the subscription active and cancels it.
 */
async function startPaidReservation(
  deps: CommerceDeps,
  sub: SubscriptionRow,
  customer: Customer,
  plan: PlanRow,
  payment: PaymentRow,
  providerRef: string,
  stamp: string,
): Promise<SubscriptionRow | undefined> {
  const active: SubscriptionRow = { ...sub, status: 'active' };
  const started = await deps.storage.db.transaction().execute(async (trx) => {
    const succeeded = { status: 'succeeded' as const, provider_ref: providerRef, updated_at: stamp };
    if (!(await transitionPayment(trx, payment.id, ['pending'], succeeded))) {
      // Another caller settled it first; it started the subscription unless the reservation was gone.
      return (await trx.selectFrom('subscriptions').select('id').where('id', '=', sub.id).executeTakeFirst()) !== undefined;
    }
    const activated = (await lockLiveCustomer(trx, deps.storage.dialect, customer.id)) && (await activateReservation(trx, sub.id));
    if (!activated) {
      await transitionPayment(trx, payment.id, ['succeeded'], { ...succeeded, failure_reason: 'cycle_closed' });
      await deleteReservation(trx, sub.id);
      return false;
    }
    await beginFirstCycle(trx, active, customer, plan, payment.id);
    return true;
  });
  return started ? active : undefined;
}

/** Compare-and-set of a reservation to `active`: false when it is no longer `incomplete` (or gone). */
async function activateReservation(trx: Transaction<Database>, id: string): Promise<boolean> {
  const result = await trx.updateTable('subscriptions').set({ status: 'active' }).where('id', '=', id).where('status', '=', 'incomplete').executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

/** Whether the customer is still live, holding its row's lock (on PostgreSQL) to the transaction's end. */
async function lockLiveCustomer(trx: Transaction<Database>, dialect: Storage['dialect'], connectionId: string): Promise<boolean> {
  const row = await trx
    .selectFrom('connections')
    .select('id')
    .where('id', '=', connectionId)
    .where('deleted_at', 'is', null)
    .$call((q) => (dialect === 'postgres' ? q.forUpdate() : q))
    .executeTakeFirst();
  return row !== undefined;
}

/** The first period of a reservation the provider confirmed by its event (not by the charging call). */
export async function startReservationFromProvider(deps: CommerceDeps, sub: SubscriptionRow, payment: PaymentRow, providerRef: string, stamp: string): Promise<void> {
  if (sub.status !== 'incomplete' || payment.reference !== firstPeriodReference(sub)) return;
  const customer = await deps.storage.db.selectFrom('connections').select(['id', 'wallet_id']).where('id', '=', sub.connection_id).executeTakeFirstOrThrow();
  const plan = (await findPlanIncludingDeleted(deps.storage, sub.plan_id))!;
  await startPaidReservation(deps, sub, customer, plan, payment, providerRef, stamp);
}

/** A reservation this old has no live request charging it any more (a provider call times out well before). */
export const ORPHANED_RESERVATION_MS = 15 * 60_000;

/**
 * Settles `incomplete` subscriptions whose request died between reserving the row and recording
 * its first payment (a crash), so they no longer block the customer's next subscription: without
 * a payment row (the charge was never made) or with a failed one, the reservation is deleted; with
 * a payment still `pending`, the provider is asked again with the same idempotency key, which
 * answers the first charge's outcome (or makes it, if it never reached the provider), and the
 * reservation starts or is deleted as the request would have done. Run by the renewal scheduler.
 */
export async function settleOrphanedReservations(deps: CommerceDeps, now: Date): Promise<{ started: number; deleted: number }> {
  const { storage } = deps;
  const before = new Date(now.getTime() - ORPHANED_RESERVATION_MS).toISOString();
  const orphans = await storage.db.selectFrom('subscriptions').selectAll().where('status', '=', 'incomplete').where('created_at', '<', before).limit(50).execute();
  let started = 0;
  let deleted = 0;
  for (const sub of orphans) {
    const payment = await findPayment(storage.db, 'renewal', firstPeriodReference(sub));
    if (!payment || payment.status !== 'pending') {
      if (await deleteReservation(storage.db, sub.id)) deleted += 1;
      continue;
    }
    const customer = await storage.db.selectFrom('connections').select(['id', 'wallet_id']).where('id', '=', sub.connection_id).executeTakeFirstOrThrow();
    const plan = (await findPlanIncludingDeleted(storage, sub.plan_id))!;
    const method = await latestPaymentMethod(storage.db, sub.connection_id);
    let outcome: StartOutcome;
    try {
      outcome = await chargeReservation(deps, sub, customer, plan, method, payment, now);
    } catch (e) {
      // Still no answer: asked again on the next run.
      if (e instanceof ProviderUnavailableError) continue;
      throw e;
    }
    if (outcome.ok) started += 1;
    else deleted += 1;
  }
  return { started, deleted };
}
