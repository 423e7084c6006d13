import type { Transaction } from 'kysely';
import { nextCycleEnd } from '../domain/billing-cycle.ts';
import { newId } from '../domain/ids.ts';
import { fundWallet } from '../ledger/funding.ts';
import { ProviderUnavailableError, UNANSWERED, type ChargeOutcome } from '../payments/types.ts';
import type { Storage } from '../storage/db.ts';
import { findPlanIncludingDeleted, type PlanRow } from '../storage/plans.ts';
import type { Database } from '../storage/schema.ts';
import { insertPayment, latestPaymentMethod, transitionPayment, type PaymentRow, type SubscriptionRow } from '../storage/subscriptions.ts';
import { emitSubscriptionEvent, grantCycleCredit, savedMethodOf, type CommerceDeps, type Customer } from './subscriptions.ts';

/**
 * Plan changes of a live subscription (decision 0037). An upgrade (a plan whose period amount is
 * higher) takes effect when it is paid: the current cycle ends there, a cycle of the new plan
 * starts with its full credit, and the credit left from the cycle that ended is kept. Any other
 * change (a downgrade, or a plan of the same price) is scheduled for the cycle's end, where the
 * renewal applies it and charges the new plan; until then it can be withdrawn. Every change, and
 * every withdrawal, is announced by `subscription.updated`, whose `change` says what changed.
 */

export type PlanChangeKind = 'upgrade' | 'downgrade' | 'same';

/** What moving from `current` to `next` is: only a higher period amount is an upgrade. */
export function planChangeOf(current: Pick<PlanRow, 'id' | 'period_amount'>, next: Pick<PlanRow, 'id' | 'period_amount'>): PlanChangeKind {
  if (current.id === next.id) return 'same';
  return BigInt(next.period_amount) > BigInt(current.period_amount) ? 'upgrade' : 'downgrade';
}

/** What `subscription.updated` says changed. */
export type SubscriptionChange = {
  type: 'upgrade' | 'downgrade' | 'cancellation' | 'auto_top_up_bundle';
  /** `applied`: in effect now; `scheduled`: at effective_at; `withdrawn`: a scheduled change no longer happens. */
  status: 'applied' | 'scheduled' | 'withdrawn';
  previous_plan_id?: string;
  plan_id?: string;
  effective_at: string | null;
  previous_auto_top_up_bundle_id?: string | null;
  auto_top_up_bundle_id?: string | null;
};

/** Emits `subscription.updated` for `sub` (read again in the transaction, so in its new state). */
export function emitSubscriptionUpdated(trx: Transaction<Database>, sub: SubscriptionRow, change: SubscriptionChange, at: string): Promise<void> {
  return emitSubscriptionEvent(trx, 'subscription.updated', sub, at, { change });
}

/** Live: a subscription that is running (not a reservation being paid, not cancelled). */
const isRunning = (sub: SubscriptionRow) => sub.status === 'active' || sub.status === 'past_due';

/** What a subscription checkout sells: a first subscription, an upgrade now, or a change at `effectiveAt`. */
export type PlanCheckoutTerms = { price: bigint; change: 'subscribe' | 'upgrade' | 'downgrade'; effectiveAt: string | null };

/**
 * The terms of a subscription checkout for `plan`: its period amount now, except for a running
 * subscriber moving to a plan that is not an upgrade, who pays nothing now (the renewal charges
 * the new plan at the cycle's end).
 */
export async function planCheckoutTerms(storage: Storage, connectionId: string | null, plan: PlanRow): Promise<PlanCheckoutTerms> {
  const price = BigInt(plan.period_amount);
  const live = connectionId
    ? await storage.db.selectFrom('subscriptions').selectAll().where('connection_id', '=', connectionId).where('status', 'in', ['active', 'past_due']).executeTakeFirst()
    : undefined;
  if (!live) return { price, change: 'subscribe', effectiveAt: null };
  const current = (await findPlanIncludingDeleted(storage, live.plan_id))!;
  if (planChangeOf(current, plan) === 'upgrade') return { price, change: 'upgrade', effectiveAt: null };
  return { price: 0n, change: 'downgrade', effectiveAt: live.cycle_end_at };
}

/**
 * A subscription checkout paid by a customer who already has a subscription, in the transaction
 * that records the payment as succeeded: an upgrade paid at its full price starts now; a
 * downgrade is scheduled. Returns the subscription changed and what of the payment is left over,
 * to be credited as prepaid funds by the caller (all of it when nothing could change: the plan is
 * the current one, the price no longer matches because the subscription changed since it was
 * priced, or the renewal is charging the subscription at this moment), so a payment is never lost.
 */
export async function changePlanAtCheckout(
  trx: Transaction<Database>,
  live: SubscriptionRow,
  customer: Customer,
  plan: PlanRow,
  paid: { amount: bigint; paymentId: string },
  at: Date,
): Promise<{ subscriptionId: string | null; leftOver: bigint }> {
  if (!isRunning(live)) return { subscriptionId: null, leftOver: paid.amount };
  const current = await trx.selectFrom('plans').selectAll().where('id', '=', live.plan_id).executeTakeFirstOrThrow();
  const kind = planChangeOf(current, plan);
  if (kind === 'upgrade' && paid.amount === BigInt(plan.period_amount)) {
    const upgraded = await upgradeNow(trx, live, customer, current, plan, paid.paymentId, at);
    return upgraded ? { subscriptionId: live.id, leftOver: 0n } : { subscriptionId: null, leftOver: paid.amount };
  }
  if (kind === 'downgrade') {
    await scheduleDowngrade(trx, live, plan, at.toISOString());
    return { subscriptionId: live.id, leftOver: paid.amount };
  }
  return { subscriptionId: null, leftOver: paid.amount };
}

/**
 * Moves a running subscription to a higher plan now: a new cycle of `plan` starts at `at` (its
 * anchor, so later cycles count from the upgrade) with the plan's full credit. The credit left in
 * the cycle bucket stays (the customer paid for it; the new plan's rollover rule applies to it at
 * the next renewal), as does bundle credit; a scheduled downgrade or cancellation is dropped (the
 * customer chose a plan); an auto top-up bundle of the old plan gives way to the new plan's
 * default. A compare-and-set on the cycle and the renewal's claim: false (nothing written) when
 * the subscription moved on since it was read, or a renewal is charging it right now.
 */
export async function upgradeNow(
  trx: Transaction<Database>,
  sub: SubscriptionRow,
  customer: Customer,
  current: PlanRow,
  plan: PlanRow,
  paymentId: string,
  at: Date,
): Promise<boolean> {
  const stamp = at.toISOString();
  const upgraded: SubscriptionRow = {
    ...sub,
    plan_id: plan.id,
    status: 'active',
    auto_top_up_bundle_id: await bundleAfterChange(trx, sub.auto_top_up_bundle_id, plan),
    cycle_start_at: stamp,
    cycle_end_at: nextCycleEnd(at, plan.billing_interval, at).toISOString(),
    cycle_anchor_at: stamp,
    pending_plan_id: null,
    cancel_at_cycle_end: 0,
    claimed_until: null,
    failed_attempts: 0,
    next_attempt_at: null,
  };
  const { id: _id, merchant_id: _m, connection_id: _c, started_at: _s, created_at: _k, cancelled_at: _x, ...changes } = upgraded;
  const written = await trx
    .updateTable('subscriptions')
    .set(changes)
    .where('id', '=', sub.id)
    .where('plan_id', '=', sub.plan_id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .where('status', 'in', ['active', 'past_due'])
    .where((eb) => eb.or([eb('claimed_until', 'is', null), eb('claimed_until', '<', stamp)]))
    .executeTakeFirst();
  if (Number(written.numUpdatedRows) !== 1) return false;
  // Referenced per upgrade (its payment), apart from the renewals' `<subscription>:<cycle start>`.
  await grantCycleCredit(trx, sub, customer.wallet_id, plan, `${sub.id}:upgrade:${paymentId}`, stamp, { note: `upgrade from ${current.name}`, paidBy: paymentId });
  await emitSubscriptionUpdated(trx, upgraded, { type: 'upgrade', status: 'applied', previous_plan_id: current.id, plan_id: plan.id, effective_at: stamp }, stamp);
  return true;
}

/** Schedules `plan` for the cycle's end (replacing a scheduled cancellation or another change). */
export async function scheduleDowngrade(trx: Transaction<Database>, sub: SubscriptionRow, plan: PlanRow, at: string): Promise<void> {
  await trx.updateTable('subscriptions').set({ pending_plan_id: plan.id, cancel_at_cycle_end: 0 }).where('id', '=', sub.id).execute();
  const scheduled = { ...sub, pending_plan_id: plan.id, cancel_at_cycle_end: 0 };
  await emitSubscriptionUpdated(trx, scheduled, { type: 'downgrade', status: 'scheduled', previous_plan_id: sub.plan_id, plan_id: plan.id, effective_at: sub.cycle_end_at }, at);
}

/**
 * The auto top-up bundle a subscription keeps when it moves to `plan`: its own if it is one of
 * the plan's live bundles, else the plan's default (bundles are bought only on their own plan).
 */
export async function bundleAfterChange(trx: Transaction<Database>, bundleId: string | null, plan: PlanRow): Promise<string | null> {
  if (bundleId === null) return plan.default_auto_top_up_bundle_id;
  const own = await trx.selectFrom('credit_bundles').select('id').where('id', '=', bundleId).where('plan_id', '=', plan.id).where('deleted_at', 'is', null).executeTakeFirst();
  return own ? bundleId : plan.default_auto_top_up_bundle_id;
}

/** What PATCH /v1/subscriptions/{id} changes, checked by the route: a bundle (or null) and a plan. */
export type SubscriptionUpdate = { autoTopUpBundleId?: string | null; plan?: PlanRow };

/**
 * PATCH: the auto top-up bundle changes now; a plan is scheduled for the cycle's end (replacing a
 * scheduled cancellation or change), and the current plan withdraws whatever was scheduled. One
 * transaction with its `subscription.updated` events; nothing that stays as it was is announced.
 */
export async function updateSubscriptionTerms(storage: Storage, sub: SubscriptionRow, update: SubscriptionUpdate, at: string): Promise<void> {
  await storage.db.transaction().execute(async (trx) => {
    let now = sub;
    const changes: SubscriptionChange[] = [];
    if (update.autoTopUpBundleId !== undefined && update.autoTopUpBundleId !== sub.auto_top_up_bundle_id) {
      now = { ...now, auto_top_up_bundle_id: update.autoTopUpBundleId };
      changes.push({ type: 'auto_top_up_bundle', status: 'applied', previous_auto_top_up_bundle_id: sub.auto_top_up_bundle_id, auto_top_up_bundle_id: update.autoTopUpBundleId, effective_at: at });
    }
    if (update.plan) {
      const target = update.plan.id === sub.plan_id ? null : update.plan.id;
      changes.push(...(await scheduledChanges(trx, sub, target)));
      now = { ...now, pending_plan_id: target, cancel_at_cycle_end: 0 };
    }
    const { auto_top_up_bundle_id, pending_plan_id, cancel_at_cycle_end } = now;
    await trx.updateTable('subscriptions').set({ auto_top_up_bundle_id, pending_plan_id, cancel_at_cycle_end }).where('id', '=', sub.id).execute();
    for (const change of changes) await emitSubscriptionUpdated(trx, now, change, at);
  });
}

/** What scheduling `target` (null: nothing) for the cycle's end changes, compared with what was scheduled. */
async function scheduledChanges(trx: Transaction<Database>, sub: SubscriptionRow, target: string | null): Promise<SubscriptionChange[]> {
  const planOf = (id: string) => trx.selectFrom('plans').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  const current = await planOf(sub.plan_id);
  const changes: SubscriptionChange[] = [];
  if (sub.pending_plan_id !== null && sub.pending_plan_id !== target) {
    const type = planChangeOf(current, await planOf(sub.pending_plan_id)) === 'upgrade' ? 'upgrade' : 'downgrade';
    changes.push({ type, status: 'withdrawn', previous_plan_id: sub.plan_id, plan_id: sub.pending_plan_id, effective_at: null });
  }
  if (Number(sub.cancel_at_cycle_end) === 1) changes.push({ type: 'cancellation', status: 'withdrawn', effective_at: null });
  if (target !== null && target !== sub.pending_plan_id) {
    const type = planChangeOf(current, await planOf(target)) === 'upgrade' ? 'upgrade' : 'downgrade';
    changes.push({ type, status: 'scheduled', previous_plan_id: sub.plan_id, plan_id: target, effective_at: sub.cycle_end_at });
  }
  return changes;
}

/** DELETE: the subscription ends with its paid cycle (decision 0016); announced once, when first scheduled. */
export async function scheduleCancellation(storage: Storage, sub: SubscriptionRow, at: string): Promise<void> {
  if (Number(sub.cancel_at_cycle_end) === 1) return;
  await storage.db.transaction().execute(async (trx) => {
    const result = await trx.updateTable('subscriptions').set({ cancel_at_cycle_end: 1 }).where('id', '=', sub.id).where('cancel_at_cycle_end', '=', 0).executeTakeFirst();
    if (Number(result.numUpdatedRows) !== 1) return;
    await emitSubscriptionUpdated(trx, { ...sub, cancel_at_cycle_end: 1 }, { type: 'cancellation', status: 'scheduled', effective_at: sub.cycle_end_at }, at);
  });
}

/**
 * The reference of an upgrade's payment by POST /v1/subscriptions: purpose `renewal`, in the
 * renewals' `<subscription>:<…>:<attempt>` shape, but naming no cycle, so that nothing would
 * ever credit it as a renewal.
 */
const apiUpgradeReference = (subscriptionId: string, planId: string) => `${subscriptionId}:upgrade to ${planId} ${newId('payment')}:1`;

/** Whether a `renewal` payment is an upgrade's by POST /v1/subscriptions (no renewal engine asks about it again). */
export const isApiUpgradePayment = (payment: Pick<PaymentRow, 'purpose' | 'reference'>) => payment.purpose === 'renewal' && /^[^:]+:upgrade to /.test(payment.reference);

export type ApiChangeOutcome =
  | { ok: true; subscription: SubscriptionRow }
  | { ok: false; reason: 'subscription_exists' | 'payment_method_required' | 'payment_failed'; message: string };

/**
 * POST /v1/subscriptions for a customer whose subscription is running: the same plan is 409; a
 * downgrade is scheduled for the cycle's end; an upgrade charges the new plan's period amount to
 * the saved payment method (none: 402 `payment_method_required`, use a checkout) and starts it at
 * once, as a paid checkout would. The charge's payment row (purpose `renewal`, a reference that
 * names no cycle) is written before the provider is called and its id is the idempotency key; a
 * provider that does not answer records it failed unanswered (503), and should the provider have
 * taken the money, its event or the reconciliation records it succeeded for a refund (no current
 * cycle is named), never a payment lost track of.
 */
export async function changePlanByApi(deps: CommerceDeps, live: SubscriptionRow, customer: Customer, plan: PlanRow, at: Date): Promise<ApiChangeOutcome> {
  const { storage } = deps;
  const stamp = at.toISOString();
  const current = (await findPlanIncludingDeleted(storage, live.plan_id))!;
  const kind = planChangeOf(current, plan);
  if (kind === 'same') return { ok: false, reason: 'subscription_exists', message: 'The customer is already subscribed to this plan.' };
  if (kind === 'downgrade') {
    await storage.db.transaction().execute((trx) => scheduleDowngrade(trx, live, plan, stamp));
    return { ok: true, subscription: { ...live, pending_plan_id: plan.id, cancel_at_cycle_end: 0 } };
  }
  const method = await latestPaymentMethod(storage.db, customer.id);
  if (!method) return { ok: false, reason: 'payment_method_required', message: 'An upgrade to a paid plan needs a saved payment method; use a subscription checkout.' };
  const payment = (await insertPayment(storage.db, {
    merchant_id: live.merchant_id,
    connection_id: customer.id,
    provider: deps.payments.id,
    provider_ref: null,
    purpose: 'renewal',
    reference: apiUpgradeReference(live.id, plan.id),
    amount: BigInt(plan.period_amount),
    status: 'pending',
    failure_reason: null,
    created_at: stamp,
    updated_at: stamp,
  }))!;
  let outcome: ChargeOutcome;
  try {
    outcome = await deps.payments.chargeSaved({ amount: payment.amount, idempotencyKey: payment.id, description: `${plan.name}: upgrade`, method: savedMethodOf(method) });
  } catch (e) {
    // 503: nothing changes. Should the provider have taken it, the reconciliation reopens this row
    // and the renewal code, finding no current cycle in its reference, keeps it for a refund.
    if (e instanceof ProviderUnavailableError) await transitionPayment(storage.db, payment.id, ['pending'], { status: 'failed', failure_reason: UNANSWERED, updated_at: stamp });
    throw e;
  }
  if (outcome.status !== 'succeeded') {
    const reason = outcome.status === 'failed' ? outcome.reason : 'The payment needs the customer to confirm it; use a subscription checkout.';
    await transitionPayment(storage.db, payment.id, ['pending'], { status: 'failed', provider_ref: outcome.providerRef, failure_reason: reason, updated_at: stamp });
    return { ok: false, reason: 'payment_failed', message: reason };
  }
  const upgraded = await storage.db.transaction().execute(async (trx) => {
    if (!(await transitionPayment(trx, payment.id, ['pending'], { status: 'succeeded', provider_ref: outcome.providerRef, updated_at: stamp }))) return false;
    if (await upgradeNow(trx, live, customer, current, plan, payment.id, at)) return true;
    // The subscription moved on meanwhile (a renewal, another change): the payment is kept as prepaid funds.
    await fundWallet(trx, { merchantId: live.merchant_id, walletId: customer.wallet_id, bucket: 'prepaid', amount: payment.amount, source: 'payment', reference: payment.id, description: `${plan.name}: upgrade paid while the subscription changed`, at: stamp });
    return false;
  });
  if (!upgraded) return { ok: false, reason: 'subscription_exists', message: 'The subscription changed while the upgrade was paid; the payment is recorded (as prepaid funds, or for a refund) and the plan is unchanged.' };
  return { ok: true, subscription: { ...live, plan_id: plan.id } };
}
