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
