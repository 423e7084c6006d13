/**
 * The one small interface every payment provider implements. Tollgate credits a wallet only after
 * the provider reports `succeeded` for a payment (here, or later through the provider's own
 * events); everything else is the provider's business and stays in its module.
 */
export type ChargeOutcome =
  | { status: 'succeeded'; providerRef: string }
  /** The customer must complete an extra step (e.g. 3-D Secure) before the payment succeeds. */
  | { status: 'requires_action'; providerRef: string }
  | { status: 'failed'; providerRef: string | null; reason: string };

/** A payment method the provider keeps for off-session charges (renewals, auto top-up). */
export type SavedMethod = { providerRef: string; customerRef: string | null; label: string };

/** What the hosted checkout page collected for a provider (form fields by name). */
export type CheckoutDetails = Record<string, string>;

export type ChargeInput = {
  amount: bigint;
  /** The same key always names the same payment: a retry never charges twice. */
  idempotencyKey: string;
  description: string;
};

export interface PaymentProvider {
  readonly id: string;
  /**
   * Charges the customer present at checkout and saves the method for later charges. An amount of
   * zero only saves the method.
   */
  chargeAtCheckout(input: ChargeInput & { details: CheckoutDetails }): Promise<{ outcome: ChargeOutcome; saved: SavedMethod | null }>;
  /** Completes a payment that reported `requires_action`, once the customer did the extra step. */
  confirm(providerRef: string): Promise<ChargeOutcome>;
  /** Charges a saved method with no customer present. */
  chargeSaved(input: ChargeInput & { method: SavedMethod }): Promise<ChargeOutcome>;
  /** The fields the checkout page asks for. */
  readonly checkoutFields: readonly CheckoutField[];
  /**
   * Providers that report payments by webhook (Stripe): verifies a delivery's signature at the
   * app's time (throws when it does not verify) and returns the event.
   */
  verifyEvent?(rawBody: Buffer, signature: string | undefined, nowMs: number): ProviderEvent;
  /** The payment an event is about, as the provider has it now (events may arrive out of order). */
  paymentState?(paymentRef: string): Promise<ProviderPaymentState>;
  /**
   * Providers whose own hosted page takes the card (Stripe Checkout): starts a payment there and
   * returns its reference and the page to send the customer to. Nothing is charged yet; the
   * outcome is learnt from `paymentState` (the customer's return, or the provider's event).
   */
  startHostedCheckout?(input: HostedCheckoutInput): Promise<HostedCheckout>;
  /**
   * Closes an unfinished hosted checkout so that it can no longer be paid (the customer came back
   * to pay another way) and answers its state afterwards: `succeeded` when it was paid meanwhile,
   * else `failed` with the reason HOSTED_CHECKOUT_CLOSED.
   */
  closeHostedCheckout?(providerRef: string): Promise<ProviderPaymentState>;
  /** The origins a hosted checkout's page lives on (the checkout form is redirected there). */
  readonly hostedCheckoutOrigins?: readonly string[];
  /**
   * The payment the provider made under our idempotency key (our payment row's id), as it is now;
   * null when the provider has none: it was never charged. Reconciliation asks this of payments
   * whose outcome Tollgate did not record (a crash, a timeout).
   */
  lookupPayment(idempotencyKey: string): Promise<ProviderPaymentState | null>;
  /**
   * Gives `amount` of a succeeded payment back to the customer. The key is our refund row's id,
   * so asking again never refunds twice. Throws ProviderUnavailableError when there is no answer.
   */
  refund(input: RefundInput): Promise<RefundOutcome>;
  /** The smallest step the provider refunds in (Stripe: one cent); any amount when absent. */
  readonly refundStep?: bigint;
}

export type RefundInput = { paymentRef: string; amount: bigint; idempotencyKey: string };

/** `succeeded`: the provider accepted the refund (its money goes back); `failed`: it refused it. */
export type RefundOutcome = { status: 'succeeded'; providerRef: string } | { status: 'failed'; providerRef: string | null; reason: string };

/** A payment to be taken on the provider's hosted page. */
export type HostedCheckoutInput = ChargeInput & {
  /** What the provider's page names as bought. */
  itemName: string;
  /** Where the provider sends the customer after paying, and when they go back without paying. */
  successUrl: string;
  cancelUrl: string;
  /** When the provider's page should stop taking the payment (the provider may bound it). */
  expiresAtMs: number;
  nowMs: number;
  /** The customer's email when known, so the provider's page need not ask for it. */
  email: string | null;
};

/** Started (the customer is sent to `url`), or refused before the provider was asked. */
export type HostedCheckout = { status: 'started'; providerRef: string; url: string } | { status: 'failed'; providerRef: null; reason: string };

/**
 * A hosted checkout that ended without a payment (closed for another attempt, or expired at the
 * provider): not a decline, so card-testing limits do not count it.
 */
export const HOSTED_CHECKOUT_CLOSED = 'hosted_checkout_closed';

/** A verified provider event; `paymentRef` is the provider's payment it is about, if any. */
export type ProviderEvent = { id: string; type: string; paymentRef: string | null };

/** A provider payment's current state: our payment row's id (from the provider's metadata), its outcome, the method it saved. */
export type ProviderPaymentState = { paymentId: string | null; outcome: ChargeOutcome; saved: SavedMethod | null };

export type CheckoutField = { name: string; label: string; autocomplete: string; inputmode?: 'numeric' | 'text'; pattern?: string; hint?: string };

// Defined in domain/ so that http/ maps it to a 503 without importing payments/.
export { ProviderUnavailableError, PROVIDER_RETRY_AFTER_S } from '../domain/payment-provider-errors.ts';

/** A payment's failure_reason when its provider did not answer: its event may still settle it. */
export const UNANSWERED = 'provider_unavailable';

/**
 * A payment's failure_reason when the reconciliation found that the provider never made it (the
 * process died before the call reached the provider, or a call that got no answer never arrived).
 */
export const NOT_CHARGED = 'not_charged';
