import { HOSTED_CHECKOUT_CLOSED, ProviderUnavailableError, UNANSWERED, type HostedCheckout } from '../payments/types.ts';
import { keepCheckoutContact, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import type { CustomerEventData } from '../storage/connections.ts';
import { findPayment, transitionPayment } from '../storage/subscriptions.ts';
import { failCheckoutPayment, insertCheckoutPayment, overMaximumBalance, passesMaximumBalance, settleCheckoutFromProvider, type PayInput, type PayResult, type Purchase } from './checkout.ts';
import type { PurchaseDeps } from './subscriptions.ts';

/**
 * A checkout paid on the payment provider's own hosted page (Stripe Checkout): Tollgate's page
 * takes the amount and the contact, records the payment (`pending`), asks the provider for a page
 * and sends the customer there; the payment is then `requires_action` with the provider's
 * reference. It is settled — credited once, by the compare-and-sets of checkout.ts — by whichever
 * comes first: the customer's return (`returnFromHostedCheckout`) or the provider's event
 * (provider-events.ts). Both read the payment's state from the provider, never from the request.
 */
export type HostedPayResult = PayResult | { status: 'redirect'; url: string };

export type HostedCheckoutUrls = {
  /** Where the provider sends the customer once paid (Tollgate's return page). */
  successUrl: string;
  /** Where the customer goes back to without paying (Tollgate's checkout page). */
  cancelUrl: string;
};

const IN_PROGRESS = 'A payment for this checkout is already in progress.';

export async function startHostedCheckout(deps: PurchaseDeps, input: PayInput, urls: HostedCheckoutUrls): Promise<HostedPayResult> {
  const { storage, payments } = deps;
  if (!payments.startHostedCheckout) throw new Error(`The payment provider ${payments.id} has no hosted checkout.`);
  if (await passesMaximumBalance(deps, input)) return overMaximumBalance();
  const stamp = input.at.toISOString();
  let payment = await insertCheckoutPayment(deps, input, stamp);
  if (!payment) {
    // An earlier attempt is still live (the customer came back from the provider's page).
    const ended = await endEarlierAttempt(deps, input);
    if (ended) return ended;
    payment = await insertCheckoutPayment(deps, input, stamp);
    if (!payment) return { status: 'failed', message: IN_PROGRESS };
  }
  // The provider's event may complete the session instead of the return: it finds the contact there.
  if (!input.session.connection_id) await keepCheckoutContact(storage.db, input.session.id, input.contact);
  let started: HostedCheckout;
  try {
    started = await payments.startHostedCheckout({
      amount: input.amount,
      idempotencyKey: payment.id,
      description: `Checkout ${input.session.id}`,
      itemName: itemName(input.purchase, input.session.mode),
      ...urls,
      expiresAtMs: Date.parse(input.session.expires_at),
      nowMs: input.at.getTime(),
      email: input.contact.email,
    });
  } catch (e) {
    if (!(e instanceof ProviderUnavailableError)) throw e;
    // Nobody has the page's address if the provider made one: it expires unpaid at the provider.
    await failCheckoutPayment(deps, payment, input.session.id, ['pending'], { failure_reason: UNANSWERED }, stamp);
    return { status: 'unavailable' };
  }
  if (started.status === 'failed') {
    await failCheckoutPayment(deps, payment, input.session.id, ['pending'], { failure_reason: started.reason }, stamp);
    return { status: 'failed', message: started.reason };
  }
  await transitionPayment(storage.db, payment.id, ['pending'], { status: 'requires_action', provider_ref: started.providerRef, updated_at: stamp });
  return { status: 'redirect', url: started.url };
}

/**
 * The customer is back from the provider's page (its success address): the payment is read from
 * the provider and settled, unless the provider's event did so first — then the session is
 * already complete, and the same success page is shown.
 */
export async function returnFromHostedCheckout(deps: PurchaseDeps, session: CheckoutSessionRow, customerEventData: CustomerEventData): Promise<PayResult> {
  if (session.completed_at) return { status: 'completed', session };
  const payment = await findPayment(deps.storage.db, 'checkout', session.id);
  if (!payment || payment.status !== 'requires_action' || !payment.provider_ref || !deps.payments.paymentState) {
    return { status: 'failed', message: 'No payment of this checkout is waiting for the payment provider. Nothing was charged.' };
  }
  let state;
  try {
    state = await deps.payments.paymentState(payment.provider_ref);
  } catch (e) {
    if (e instanceof ProviderUnavailableError) return { status: 'unavailable' };
    throw e;
  }
  const settled = await settleCheckoutFromProvider(deps, payment, state.outcome, state.saved, customerEventData);
  if (settled === 'not_open') return settledMeanwhile(deps, session);
  if (settled.status === 'failed' && state.outcome.status === 'failed' && state.outcome.reason === HOSTED_CHECKOUT_CLOSED) {
    return { status: 'failed', message: 'The payment page closed before it was paid. Nothing was charged; you can pay again.' };
  }
  if (settled.status === 'requires_action') {
    return { status: 'failed', message: 'The payment provider has not confirmed this payment yet. Nothing was credited; pay again to finish it.' };
  }
  return settled;
}

/**
 * Ends a session's live attempt so that a new one can start. An attempt on the provider's page
 * is closed there first, so it can no longer pay; if it had paid meanwhile, it is settled instead
 * (credited) and the customer sees the completed checkout. Null when the attempt has ended.
 */
async function endEarlierAttempt(deps: PurchaseDeps, input: PayInput): Promise<PayResult | null> {
  const live = await findPayment(deps.storage.db, 'checkout', input.session.id);
  if (!live) return null;
  if (live.status !== 'requires_action' || !live.provider_ref || !deps.payments.closeHostedCheckout) return { status: 'failed', message: IN_PROGRESS };
  let state;
  try {
    state = await deps.payments.closeHostedCheckout(live.provider_ref);
  } catch (e) {
    if (e instanceof ProviderUnavailableError) return { status: 'unavailable' };
    throw e;
  }
  const settled = await settleCheckoutFromProvider(deps, live, state.outcome, state.saved, input.customerEventData);
  if (settled === 'not_open') {
    const meanwhile = await settledMeanwhile(deps, input.session);
    return meanwhile.status === 'completed' ? meanwhile : null;
  }
  if (settled.status === 'completed') return settled;
  return state.outcome.status === 'failed' ? null : { status: 'failed', message: IN_PROGRESS };
}

/** The session after someone else (the provider's event, another tab) settled its payment. */
async function settledMeanwhile(deps: PurchaseDeps, session: CheckoutSessionRow): Promise<PayResult> {
  const now = await deps.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', session.id).executeTakeFirstOrThrow();
  if (now.completed_at) return { status: 'completed', session: now };
  return { status: 'failed', message: 'The payment did not go through. Nothing was charged; you can pay again.' };
}

/** What the provider's page names as bought. */
function itemName(purchase: Purchase, mode: CheckoutSessionRow['mode']): string {
  if (purchase.kind === 'plan') {
    const { plan, terms } = purchase;
    // A plan change is no first period (decision 0037): an upgrade starts a new one now, a downgrade at the cycle's end.
    if (terms.change === 'upgrade') return `Upgrade to ${plan.name}, a new ${plan.billing_interval} from today`;
    if (terms.change === 'downgrade') return `Change to ${plan.name} from ${terms.effectiveAt!.slice(0, 10)}`;
    return `${plan.name} subscription, first ${plan.billing_interval}`;
  }
  if (purchase.kind === 'bundle') return `${purchase.bundle.name} credit bundle`;
  return mode === 'onboarding' ? 'Wallet set-up' : 'Wallet top-up';
}
