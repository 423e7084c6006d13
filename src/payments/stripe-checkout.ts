import Stripe from 'stripe';
import { HOSTED_CHECKOUT_CLOSED, type ChargeOutcome, type HostedCheckout, type HostedCheckoutInput, type ProviderPaymentState } from './types.ts';

/**
 * Stripe Checkout, the card form Tollgate's hosted checkout sends the customer to when Stripe is
 * the provider (docs/decisions/0039-stripe-checkout.md). A Checkout Session in mode `payment`
 * (or `setup` for an amount of zero) on a Stripe customer made for it, cards only (`allowed_payment_method_types`); the
 * PaymentIntent saves the card for off-session charges (`setup_future_usage: off_session`), so
 * renewals and auto top-ups charge it later. Stripe's page takes the card, shows declines and runs
 * 3-D Secure itself; Tollgate learns the outcome by reading the session back (the customer's
 * return, or Stripe's `checkout.session.*` / `payment_intent.*` events) and credits only a session
 * Stripe reports paid.
 */

/** Metadata key naming our payment row, on the Checkout Session and on its PaymentIntent or SetupIntent. */
export const METADATA_KEY = 'tollgate_payment_id';
/**
 * Marks a PaymentIntent that a Checkout Session drives: a failed attempt on it (a declined card on
 * Stripe's page) is not the payment's end, since the customer may try another card on it.
 */
export const VIA_KEY = 'tollgate_via';
const VIA_CHECKOUT = 'stripe_checkout';

/** Stripe's own hosted Checkout pages. */
export const STRIPE_CHECKOUT_ORIGIN = 'https://checkout.stripe.com';

/** Stripe accepts a Checkout Session's expires_at between 30 minutes and 24 hours after its creation. */
const MIN_LIFETIME_S = 30 * 60 + 60;
const MAX_LIFETIME_S = 24 * 60 * 60 - 60;

/** What the adapter lends this module: its configured client and helpers, so Stripe's quirks stay in one place. */
export type StripeCheckoutContext = {
  stripe: Stripe;
  currency: string;
  /** Runs a call whose errors are not declines: no answer becomes ProviderUnavailableError. */
  answered<T>(call: () => Promise<T>): Promise<T>;
  outcomeOf(intent: Stripe.PaymentIntent): ChargeOutcome;
  savedOf(method: string | Stripe.PaymentMethod | null, customerId: string): ProviderPaymentState['saved'];
};

const EXPAND = ['payment_intent.payment_method', 'setup_intent.payment_method'];

export async function startStripeCheckout(ctx: StripeCheckoutContext, input: HostedCheckoutInput, cents: bigint): Promise<HostedCheckout> {
  const metadata = { [METADATA_KEY]: input.idempotencyKey };
  const customer = await ctx.answered(() =>
    ctx.stripe.customers.create(
      { metadata, ...(input.email ? { email: input.email } : {}) },
      { idempotencyKey: `${input.idempotencyKey}:customer` },
    ),
  );
  const nowS = Math.floor(input.nowMs / 1000);
  const expiresAt = Math.min(Math.max(Math.floor(input.expiresAtMs / 1000), nowS + MIN_LIFETIME_S), nowS + MAX_LIFETIME_S);
  const common = {
    customer: customer.id,
    client_reference_id: input.idempotencyKey,
    allowed_payment_method_types: ['card'],
    success_url: input.successUrl,
    cancel_url: input.cancelUrl,
    expires_at: expiresAt,
    metadata,
  } satisfies Stripe.Checkout.SessionCreateParams;
  const params: Stripe.Checkout.SessionCreateParams =
    cents === 0n
      ? // Nothing to pay: Stripe's page only saves the card (a SetupIntent for off-session use).
        { ...common, mode: 'setup', currency: ctx.currency, setup_intent_data: { description: input.description, metadata } }
      : {
          ...common,
          mode: 'payment',
          line_items: [{ quantity: 1, price_data: { currency: ctx.currency, unit_amount: Number(cents), product_data: { name: input.itemName } } }],
          payment_intent_data: { setup_future_usage: 'off_session', description: input.description, metadata: { ...metadata, [VIA_KEY]: VIA_CHECKOUT } },
        };
  const session = await ctx.answered(() => ctx.stripe.checkout.sessions.create(params, { idempotencyKey: `${input.idempotencyKey}:checkout` }));
  if (!session.url) throw new Error(`Stripe gave checkout session ${session.id} no URL.`);
  return { status: 'started', providerRef: session.id, url: session.url };
}

/** A Checkout Session as Stripe has it now: paid (with the card it saved), still open, or ended unpaid. */
export async function stripeCheckoutState(ctx: StripeCheckoutContext, id: string): Promise<ProviderPaymentState> {
  const session = await ctx.answered(() => ctx.stripe.checkout.sessions.retrieve(id, { expand: EXPAND }));
  return stateOf(ctx, session);
}

/**
 * Expires an open Checkout Session so that its page can no longer pay. A session Stripe will not
 * expire (it completed meanwhile) is read back: its payment, if made, is then credited, not lost.
 */
export async function closeStripeCheckout(ctx: StripeCheckoutContext, id: string): Promise<ProviderPaymentState> {
  const current = await stripeCheckoutState(ctx, id);
  if (current.outcome.status !== 'requires_action') return current;
  try {
    await ctx.answered(() => ctx.stripe.checkout.sessions.expire(id, {}, { idempotencyKey: `${id}:expire` }));
  } catch (e) {
    // Stripe refuses to expire a session that is no longer open: it completed meanwhile.
    if (!(e instanceof Stripe.errors.StripeInvalidRequestError)) throw e;
  }
  return stripeCheckoutState(ctx, id);
}

/**
 * A PaymentIntent's outcome, knowing that a Checkout Session may drive it: there a failed attempt
 * (`requires_payment_method`) only means the customer is still on Stripe's page, trying a card.
 */
export function intentOutcome(ctx: StripeCheckoutContext, intent: Stripe.PaymentIntent): ChargeOutcome {
  const outcome = ctx.outcomeOf(intent);
  const driven = intent.metadata?.[VIA_KEY] === VIA_CHECKOUT;
  return driven && intent.status === 'requires_payment_method' ? { status: 'requires_action', providerRef: intent.id } : outcome;
}

function stateOf(ctx: StripeCheckoutContext, session: Stripe.Checkout.Session): ProviderPaymentState {
  const paymentId = session.metadata?.[METADATA_KEY] ?? null;
  const customer = typeof session.customer === 'string' ? session.customer : (session.customer?.id ?? null);
  const closed = (): ProviderPaymentState => ({ paymentId, outcome: { status: 'failed', providerRef: session.id, reason: HOSTED_CHECKOUT_CLOSED }, saved: null });
  if (session.status === 'expired') return closed();
  if (session.status !== 'complete') return { paymentId, outcome: { status: 'requires_action', providerRef: session.id }, saved: null };
  if (session.mode === 'setup') {
    const setup = typeof session.setup_intent === 'object' ? session.setup_intent : null;
    if (!setup || setup.status !== 'succeeded') return { paymentId, outcome: { status: 'requires_action', providerRef: session.id }, saved: null };
    return { paymentId, outcome: { status: 'succeeded', providerRef: setup.id }, saved: customer ? ctx.savedOf(setup.payment_method, customer) : null };
  }
  const intent = typeof session.payment_intent === 'object' ? session.payment_intent : null;
  // Complete but not yet paid: an asynchronous method (cards are not); its event will tell.
  if (session.payment_status !== 'paid' || !intent || intent.status !== 'succeeded') {
    return { paymentId, outcome: { status: 'requires_action', providerRef: intent?.id ?? session.id }, saved: null };
  }
  return { paymentId, outcome: { status: 'succeeded', providerRef: intent.id }, saved: customer ? ctx.savedOf(intent.payment_method, customer) : null };
}
