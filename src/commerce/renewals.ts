import type { Transaction } from 'kysely';
import { nextCycleEnd } from '../domain/billing-cycle.ts';
import { dateOf } from '../domain/clock.ts';
import { expireBucket } from '../ledger/funding.ts';
import { ProviderUnavailableError, type ChargeOutcome } from '../payments/types.ts';
import { findPlanIncludingDeleted, type PlanRow } from '../storage/plans.ts';
import type { Database } from '../storage/schema.ts';
import { findPayment, insertPayment, latestPaymentMethod, transitionPayment, type PaymentRow, type SubscriptionRow } from '../storage/subscriptions.ts';
import { bundleAfterChange, emitSubscriptionUpdated, planChangeOf } from './plan-changes.ts';
import { runEveryInterval } from './rounds.ts';
import { emitSubscriptionEvent, grantCycleCredit, savedMethodOf, settleOrphanedReservations, startReservationFromProvider, type CommerceDeps } from './subscriptions.ts';

/**
 * The cycle engine. Every tick renews the subscriptions whose cycle has ended: it applies a
 * scheduled cancellation or plan change, charges the period through the payment provider, and
 * starts the next cycle (rollover, then the plan's cycle credit). Safe with several instances: a
 * subscription is claimed by a compare-and-set before any charge, the charge's idempotency key is
 * the cycle's payment row (unique per cycle and attempt), and the new cycle is written only if the
 * cycle it replaces is still the current one.
 */

/** A failed renewal is retried after these delays (past_due); after the last one the subscription is cancelled. */
export const RETRY_DELAYS_MS = [60 * 60_000, 24 * 60 * 60_000, 3 * 24 * 60 * 60_000] as const;
/** An instance that claimed a subscription and died frees it after this long. */
const CLAIM_MS = 5 * 60_000;
/** A renewal whose payment provider did not answer is tried again after this long (not a failed attempt). */
export const PROVIDER_RETRY_MS = 5 * 60_000;
const BATCH = 50;

export type RenewalResult = { subscriptionId: string; outcome: 'renewed' | 'cancelled' | 'past_due' | 'skipped' | 'provider_unavailable' | 'error' };

/**
 * One round: the due subscriptions, oldest cycle end first. A renewal that throws is reported
 * (`onError`, outcome `error`) and the round goes on with the others; that subscription keeps its
 * claim, so it is tried again once the claim lapses (CLAIM_MS), not on every tick.
 */
export async function renewDueSubscriptions(
  deps: CommerceDeps,
  now: Date,
  opts: { stopping?: () => boolean; onError?: (err: unknown, subscriptionId: string) => void } = {},
): Promise<RenewalResult[]> {
  const stamp = now.toISOString();
  const due = await deps.storage.db
    .selectFrom('subscriptions')
    .selectAll()
    .where('status', 'in', ['active', 'past_due'])
    .where('cycle_end_at', '<=', stamp)
    .where((eb) => eb.or([eb('next_attempt_at', 'is', null), eb('next_attempt_at', '<=', stamp)]))
    .where((eb) => eb.or([eb('claimed_until', 'is', null), eb('claimed_until', '<', stamp)]))
    .orderBy('cycle_end_at')
    .limit(BATCH)
    .execute();
  const results: RenewalResult[] = [];
  for (const sub of due) {
    // A stopping process ends after the subscription it is renewing; the rest stay due, unclaimed.
    if (opts.stopping?.()) break;
    if (!(await claim(deps, sub, now))) {
      results.push({ subscriptionId: sub.id, outcome: 'skipped' });
      continue;
    }
    try {
      results.push({ subscriptionId: sub.id, outcome: await renew(deps, sub, now) });
    } catch (err) {
      opts.onError?.(err, sub.id);
      results.push({ subscriptionId: sub.id, outcome: 'error' });
    }
  }
  return results;
}

/** Compare-and-set on the cycle and the claim: exactly one instance wins a due subscription. */
async function claim(deps: CommerceDeps, sub: SubscriptionRow, now: Date): Promise<boolean> {
  const stamp = now.toISOString();
  const result = await deps.storage.db
    .updateTable('subscriptions')
    .set({ claimed_until: new Date(now.getTime() + CLAIM_MS).toISOString() })
    .where('id', '=', sub.id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .where('status', '=', sub.status)
    .where((eb) => eb.or([eb('claimed_until', 'is', null), eb('claimed_until', '<', stamp)]))
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

async function renew(deps: CommerceDeps, sub: SubscriptionRow, now: Date): Promise<RenewalResult['outcome']> {
  const { storage } = deps;
  const ending = (await findPlanIncludingDeleted(storage, sub.plan_id))!;
  if (Number(sub.cancel_at_cycle_end) === 1) {
    await storage.db.transaction().execute((trx) => cancel(deps, trx, sub, ending, sub.cycle_end_at, 'requested'));
    return 'cancelled';
  }
  const next = (sub.pending_plan_id && (await findPlanIncludingDeleted(storage, sub.pending_plan_id))) || ending;
  const attempt = Number(sub.failed_attempts) + 1;
  const outcome = await chargePeriod(deps, sub, next, attempt, now);
  if (outcome === 'provider_unavailable') {
    await retryLater(deps, sub, now);
    return 'provider_unavailable';
  }
  if (outcome.status === 'succeeded') {
    // The payment is marked succeeded with the cycle it pays for, so a crash between the two never
    // leaves a charge without its credit (the reconciliation settles a payment left pending).
    await storage.db.transaction().execute(async (trx) => {
      if (outcome.paymentId) await transitionPayment(trx, outcome.paymentId, ['pending'], { status: 'succeeded', provider_ref: outcome.providerRef, updated_at: now.toISOString() });
      deps.faultAt?.('credit');
      await startNextCycle(deps, trx, sub, ending, next, outcome.paymentId ?? null);
    });
    return 'renewed';
  }
  const reason = outcome.status === 'failed' ? outcome.reason : 'The payment needs the customer to confirm it.';
  return storage.db.transaction().execute((trx) => recordFailure(deps, trx, sub, ending, attempt, reason, now));
}

/**
 * Charges the new period (nothing for a free plan). The payment row is unique per cycle and
 * attempt, and its id is the provider's idempotency key. A row already there is this attempt's,
 * left by an instance that died (its claim lapsed) or by a provider that did not answer: a settled
 * one is taken as it is, a pending one is asked again with the same key, which never charges
 * twice. 'provider_unavailable' when the provider does not answer (the row stays pending).
 */
async function chargePeriod(
  deps: CommerceDeps,
  sub: SubscriptionRow,
  plan: PlanRow,
  attempt: number,
  now: Date,
): Promise<(ChargeOutcome & { paymentId?: string }) | 'provider_unavailable'> {
  const amount = BigInt(plan.period_amount);
  if (amount === 0n) return { status: 'succeeded', providerRef: 'free' };
  const stamp = now.toISOString();
  const reference = `${sub.id}:${sub.cycle_end_at}:${attempt}`;
  const inserted = await insertPayment(deps.storage.db, {
    merchant_id: sub.merchant_id,
    connection_id: sub.connection_id,
    provider: deps.payments.id,
    provider_ref: null,
    purpose: 'renewal',
    reference,
    amount,
    status: 'pending',
    failure_reason: null,
    created_at: stamp,
    updated_at: stamp,
  });
  const payment = inserted ?? (await findPayment(deps.storage.db, 'renewal', reference))!;
  const settled = settledOutcomeOf(payment);
  if (settled) return settled;
  const method = await latestPaymentMethod(deps.storage.db, sub.connection_id);
  let outcome: ChargeOutcome;
  try {
    outcome = method
      ? await deps.payments.chargeSaved({ amount, idempotencyKey: payment.id, description: `${plan.name}: renewal`, method: savedMethodOf(method) })
      : { status: 'failed', providerRef: null, reason: 'The customer has no saved payment method.' };
  } catch (e) {
    if (e instanceof ProviderUnavailableError) return 'provider_unavailable';
    throw e;
  }
  // A success is recorded by the caller, in the transaction that starts the cycle it pays for.
  if (outcome.status === 'succeeded') return { ...outcome, paymentId: payment.id };
  await transitionPayment(deps.storage.db, payment.id, ['pending'], {
    status: 'failed',
    provider_ref: outcome.providerRef,
    failure_reason: outcome.status === 'failed' ? outcome.reason : 'requires_action',
    updated_at: stamp,
  });
  return outcome;
}

/** The outcome a renewal payment already has (succeeded or failed), or null while it is pending. */
function settledOutcomeOf(payment: PaymentRow): ChargeOutcome | null {
  if (payment.status === 'succeeded') return { status: 'succeeded', providerRef: payment.provider_ref ?? '' };
  if (payment.status === 'failed') return { status: 'failed', providerRef: payment.provider_ref, reason: payment.failure_reason ?? 'The payment failed.' };
  return null;
}

/**
 * The provider did not answer: not the customer's failure, so no attempt is counted and no event
 * emitted. The claim is given up and the subscription tried again after PROVIDER_RETRY_MS, with
 * the same payment row (same idempotency key).
 */
async function retryLater(deps: CommerceDeps, sub: SubscriptionRow, now: Date): Promise<void> {
  await deps.storage.db
    .updateTable('subscriptions')
    .set({ claimed_until: null, next_attempt_at: new Date(now.getTime() + PROVIDER_RETRY_MS).toISOString() })
    .where('id', '=', sub.id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .execute();
}

/**
 * A renewal payment its charging call did not settle (the provider did not answer, or the process
 * died during the call) that the provider reports succeeded (its webhook event; a failure is
 * recorded by processProviderEvent). It starts the next cycle — in the transaction that marks the
 * payment succeeded, and only if the cycle it paid for is still the current one, so the engine
 * and the event racing renew once; a paid first period starts its reservation.
 */
export async function settleRenewalFromProvider(
  deps: CommerceDeps,
  payment: PaymentRow,
  outcome: Extract<ChargeOutcome, { status: 'succeeded' }>,
): Promise<'credited' | 'unchanged'> {
  const { storage } = deps;
  const stamp = dateOf(deps.clock).toISOString();
  // The reference is `<subscription>:<cycle end (or first cycle's start)>:<attempt>`; the stamp has colons.
  const subscriptionId = payment.reference.slice(0, payment.reference.indexOf(':'));
  const cycleAt = payment.reference.slice(subscriptionId.length + 1, payment.reference.lastIndexOf(':'));
  const sub = await storage.db.selectFrom('subscriptions').selectAll().where('id', '=', subscriptionId).executeTakeFirst();
  if (!sub) return 'unchanged';
  if (sub.status === 'incomplete') {
    await startReservationFromProvider(deps, sub, payment, outcome.providerRef, stamp);
    return (await paymentStatus(deps, payment.id)) === 'succeeded' ? 'credited' : 'unchanged';
  }
  const current = sub.cycle_end_at === cycleAt && (sub.status === 'active' || sub.status === 'past_due');
  const renewed = await storage.db.transaction().execute(async (trx) => {
    const succeeded = { status: 'succeeded' as const, provider_ref: outcome.providerRef, updated_at: stamp };
    // Paid for a cycle that is over (cancelled meanwhile): recorded for a refund, never credited.
    if (!(await transitionPayment(trx, payment.id, ['pending', 'requires_action'], current ? succeeded : { ...succeeded, failure_reason: 'cycle_closed' }))) return false;
    if (!current) return false;
    const ending = (await findPlanIncludingDeleted(storage, sub.plan_id))!;
    const next = (sub.pending_plan_id && (await findPlanIncludingDeleted(storage, sub.pending_plan_id))) || ending;
    await startNextCycle(deps, trx, sub, ending, next, payment.id);
    return true;
  });
  return renewed ? 'credited' : 'unchanged';
}

async function paymentStatus(deps: CommerceDeps, id: string): Promise<PaymentRow['status'] | undefined> {
  return (await deps.storage.db.selectFrom('payments').select('status').where('id', '=', id).executeTakeFirst())?.status;
}

/** What is left of the ending cycle's credit goes by the ending plan's rollover rules. */
async function applyRollover(
  deps: CommerceDeps,
  trx: Transaction<Database>,
  sub: SubscriptionRow,
  ending: PlanRow,
  walletId: string,
  cancelling: boolean,
  at = sub.cycle_end_at,
): Promise<void> {
  const common = { merchantId: sub.merchant_id, walletId, at };
  // Cycle credit belongs to the cycle: a cancelled subscription keeps none of it.
  if (cancelling || ending.rollover_type === 'none') {
    await expireBucket(trx, deps.storage.dialect, { ...common, bucket: 'cycle', reference: `${sub.id}:${sub.cycle_end_at}` });
  }
  if (ending.bundle_rollover_type === 'none') {
    await expireBucket(trx, deps.storage.dialect, { ...common, bucket: 'bundle', reference: `${sub.id}:${sub.cycle_end_at}` });
  }
}

async function walletOf(trx: Transaction<Database>, connectionId: string): Promise<string> {
  const row = await trx.selectFrom('connections').select('wallet_id').where('id', '=', connectionId).executeTakeFirstOrThrow();
  return row.wallet_id;
}

/** Starts the cycle after `sub`'s current one, of plan `next`; `paidBy` is the payment of its period (none for a free plan). */
async function startNextCycle(deps: CommerceDeps, trx: Transaction<Database>, sub: SubscriptionRow, ending: PlanRow, next: PlanRow, paidBy: string | null): Promise<void> {
  // A plan with another interval counts its cycles from the moment it takes over.
  const anchor = next.billing_interval === ending.billing_interval ? (sub.cycle_anchor_at ?? sub.started_at) : sub.cycle_end_at;
  const cycleEnd = nextCycleEnd(new Date(anchor), next.billing_interval, new Date(sub.cycle_end_at)).toISOString();
  const changing = next.id !== ending.id;
  const renewed: SubscriptionRow = {
    ...sub,
    auto_top_up_bundle_id: changing ? await bundleAfterChange(trx, sub.auto_top_up_bundle_id, next) : sub.auto_top_up_bundle_id,
    cycle_anchor_at: anchor,
    plan_id: next.id,
    pending_plan_id: null,
    status: 'active',
    cycle_start_at: sub.cycle_end_at,
    cycle_end_at: cycleEnd,
    claimed_until: null,
    failed_attempts: 0,
    next_attempt_at: null,
  };
  const written = await trx
    .updateTable('subscriptions')
    .set({
      plan_id: renewed.plan_id,
      auto_top_up_bundle_id: renewed.auto_top_up_bundle_id,
      pending_plan_id: null,
      status: 'active',
      cycle_start_at: renewed.cycle_start_at,
      cycle_end_at: renewed.cycle_end_at,
      cycle_anchor_at: anchor,
      claimed_until: null,
      failed_attempts: 0,
      next_attempt_at: null,
    })
    .where('id', '=', sub.id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .executeTakeFirst();
  if (Number(written.numUpdatedRows) !== 1) return;
  const walletId = await walletOf(trx, sub.connection_id);
  await applyRollover(deps, trx, sub, ending, walletId, false);
  await grantCycleCredit(trx, sub, walletId, next, `${sub.id}:${renewed.cycle_start_at}`, renewed.cycle_start_at, { paidBy });
  await emitSubscriptionEvent(trx, 'subscription.renewed', renewed, renewed.cycle_start_at, {
    previous_plan_id: changing ? ending.id : undefined,
  });
  if (changing) {
    const type = planChangeOf(ending, next) === 'upgrade' ? 'upgrade' : 'downgrade';
    await emitSubscriptionUpdated(trx, renewed, { type, status: 'applied', previous_plan_id: ending.id, plan_id: next.id, effective_at: renewed.cycle_start_at }, renewed.cycle_start_at);
  }
}

async function cancel(
  deps: CommerceDeps,
  trx: Transaction<Database>,
  sub: SubscriptionRow,
  ending: PlanRow,
  at: string,
  reason: 'requested' | 'payment_failed' | 'customer_deleted' | 'payment_refunded',
): Promise<void> {
  const written = await trx
    .updateTable('subscriptions')
    .set({ status: 'cancelled', cancelled_at: at, claimed_until: null, next_attempt_at: null })
    .where('id', '=', sub.id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .where('status', '<>', 'cancelled')
    .executeTakeFirst();
  if (Number(written.numUpdatedRows) !== 1) return;
  await applyRollover(deps, trx, sub, ending, await walletOf(trx, sub.connection_id), true, at);
  await emitSubscriptionEvent(trx, 'subscription.cancelled', sub, at, { reason });
}

/**
 * A deleted customer's subscription ends with it, at once: nothing renews or charges a customer
 * that no longer exists (decision 0016). A reservation whose first period is still being charged
 * never started (no `subscription.created`, no credit) and is left to that charge: whoever learns
 * its outcome (the request, the provider's event, or the orphan settler after a crash) finds the
 * customer deleted and removes it (startPaidReservation), so a charge that went through is never
 * lost track of. Called inside the deletion's transaction, after the customer row was marked.
 */
export async function cancelDeletedCustomersSubscription(deps: CommerceDeps, trx: Transaction<Database>, connectionId: string, at: string): Promise<void> {
  const sub = await trx.selectFrom('subscriptions').selectAll().where('connection_id', '=', connectionId).where('status', '<>', 'cancelled').executeTakeFirst();
  if (!sub || sub.status === 'incomplete') return;
  const ending = await trx.selectFrom('plans').selectAll().where('id', '=', sub.plan_id).executeTakeFirstOrThrow();
  await cancel(deps, trx, sub, ending, at, 'customer_deleted');
}

/**
 * A plan period's payment the merchant refunded in full (decision 0044), in the refund's
 * transaction: when it paid for the cycle running now — it is the subscription's latest plan
 * payment and the plan has a price, so no later cycle started — the subscription ends at once, as
 * a cancellation does (what is left of its cycle credit expires), announced by
 * `subscription.cancelled` with the reason `payment_refunded`. A refund of an earlier cycle's
 * payment changes nothing of the subscription.
 */
export async function endRefundedPeriod(deps: CommerceDeps, trx: Transaction<Database>, payment: PaymentRow, subscriptionId: string, at: string): Promise<boolean> {
  const sub = await trx.selectFrom('subscriptions').selectAll().where('id', '=', subscriptionId).where('status', 'in', ['active', 'past_due']).executeTakeFirst();
  if (!sub) return false;
  const latest = await trx
    .selectFrom('payments')
    .select('id')
    .where('credit_reference', 'like', `${subscriptionId}:%`)
    .where('status', '=', 'succeeded')
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .executeTakeFirst();
  const plan = await trx.selectFrom('plans').selectAll().where('id', '=', sub.plan_id).executeTakeFirstOrThrow();
  if (latest?.id !== payment.id || BigInt(plan.period_amount) === 0n) return false;
  await cancel(deps, trx, sub, plan, at, 'payment_refunded');
  return true;
}

async function recordFailure(
  deps: CommerceDeps,
  trx: Transaction<Database>,
  sub: SubscriptionRow,
  ending: PlanRow,
  attempt: number,
  reason: string,
  now: Date,
): Promise<'past_due' | 'cancelled'> {
  const stamp = now.toISOString();
  const delay = RETRY_DELAYS_MS[attempt - 1];
  const failure = { attempt, reason, final: delay === undefined };
  if (delay === undefined) {
    await emitSubscriptionEvent(trx, 'subscription.payment_failed', sub, stamp, failure);
    await cancel(deps, trx, sub, ending, stamp, 'payment_failed');
    return 'cancelled';
  }
  const nextAttemptAt = new Date(now.getTime() + delay).toISOString();
  await trx
    .updateTable('subscriptions')
    .set({ status: 'past_due', failed_attempts: attempt, next_attempt_at: nextAttemptAt, claimed_until: null })
    .where('id', '=', sub.id)
    .where('cycle_end_at', '=', sub.cycle_end_at)
    .execute();
  await emitSubscriptionEvent(trx, 'subscription.payment_failed', sub, stamp, { ...failure, next_attempt_at: nextAttemptAt });
  return 'past_due';
}

/**
 * Runs the engine every `intervalMs` until stopped, then settles crash-orphaned reservations
 * (settleOrphanedReservations); a tick still running is not started twice. Stopping waits for the
 * subscription being renewed only (its payment call), not for the rest of the round.
 */
export function startRenewalScheduler(
  deps: CommerceDeps,
  opts: { intervalMs: number; onError: (err: unknown, subscriptionId?: string) => void },
): { stop(): Promise<void> } {
  return runEveryInterval(
    opts.intervalMs,
    (stopping) =>
      renewDueSubscriptions(deps, dateOf(deps.clock), { stopping, onError: opts.onError }).then(() =>
        stopping() ? undefined : settleOrphanedReservations(deps, dateOf(deps.clock)),
      ),
    opts.onError,
  );
}
