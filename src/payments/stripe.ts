import Stripe from 'stripe';
import { z } from 'zod';
import { closeStripeCheckout, intentOutcome, startStripeCheckout, STRIPE_CHECKOUT_ORIGIN, stripeCheckoutState, type StripeCheckoutContext } from './stripe-checkout.ts';
import {
  ProviderUnavailableError,
  type ChargeInput,
  type ChargeOutcome,
  type CheckoutDetails,
  type CheckoutField,
  type HostedCheckout,
  type HostedCheckoutInput,
  type PaymentProvider,
  type ProviderEvent,
  type ProviderPaymentState,
  type RefundInput,
  type RefundOutcome,
  type SavedMethod,
} from './types.ts';

/**
 * The Stripe adapter, on the official `stripe` package. Every charge is a PaymentIntent whose
 * idempotency key is our payment row's id and whose metadata names that row
 * (`tollgate_payment_id`), so Stripe's events lead back to it. At checkout the customer's payment
 * method (a PaymentMethod id from Stripe's own card fields) is charged and saved on a new Stripe
 * customer (`setup_future_usage: off_session`); renewals and auto top-ups charge it off-session.
 * Only a PaymentIntent Stripe reports `succeeded` is a success: Tollgate credits nothing before.
 */
export type StripeSettings = {
  secretKey: string;
  webhookSecret: string;
  /** A currency with two decimals (cents), lower-case ISO code. */
  currency: string;
  /** Another API address (a stand-in in tests); Stripe's own when absent. */
  apiBase?: URL;
};

/** One cent in Tollgate's money units (1e-10). */
const UNITS_PER_CENT = 100_000_000n;
const METADATA_KEY = 'tollgate_payment_id';

export class StripePaymentProvider implements PaymentProvider {
  readonly id = 'stripe';
  readonly refundStep = UNITS_PER_CENT;
  readonly checkoutFields: readonly CheckoutField[] = [
    {
      name: 'payment_method',
      label: 'Stripe payment method',
      autocomplete: 'off',
      pattern: 'pm_[A-Za-z0-9_]+',
      hint: 'The PaymentMethod id (pm_…) Stripe gave for the card. In test mode, pm_card_visa pays.',
    },
  ];
  readonly #stripe: Stripe;
  readonly #settings: StripeSettings;
  /** Stripe Checkout's pages: Stripe's own, or the stand-in's (which serves them with its API) when the API is elsewhere. */
  readonly hostedCheckoutOrigins: readonly string[];
  readonly #checkout: StripeCheckoutContext;

  constructor(settings: StripeSettings) {
    this.#settings = settings;
    const base = settings.apiBase;
    this.#stripe = new Stripe(settings.secretKey, {
      // Network failures are retried with the same idempotency key: never a second charge.
      maxNetworkRetries: 2,
      timeout: 20_000,
      telemetry: false,
      ...(base
        ? { host: base.hostname, port: base.port || (base.protocol === 'https:' ? 443 : 80), protocol: base.protocol === 'http:' ? ('http' as const) : ('https' as const) }
        : {}),
    });
    this.hostedCheckoutOrigins = [base ? base.origin : STRIPE_CHECKOUT_ORIGIN];
    this.#checkout = { stripe: this.#stripe, currency: settings.currency, answered, outcomeOf, savedOf };
  }

  /** Stripe Checkout: the customer pays on Stripe's page (stripe-checkout.ts). */
  async startHostedCheckout(input: HostedCheckoutInput): Promise<HostedCheckout> {
    const cents = centsOf(input.amount);
    if (cents === null) return { status: 'failed', providerRef: null, reason: NOT_WHOLE_CENTS };
    return startStripeCheckout(this.#checkout, input, cents);
  }

  async closeHostedCheckout(providerRef: string): Promise<ProviderPaymentState> {
    return closeStripeCheckout(this.#checkout, providerRef);
  }

  async chargeAtCheckout(input: ChargeInput & { details: CheckoutDetails }): Promise<{ outcome: ChargeOutcome; saved: SavedMethod | null }> {
    const paymentMethod = (input.details.payment_method ?? '').trim();
    if (!/^pm_[A-Za-z0-9_]+$/.test(paymentMethod)) return { outcome: { status: 'failed', providerRef: null, reason: 'Enter the Stripe payment method (pm_…).' }, saved: null };
    const cents = centsOf(input.amount);
    if (cents === null) return { outcome: notWholeCents(), saved: null };
    const customer = await answered(() =>
      this.#stripe.customers.create({ metadata: { [METADATA_KEY]: input.idempotencyKey } }, { idempotencyKey: `${input.idempotencyKey}:customer` }),
    );
    if (cents === 0n) {
      // Nothing to charge: the method is only saved for later charges.
      try {
        const attached = await this.#stripe.paymentMethods.attach(paymentMethod, { customer: customer.id }, { idempotencyKey: `${input.idempotencyKey}:attach` });
        return { outcome: { status: 'succeeded', providerRef: attached.id }, saved: savedOf(attached, customer.id) };
      } catch (e) {
        return { outcome: declined(e), saved: null };
      }
    }
    try {
      const intent = await this.#stripe.paymentIntents.create(
        {
          amount: Number(cents),
          currency: this.#settings.currency,
          customer: customer.id,
          payment_method: paymentMethod,
          confirm: true,
          setup_future_usage: 'off_session',
          // The page cannot follow a redirect-based method; cards confirm in place.
          automatic_payment_methods: { enabled: true, allow_redirects: 'never' },
          description: input.description,
          metadata: { [METADATA_KEY]: input.idempotencyKey },
          expand: ['payment_method'],
        },
        { idempotencyKey: input.idempotencyKey },
      );
      const outcome = outcomeOf(intent);
      return { outcome, saved: outcome.status === 'failed' ? null : savedOf(intent.payment_method, customer.id) };
    } catch (e) {
      return { outcome: declined(e), saved: null };
    }
  }

  /** Reads the PaymentIntent again: the customer may have completed the extra step with Stripe. */
  async confirm(providerRef: string): Promise<ChargeOutcome> {
    const intent = await answered(() => this.#stripe.paymentIntents.retrieve(providerRef));
    return outcomeOf(intent);
  }

  async chargeSaved(input: ChargeInput & { method: SavedMethod }): Promise<ChargeOutcome> {
    const cents = centsOf(input.amount);
    if (cents === null) return notWholeCents();
    if (!input.method.customerRef) return { status: 'failed', providerRef: null, reason: 'The saved payment method belongs to no Stripe customer.' };
    let intent: Stripe.PaymentIntent;
    try {
      intent = await this.#stripe.paymentIntents.create(
        {
          amount: Number(cents),
          currency: this.#settings.currency,
          customer: input.method.customerRef,
          payment_method: input.method.providerRef,
          off_session: true,
          confirm: true,
          description: input.description,
          metadata: { [METADATA_KEY]: input.idempotencyKey },
        },
        { idempotencyKey: input.idempotencyKey },
      );
    } catch (e) {
      return this.#offSessionRefused(e, input.idempotencyKey);
    }
    const outcome = outcomeOf(intent);
    if (outcome.status === 'succeeded') return outcome;
    // Nobody is present to finish it: cancelled, so it can never succeed without being credited.
    await answered(() => this.#stripe.paymentIntents.cancel(intent.id, {}, { idempotencyKey: `${input.idempotencyKey}:cancel` }));
    return { status: 'failed', providerRef: intent.id, reason: outcome.status === 'failed' ? outcome.reason : 'The payment needs the customer to confirm it.' };
  }

  /**
   * An off-session charge Stripe refused. The PaymentIntent it left (`requires_payment_method`) is
   * cancelled, so it can never be completed later without being credited; a card whose issuer
   * asks for 3-D Secure with nobody present says so, in words the merchant can act on.
   */
  async #offSessionRefused(e: unknown, idempotencyKey: string): Promise<ChargeOutcome> {
    const outcome = declined(e);
    if (outcome.status !== 'failed' || !outcome.providerRef) return outcome;
    const intentId = outcome.providerRef;
    await answered(() => this.#stripe.paymentIntents.cancel(intentId, {}, { idempotencyKey: `${idempotencyKey}:cancel` }));
    const code = e instanceof Stripe.errors.StripeError ? e.code : undefined;
    return code === 'authentication_required' ? { ...outcome, reason: AUTHENTICATION_REQUIRED } : outcome;
  }

  /** Verifies a webhook delivery with the package's own signature check, at the app's time `nowMs`. */
  verifyEvent(rawBody: Buffer, signature: string | undefined, nowMs: number): ProviderEvent {
    const problem = stripeSignatureHeaderProblem(signature, nowMs);
    if (problem) throw new InvalidProviderEvent(problem);
    let event: Stripe.Event;
    try {
      event = this.#stripe.webhooks.constructEvent(rawBody, signature!, this.#settings.webhookSecret, SIGNATURE_TOLERANCE_S, undefined, nowMs);
    } catch (e) {
      // Our own words: the package's messages (and a JSON parser's, for a signed body that is not
      // JSON) describe its internals, not the delivery.
      throw new InvalidProviderEvent(
        e instanceof Stripe.errors.StripeSignatureVerificationError ? 'The signature does not match the body.' : 'The signed body is not a JSON Stripe event.',
      );
    }
    const parsed = stripeEventShape.safeParse(event);
    if (!parsed.success) throw new InvalidProviderEvent('The signed body is not a Stripe event (it needs an id, a type and data.object).');
    const object = parsed.data.data.object;
    const about = object.object === 'payment_intent' || object.object === 'checkout.session';
    const paymentRef = about && typeof object.id === 'string' ? object.id : null;
    return { id: parsed.data.id, type: parsed.data.type, paymentRef };
  }

  /**
   * The PaymentIntent as Stripe has it now, not as the event saw it: events may arrive out of
   * order (a `payment_failed` of an earlier attempt after the `succeeded`), and the intent's
   * current status is the truth.
   */
  async paymentState(paymentRef: string): Promise<ProviderPaymentState> {
    if (paymentRef.startsWith('cs_')) return stripeCheckoutState(this.#checkout, paymentRef);
    const intent = await answered(() => this.#stripe.paymentIntents.retrieve(paymentRef, { expand: ['payment_method'] }));
    const outcome = intentOutcome(this.#checkout, intent);
    const customer = typeof intent.customer === 'string' ? intent.customer : (intent.customer?.id ?? null);
    return {
      paymentId: intent.metadata?.[METADATA_KEY] ?? null,
      outcome,
      saved: outcome.status === 'succeeded' && customer ? savedOf(intent.payment_method, customer) : null,
    };
  }

  async lookupPayment(idempotencyKey: string): Promise<ProviderPaymentState | null> {
    const found = await findIntentOfPayment(this.#stripe, idempotencyKey);
    return found ? this.paymentState(found) : null;
  }

  async refund(input: RefundInput): Promise<RefundOutcome> {
    return refundIntent(this.#stripe, input);
  }
}

/**
 * The PaymentIntent made for our payment row, found by the metadata every charge carries (Stripe's
 * search; its index may lag behind by a minute, which is why reconciliation asks only about
 * payments long past their call, and a later webhook event still settles one it missed).
 */
async function findIntentOfPayment(stripe: Stripe, paymentId: string): Promise<string | null> {
  if (!/^[A-Za-z0-9_-]+$/.test(paymentId)) return null;
  const found = await answered(() => stripe.paymentIntents.search({ query: `metadata['${METADATA_KEY}']:'${paymentId}'`, limit: 1 }));
  return found.data[0]?.id ?? null;
}

/**
 * A refund of a PaymentIntent, in whole cents, with our refund row's id as its idempotency key.
 * Stripe answers a card refund `pending` or `succeeded`; both are taken as accepted (a pending
 * card refund completes on Stripe's side). `failed` or `canceled`, or Stripe refusing the request,
 * is a refusal.
 */
async function refundIntent(stripe: Stripe, input: RefundInput): Promise<RefundOutcome> {
  const cents = centsOf(input.amount);
  if (cents === null || cents <= 0n) return { status: 'failed', providerRef: null, reason: 'Stripe refunds whole cents; the amount has a fraction of a cent.' };
  // A hosted checkout's payment is known by its Checkout Session; the refund names its PaymentIntent.
  const intentId = input.paymentRef.startsWith('cs_') ? await intentOfCheckout(stripe, input.paymentRef) : input.paymentRef;
  if (!intentId) return { status: 'failed', providerRef: null, reason: 'The Stripe Checkout Session has no payment to refund.' };
  let refund: Stripe.Refund;
  try {
    refund = await stripe.refunds.create(
      { payment_intent: intentId, amount: Number(cents), metadata: { tollgate_refund_id: input.idempotencyKey } },
      { idempotencyKey: input.idempotencyKey },
    );
  } catch (e) {
    if (e instanceof Stripe.errors.StripeInvalidRequestError) return { status: 'failed', providerRef: null, reason: e.message };
    throw noAnswer(e) ?? e;
  }
  if (refund.status === 'failed' || refund.status === 'canceled') return { status: 'failed', providerRef: refund.id, reason: `Stripe reports the refund ${refund.status}.` };
  return { status: 'succeeded', providerRef: refund.id };
}

/** The failure of an off-session charge whose card needs 3-D Secure: only the customer, present, can pay it. */
export const AUTHENTICATION_REQUIRED =
  'The card issuer requires the customer to authenticate this payment, which cannot be done without them; nothing was charged. The customer can pay through a checkout.';

/** A webhook delivery whose signature does not verify, or whose signed body is not an event. */
class InvalidProviderEvent extends Error {}

/** How far a signature's timestamp may be from now, either way: Stripe's documented five minutes. */
export const SIGNATURE_TOLERANCE_S = 300;

const stripeEventShape = z.object({
  id: z.string().min(1),
  type: z.string().min(1),
  data: z.object({ object: z.looseObject({ id: z.unknown().optional(), object: z.unknown().optional() }) }),
});

/**
 * What is wrong with a Stripe-Signature header on its face, or null: checked before the body is
 * read, so a delivery that cannot be Stripe's costs no upload. It must carry a timestamp `t=`
 * within five minutes of now, either way (the `stripe` package only refuses old ones), and at
 * least one `v1=` signature (a hex SHA-256 HMAC).
 */
export function stripeSignatureHeaderProblem(header: string | undefined, nowMs: number): string | null {
  if (!header) return 'The Stripe-Signature header is missing.';
  const pairs = header.split(',').map((item) => item.split('='));
  const timestamp = pairs.find(([key]) => key === 't')?.[1];
  const signed = pairs.some(([key, value]) => key === 'v1' && /^[0-9a-f]{64}$/.test(value ?? ''));
  if (timestamp === undefined || !/^\d{1,12}$/.test(timestamp) || !signed) {
    return 'The Stripe-Signature header is malformed: it needs t=<timestamp> and v1=<signature>.';
  }
  if (Math.abs(nowMs / 1000 - Number(timestamp)) > SIGNATURE_TOLERANCE_S) return 'The Stripe-Signature timestamp is more than 5 minutes from now.';
  return null;
}

/** Whole cents, or null when the amount has a fraction of a cent (Stripe charges whole minor units). */
function centsOf(amount: bigint): bigint | null {
  return amount % UNITS_PER_CENT === 0n ? amount / UNITS_PER_CENT : null;
}

const NOT_WHOLE_CENTS = 'Stripe charges whole cents; the amount has a fraction of a cent.';
const notWholeCents = (): ChargeOutcome => ({ status: 'failed', providerRef: null, reason: NOT_WHOLE_CENTS });

function outcomeOf(intent: Stripe.PaymentIntent): ChargeOutcome {
  switch (intent.status) {
    case 'succeeded':
      return { status: 'succeeded', providerRef: intent.id };
    case 'requires_action':
    case 'requires_confirmation':
    case 'processing':
      return { status: 'requires_action', providerRef: intent.id };
    default:
      return { status: 'failed', providerRef: intent.id, reason: intent.last_payment_error?.message ?? `The payment is ${intent.status.replace(/_/g, ' ')}.` };
  }
}

/**
 * A card error is a decline (the answer). No answer (unreachable, timed out, Stripe's own server
 * error or rate limit) is ProviderUnavailableError; anything else (our configuration) is thrown.
 */
function declined(e: unknown): ChargeOutcome {
  if (e instanceof Stripe.errors.StripeCardError || e instanceof Stripe.errors.StripeInvalidRequestError) {
    return { status: 'failed', providerRef: e.payment_intent?.id ?? null, reason: e.message };
  }
  throw noAnswer(e) ?? e;
}

/** Runs a call to Stripe whose errors are not declines: no answer is ProviderUnavailableError. */
async function answered<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (e) {
    throw noAnswer(e) ?? e;
  }
}

function noAnswer(e: unknown): ProviderUnavailableError | null {
  const unanswered = e instanceof Stripe.errors.StripeConnectionError || e instanceof Stripe.errors.StripeAPIError || e instanceof Stripe.errors.StripeRateLimitError;
  return unanswered ? new ProviderUnavailableError('stripe', e) : null;
}

function savedOf(method: string | Stripe.PaymentMethod | null, customerId: string): SavedMethod | null {
  if (!method) return null;
  if (typeof method === 'string') return { providerRef: method, customerRef: customerId, label: 'Card' };
  const card = method.card;
  return { providerRef: method.id, customerRef: customerId, label: card ? `${capitalised(card.brand)} ending ${card.last4}` : 'Payment method' };
}

const capitalised = (s: string) => s.charAt(0).toUpperCase() + s.slice(1);

async function intentOfCheckout(stripe: Stripe, sessionId: string): Promise<string | null> {
  const session = await answered(() => stripe.checkout.sessions.retrieve(sessionId));
  const intent = session.payment_intent;
  return typeof intent === 'string' ? intent : (intent?.id ?? null);
}
