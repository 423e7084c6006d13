import { sql } from 'kysely';
import { dateOf } from '../domain/clock.ts';
import { NOT_CHARGED, ProviderUnavailableError, UNANSWERED } from '../payments/types.ts';
import type { CustomerEventData } from '../storage/connections.ts';
import { findMerchantPayment } from '../storage/payments.ts';
import { findCheckoutSessionById, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import { findPayment, transitionPayment, type PaymentRow } from '../storage/subscriptions.ts';
import { isApiUpgradePayment } from './plan-changes.ts';
import { settleFromProviderState, type EventResult } from './provider-events.ts';
import { askProviderToRefund, refundPayment, UNCREDITED_REASONS } from './refunds.ts';
import type { PurchaseDeps } from './subscriptions.ts';
import { runEveryInterval } from './rounds.ts';

/**
 * The periodic reconciliation against the payment provider (decision 0038): whatever a crash, a
 * lost answer or a missed webhook event left undecided ends credited or refunded.
 *
 * 1. A payment still `pending` or `requires_action`, or recorded failed because the provider did
 *    not answer, long after its call (RECONCILE_AFTER_MS) is looked up at the provider by its
 *    idempotency key and settled as the provider's event would have settled it (credited by the
 *    same compare-and-sets, so a late event or a racing caller credits once). One the provider
 *    never made is recorded failed `not_charged` — except a renewal's, which the renewal engine
 *    and the orphan settler charge again under the same key themselves.
 * 2. A payment the provider took but Tollgate could not credit (its checkout session or cycle had
 *    closed: `session_closed`, `cycle_closed`) is refunded in full, once.
 * 3. A refund the provider did not answer is asked again under its own key.
 */

/** How long after its creation a payment's own call is surely over (provider calls time out well before). */
export const RECONCILE_AFTER_MS = 15 * 60_000;
/** A refund whose provider did not answer is asked again after this long. */
export const REFUND_RETRY_MS = 5 * 60_000;
/** Payments older than this that are failed for want of an answer are no longer asked about. */
const UNANSWERED_LOOKBACK_MS = 7 * 24 * 60 * 60_000;
const BATCH = 50;

export type ReconcileReport = { settled: number; notCharged: number; refunded: number; refundsRetried: number };

export async function reconcilePayments(deps: PurchaseDeps, customerEventData: CustomerEventData, now: Date): Promise<ReconcileReport> {
  const report: ReconcileReport = { settled: 0, notCharged: 0, refunded: 0, refundsRetried: 0 };
  for (const payment of await undecidedPayments(deps, now)) {
    const result = await reconcilePayment(deps, payment, customerEventData);
    if (result === 'not_charged') report.notCharged += 1;
    if (result === 'credited' || result === 'failed') report.settled += 1;
  }
  for (const payment of await paidButNeverCredited(deps)) {
    const result = await refundPayment(deps, { merchantId: payment.merchant_id, paymentId: payment.id, reason: `Paid after its ${payment.failure_reason === 'session_closed' ? 'checkout' : 'cycle'} closed; never credited` });
    if (result.ok) report.refunded += 1;
  }
  report.refundsRetried = await retryUnansweredRefunds(deps, now);
  return report;
}

/**
 * Asks the provider about one payment and settles it as its event would: 'not_charged' when the
 * provider never made it (and it was recorded so), 'unanswered' when the provider did not answer.
 */
async function reconcilePayment(deps: PurchaseDeps, payment: PaymentRow, customerEventData: CustomerEventData): Promise<EventResult | 'not_charged' | 'unanswered'> {
  let state;
  try {
    // A payment with the provider's reference is read by it (a hosted checkout still open is
    // not "never charged"); one without is looked up by its idempotency key.
    state = payment.provider_ref && deps.payments.paymentState ? await deps.payments.paymentState(payment.provider_ref) : await deps.payments.lookupPayment(payment.id);
  } catch (e) {
    if (e instanceof ProviderUnavailableError) return 'unanswered';
    throw e;
  }
  if (state === null) return (await recordNotCharged(deps, payment)) ? 'not_charged' : 'unchanged';
  return settleFromProviderState(deps, { ...state, paymentId: payment.id }, customerEventData);
}

/**
 * A checkout whose payment is still `pending` this long after it was written has no request
 * paying it any more (the one that wrote it died, or is about to give up): a customer paying again
 * has it settled at once rather than waiting for the periodic round (RECONCILE_AFTER_MS).
 */
export const STALE_ATTEMPT_MS = 10_000;

/**
 * Before a checkout is paid again: its earlier payment, left `pending` longer than
 * STALE_ATTEMPT_MS (a crashed request), is looked up at the provider and settled now — credited,
 * which completes the session (returned, to be shown as paid), or failed `not_charged`, which
 * frees the session for this attempt (null). Null too when there is nothing stale to settle.
 */
export async function settleStaleCheckoutAttempt(deps: PurchaseDeps, session: CheckoutSessionRow, customerEventData: CustomerEventData, now: Date): Promise<CheckoutSessionRow | null> {
  const live = await findPayment(deps.storage.db, 'checkout', session.id);
  if (!live || live.status !== 'pending' || live.provider !== deps.payments.id || now.getTime() - Date.parse(live.created_at) < STALE_ATTEMPT_MS) return null;
  await reconcilePayment(deps, live, customerEventData);
  const after = await findCheckoutSessionById(deps.storage.db, session.id);
  return after?.completed_at ? after : null;
}

async function undecidedPayments(deps: PurchaseDeps, now: Date): Promise<PaymentRow[]> {
  const before = new Date(now.getTime() - RECONCILE_AFTER_MS).toISOString();
  const since = new Date(now.getTime() - UNANSWERED_LOOKBACK_MS).toISOString();
  return deps.storage.db
    .selectFrom('payments')
    .selectAll()
    .where('created_at', '<', before)
    .where((eb) =>
      eb.or([eb('status', 'in', ['pending', 'requires_action']), eb.and([eb('status', '=', 'failed'), eb('failure_reason', '=', UNANSWERED), eb('created_at', '>', since)])]),
    )
    .where('provider', '=', deps.payments.id)
    .orderBy('created_at')
    .limit(BATCH)
    .execute();
}

/**
 * The provider has no payment under this key, so no money moved: the row is failed `not_charged`
 * (a checkout's gives its session's reference up, as a decline does). A renewal's is left to the
 * renewal engine, which asks again under the same key; but an upgrade's by POST /v1/subscriptions
 * has no engine behind it (its request answered 503), so it ends here like the others.
 */
async function recordNotCharged(deps: PurchaseDeps, payment: PaymentRow): Promise<boolean> {
  if ((payment.purpose === 'renewal' && !isApiUpgradePayment(payment)) || payment.status === 'requires_action') return false;
  const sessionId = payment.reference.split(':')[0]!;
  const released = payment.purpose === 'checkout' && payment.status === 'pending' ? { reference: `${sessionId}:${payment.id}` } : {};
  return transitionPayment(deps.storage.db, payment.id, [payment.status], {
    status: 'failed',
    failure_reason: NOT_CHARGED,
    ...released,
    updated_at: dateOf(deps.clock).toISOString(),
  });
}

/** Payments the provider took that were never credited and have no refund yet. */
async function paidButNeverCredited(deps: PurchaseDeps): Promise<PaymentRow[]> {
  return deps.storage.db
    .selectFrom('payments')
    .selectAll()
    .where('status', '=', 'succeeded')
    .where('failure_reason', 'in', [...UNCREDITED_REASONS])
    .where('provider', '=', deps.payments.id)
    .where(({ not, exists, selectFrom }) => not(exists(selectFrom('refunds').select(sql`1`.as('one')).whereRef('refunds.payment_id', '=', 'payments.id'))))
    .orderBy('created_at')
    .limit(BATCH)
    .execute();
}

async function retryUnansweredRefunds(deps: PurchaseDeps, now: Date): Promise<number> {
  const before = new Date(now.getTime() - REFUND_RETRY_MS).toISOString();
  const pending = await deps.storage.db.selectFrom('refunds').selectAll().where('status', '=', 'pending').where('updated_at', '<', before).orderBy('id').limit(BATCH).execute();
  let retried = 0;
  for (const refund of pending) {
    const payment = await findMerchantPayment(deps.storage.db, refund.merchant_id, refund.payment_id);
    if (!payment || payment.provider !== deps.payments.id) continue;
    if ((await askProviderToRefund(deps, refund, payment)).status !== 'pending') retried += 1;
  }
  return retried;
}

/**
 * Runs the reconciliation every `intervalMs` until stopped; a round still running is not started
 * twice, and stopping waits for it.
 */
export function startPaymentReconciler(
  deps: PurchaseDeps,
  opts: { intervalMs: number; customerEventData: CustomerEventData; onError: (err: unknown) => void },
): { stop(): Promise<void> } {
  return runEveryInterval(opts.intervalMs, () => reconcilePayments(deps, opts.customerEventData, dateOf(deps.clock)), opts.onError);
}
