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
}

/** A verified provider event; `paymentRef` is the provider's payment it is about, if any. */
export type ProviderEvent = { id: string; type: string; paymentRef: string | null };

/** A provider payment's current state: our payment row's id (from the provider's metadata), its outcome, the method it saved. */
export type ProviderPaymentState = { paymentId: string | null; outcome: ChargeOutcome; saved: SavedMethod | null };

export type CheckoutField = { name: string; label: string; autocomplete: string; inputmode?: 'numeric' | 'text'; pattern?: string; hint?: string };

/**
 * The provider gave no answer: unreachable, timed out, or its own server failed. Whether the
 * payment was made is not known; asking again with the same idempotency key never charges twice.
 * Callers record a retryable failure (checkout: 503 with Retry-After; renewals and auto top-up:
 * a failed attempt, retried), never a decline the customer caused.
 */
export class ProviderUnavailableError extends Error {
  constructor(readonly provider: string, cause: unknown) {
    super(`The payment provider ${provider} did not answer.`, { cause });
  }
}

/** Seconds a client is asked to wait before paying again while the provider does not answer. */
export const PROVIDER_RETRY_AFTER_S = 30;

/** A payment's failure_reason when its provider did not answer: its event may still settle it. */
export const UNANSWERED = 'provider_unavailable';
