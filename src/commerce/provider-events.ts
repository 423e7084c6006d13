import { NOT_CHARGED, UNANSWERED, type ChargeOutcome, type ProviderEvent, type ProviderPaymentState } from '../payments/types.ts';
import type { CustomerEventData } from '../storage/connections.ts';
import { isUniqueViolation } from '../storage/errors.ts';
import { transitionPayment, type PaymentRow } from '../storage/subscriptions.ts';
import { settleTopUpFromProvider } from './auto-top-up.ts';
import { settleCheckoutFromProvider } from './checkout.ts';
import { settleRenewalFromProvider } from './renewals.ts';
import type { PurchaseDeps } from './subscriptions.ts';

/**
 * A payment provider's webhook events (Stripe's). An event is only a hint that one of our payments
 * changed: the payment's state is read from the provider again, so an event delivered twice, late
 * or out of order leads to the same decision, and every change of a payment is a compare-and-set
 * on its status, so it credits once. Each event id is recorded in `provider_events` once it has
 * been processed; a delivery of a recorded id is answered without any work.
 */
export type EventResult = 'duplicate' | 'ignored' | 'credited' | 'failed' | 'unchanged';

export async function processProviderEvent(deps: PurchaseDeps, event: ProviderEvent, customerEventData: CustomerEventData): Promise<EventResult> {
  const provider = deps.payments.id;
  const seen = await deps.storage.db
    .selectFrom('provider_events')
    .select('event_id')
    .where('provider', '=', provider)
    .where('event_id', '=', event.id)
    .executeTakeFirst();
  if (seen) return 'duplicate';
  const result = await applyEvent(deps, event, customerEventData);
  // Recorded after its work: a crash in between only means the provider's retry does the (idempotent) work again.
  try {
    await deps.storage.db.insertInto('provider_events').values({ provider, event_id: event.id, type: event.type, received_at: new Date(deps.clock.now()).toISOString() }).execute();
  } catch (e) {
    if (!isUniqueViolation(e)) throw e;
  }
  return result;
}

async function applyEvent(deps: PurchaseDeps, event: ProviderEvent, customerEventData: CustomerEventData): Promise<EventResult> {
  if (!event.paymentRef || !deps.payments.paymentState) return 'ignored';
  return settleFromProviderState(deps, await deps.payments.paymentState(event.paymentRef), customerEventData);
}

/**
 * Settles our payment as the provider has it now: what an event leads to, and what the
 * reconciliation does with the answer to its own question (reconciliation.ts).
 */
export async function settleFromProviderState(deps: PurchaseDeps, state: ProviderPaymentState, customerEventData: CustomerEventData): Promise<EventResult> {
  if (!state.paymentId) return 'ignored';
  const payment = await deps.storage.db
    .selectFrom('payments')
    .selectAll()
    .where('id', '=', state.paymentId)
    .where('provider', '=', deps.payments.id)
    .executeTakeFirst();
  if (!payment) return 'unchanged';
  const { outcome } = state;
  if (outcome.status === 'requires_action') return 'unchanged';
  if (!['pending', 'requires_action'].includes(payment.status) && !(await reopenUnanswered(deps, payment, outcome))) return 'unchanged';
  if (payment.purpose === 'checkout') {
    const settled = await settleCheckoutFromProvider(deps, payment, outcome, state.saved, customerEventData);
    if (settled === 'not_open') return 'unchanged';
    return settled.status === 'completed' ? 'credited' : outcome.status === 'failed' ? 'failed' : 'unchanged';
  }
  // Renewals and auto top-ups are settled by their charging call; the event settles those the
  // call did not (the provider did not answer it, or its process died), by the same compare-and-set.
  // A failure is recorded on the payment; the renewal engine (or the orphan settler) draws its
  // consequences on its next pass, as for a decline of its own.
  if (outcome.status === 'failed') {
    const changed = await transitionPayment(deps.storage.db, payment.id, ['pending', 'requires_action'], {
      status: 'failed',
      provider_ref: outcome.providerRef,
      failure_reason: outcome.reason,
      updated_at: new Date(deps.clock.now()).toISOString(),
    });
    return changed ? 'failed' : 'unchanged';
  }
  if (payment.purpose === 'renewal') return settleRenewalFromProvider(deps, payment, outcome);
  return settleTopUpFromProvider(deps, payment, outcome);
}

/**
 * A payment recorded failed because its provider did not answer (UNANSWERED), or because the
 * reconciliation did not find it at the provider (NOT_CHARGED, its search may lag), that the
 * provider did take after all is settled like a pending one: it is made pending again
 * (compare-and-set, so once) and the caller settles it. Any other settled payment stays as it is.
 */
async function reopenUnanswered(deps: PurchaseDeps, payment: PaymentRow, outcome: ChargeOutcome): Promise<boolean> {
  const reason = payment.failure_reason;
  if (payment.status !== 'failed' || (reason !== UNANSWERED && reason !== NOT_CHARGED) || outcome.status !== 'succeeded') return false;
  const reopened = await deps.storage.db
    .updateTable('payments')
    .set({ status: 'pending', failure_reason: null })
    .where('id', '=', payment.id)
    .where('status', '=', 'failed')
    .where('failure_reason', '=', reason)
    .executeTakeFirst();
  if (Number(reopened.numUpdatedRows) !== 1) return false;
  payment.status = 'pending';
  payment.failure_reason = null;
  return true;
}
