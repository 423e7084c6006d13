/**
 * The one table of error codes. Every error Tollgate returns uses a code from here,
 * and docs/errors.md is checked against this table by a test.
 */
export const ERRORS = {
  invalid_json: { status: 400, message: 'The request body is not valid JSON.' },
  validation_error: { status: 400, message: 'The request has invalid parameters.' },
  invalid_cursor: { status: 400, message: 'The cursor does not name an item of this list.' },
  invalid_metadata: { status: 400, message: 'The metadata is invalid.' },
  forward_token_json_invalid: { status: 400, message: 'The forward token is not valid base64-encoded JSON.' },
  forward_token_invalid: { status: 400, message: 'The forward token combines members in a way no client may send.' },
  unsupported_provider: { status: 400, message: 'The forward target is not a supported provider URL.' },
  webhook_limit_reached: { status: 400, message: 'A merchant may have at most 3 webhooks; delete one first.' },
  alert_limit_reached: { status: 400, message: 'A merchant may have at most 100 alerts; delete one first.' },
  webhook_url_refused: { status: 400, message: 'Webhooks may only call public https URLs.' },
  unsupported_format: { status: 400, message: 'The rewrite proxy does not translate this format.' },
  untranslatable_request: { status: 400, message: 'The request has fields the rewrite proxy cannot translate to the provider.' },
  provider_key_missing: {
    status: 400,
    message: 'No managed key is configured for this provider; pass provider_key in the forward token.',
  },
  webhook_signature_invalid: { status: 400, message: "The payment provider's webhook signature is missing or does not match the body." },
  auth_code_invalid: { status: 400, message: 'The authorization code is unknown.' },
  auth_code_used: { status: 400, message: 'The authorization code was already exchanged; run the login again.' },
  auth_code_expired: { status: 400, message: 'The authorization code expired (60 s); run the login again.' },
  unauthorized: { status: 401, message: 'A valid API key is required.' },
  spend_key_expired: { status: 401, message: 'This spend key has expired.' },
  payment_method_required: { status: 402, message: 'The plan is paid and the customer has no saved payment method.' },
  payment_failed: { status: 402, message: 'The payment provider declined the payment.' },
  refund_failed: { status: 402, message: 'The payment provider refused the refund; the credit was put back.' },
  insufficient_balance: { status: 402, message: 'The wallet balance cannot cover this request.' },
  spend_limit_reached: { status: 402, message: "The spend key's spend limit cannot cover this request." },
  forbidden: { status: 403, message: 'This key may not perform this action.' },
  spend_key_paused: { status: 403, message: 'This spend key is paused.' },
  request_shape_mismatch: { status: 403, message: "This endpoint does not accept the spend key's request shape." },
  provider_not_allowed: { status: 403, message: 'This spend key may not use this provider.' },
  model_not_allowed: { status: 403, message: 'This spend key may not use this model.' },
  request_limit_exhausted: { status: 403, message: "The spend key's total request limit is used up; it never resets." },
  not_found: { status: 404, message: 'The resource does not exist.' },
  route_not_found: { status: 404, message: 'No such endpoint.' },
  method_not_allowed: { status: 405, message: 'This method is not allowed on this endpoint.' },
  conflict: { status: 409, message: 'The request conflicts with the current state.' },
  last_secret_key: { status: 409, message: 'The last secret key of a merchant cannot be deleted.' },
  meter_slug_taken: { status: 409, message: 'Another meter of this merchant already uses this slug.' },
  reference_id_taken: { status: 409, message: 'Another customer of this merchant already uses this reference_id.' },
  subscription_exists: { status: 409, message: 'The customer is already subscribed to this plan.' },
  subscription_cancelled: { status: 409, message: 'The subscription is cancelled.' },
  payment_not_refundable: { status: 409, message: 'Only a succeeded payment that credited a wallet (or was never credited) can be refunded.' },
  refund_exceeds_unspent_credit: { status: 409, message: 'The refund is more than the payment has left, or than the credit the customer has not spent.' },
  plan_in_use: { status: 409, message: 'Live subscriptions use this plan; cancel them before deleting it.' },
  request_id_conflict: { status: 409, message: 'This request_id was already recorded with a different body.' },
  idempotency_key_in_use: { status: 409, message: 'A request with this Idempotency-Key is still in progress.' },
  idempotent_answer_not_kept: {
    status: 409,
    message: 'The request with this Idempotency-Key was answered and charged, but its answer was not kept for replays; send a new key for a new request.',
  },
  payload_too_large: { status: 413, message: 'The request body is too large.' },
  unsupported_media_type: { status: 415, message: 'The request body must be JSON.' },
  idempotency_key_reused: {
    status: 422,
    message: 'This Idempotency-Key was used with a different request body.',
  },
  wallet_balance_limit: { status: 422, message: 'The credit would take the wallet above its maximum balance of 100000000.' },
  rate_limited: { status: 429, message: 'Too many requests; slow down.' },
  spend_key_rate_limited: { status: 429, message: "The spend key's rate limit is exhausted; retry after Retry-After seconds." },
  request_limit_reached: { status: 429, message: "The spend key's request limit for this cycle is reached." },
  internal_error: { status: 500, message: 'Something went wrong on our side.' },
  upstream_unreachable: { status: 502, message: 'The provider could not be reached.' },
  service_unavailable: { status: 503, message: 'The service is not ready.' },
  upstream_timeout: { status: 504, message: 'The provider did not answer in time.' },
} as const satisfies Record<string, { status: number; message: string }>;

export type ErrorCode = keyof typeof ERRORS;

export type Issue = { path: string[]; message: string };

export type ErrorEnvelope = {
  error: { message: string; code: ErrorCode; status: number; issues?: Issue[] };
};

/** Thrown anywhere below the routes; the error handler turns it into the envelope. */
export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly issues: Issue[] | undefined;
  readonly headers: Record<string, string>;

  constructor(code: ErrorCode, message?: string, opts: { issues?: Issue[]; headers?: Record<string, string> } = {}) {
    super(message ?? ERRORS[code].message);
    this.code = code;
    this.status = ERRORS[code].status;
    this.issues = opts.issues;
    this.headers = opts.headers ?? {};
  }

  toEnvelope(): ErrorEnvelope {
    return envelope(this.code, this.message, this.issues);
  }
}

export function envelope(code: ErrorCode, message?: string, issues?: Issue[]): ErrorEnvelope {
  const body: ErrorEnvelope['error'] = { message: message ?? ERRORS[code].message, code, status: ERRORS[code].status };
  if (issues && issues.length > 0) body.issues = issues;
  return { error: body };
}

export function validationError(issues: Issue[], message?: string): ApiError {
  const first = issues[0];
  const summary = first ? `${first.path.length ? first.path.join('.') + ': ' : ''}${first.message}` : undefined;
  return new ApiError('validation_error', message ?? (summary ? `Invalid request: ${summary}` : undefined), {
    issues,
  });
}

export function notFound(what: string, id: string): ApiError {
  return new ApiError('not_found', `No ${what} with id ${id}.`);
}
