import { z } from 'zod';
import { MAX_AMOUNT_UNITS, parseMoney } from '../domain/money.ts';
import { ERRORS } from './errors.ts';

/**
 * A non-negative amount. The format check aborts on failure: the range check parses the amount,
 * and a malformed one must be a 400, never a throw.
 */
export const nonNegativeDecimal = z
  .string()
  .regex(/^\d+(\.\d{1,10})?$/, {
    error: 'must be a non-negative decimal string with at most 10 fractional digits',
    abort: true,
  })
  .refine((v) => parseMoney(v) <= MAX_AMOUNT_UNITS, 'must be at most 100000000');

/** A positive amount, e.g. a credit. */
export const positiveDecimal = nonNegativeDecimal.refine((v) => parseMoney(v) > 0n, 'must be greater than 0');

export const idParams = z.object({ id: z.string().min(1).max(100) });

/** A customer, named by its id or by its reference_id (up to 255 characters), wherever a customer id goes. */
export const customerRef = z.string().min(1).max(255);
export const customerParams = z.object({ id: customerRef.describe('The customer id, or its reference_id') });

export const deletedResponse = z.object({ id: z.string(), deleted: z.literal(true) });
export const successResponse = z.object({ success: z.literal(true) });

const errorSchema = z.object({
  error: z.object({
    message: z.string(),
    code: z.enum(Object.keys(ERRORS) as [keyof typeof ERRORS, ...(keyof typeof ERRORS)[]]),
    status: z.number().int(),
    issues: z.array(z.object({ path: z.array(z.string()), message: z.string() })).optional(),
  }),
});

/** A documented error response beyond the standard ones, e.g. a route's own 409. */
export const errorResponse = (description: string) => errorSchema.describe(description);

/** The documented error responses every authenticated endpoint can give. */
export const standardErrors = {
  400: errorSchema.describe('Invalid request'),
  401: errorSchema.describe('Missing, invalid or revoked API key'),
  404: errorSchema.describe('Not found'),
  429: errorSchema.describe('Rate limited'),
} as const;

/**
 * A body every field of which is optional. Fastify validates an absent body (a JSON content type
 * with no bytes, as the published client sends it) as `null`, so it is read as `{}`.
 */
export function optionalBody<T extends z.ZodType>(schema: T) {
  return z.preprocess((body) => body ?? {}, schema);
}

type OpenApiOperation = {
  security?: unknown[];
  parameters?: Record<string, unknown>[];
  requestBody?: unknown;
  responses?: Record<string, { description?: string; content?: unknown; headers?: Record<string, unknown> }>;
};
type OpenApiDocument = { paths?: Record<string, Record<string, OpenApiOperation>> };

const integerHeader = (description: string) => ({ description, schema: { type: 'integer' } });
const RATE_LIMIT_HEADERS = {
  'X-RateLimit-Limit': integerHeader('Requests allowed per minute for this API key.'),
  'X-RateLimit-Remaining': integerHeader('Requests left in the current one-minute window.'),
  'X-RateLimit-Reset': integerHeader('When the current window ends, in Unix seconds.'),
};
const RETRY_AFTER = { 'Retry-After': integerHeader('Seconds to wait before retrying.') };

/**
 * Adds to the generated document what the shared hooks do on every standard endpoint, which the
 * route schemas do not state one by one: rate-limit headers, Idempotency-Key on POST (with its
 * 409 and 422) and the body-level 413/415. Public operations (`security: []`) are left alone.
 */
export function documentSharedBehaviour<T extends object>(document: T): T {
  for (const operations of Object.values((document as OpenApiDocument).paths ?? {})) {
    for (const [method, operation] of Object.entries(operations)) {
      if (operation.security?.length === 0 || !operation.responses) continue;
      documentOperation(method, operation, operation.responses);
    }
  }
  return document;
}

function documentOperation(method: string, operation: OpenApiOperation, responses: NonNullable<OpenApiOperation['responses']>): void {
  const content = responses['400']?.content;
  const error = (description: string, headers: Record<string, unknown> = {}) => ({ description, content, headers });
  if (method === 'post') {
    operation.parameters = [
      ...(operation.parameters ?? []),
      {
        name: 'Idempotency-Key',
        in: 'header',
        required: false,
        description: 'Makes a retry safe: the same key and body within 24 h replay the stored response.',
        schema: { type: 'string', minLength: 1, maxLength: 255 },
      },
    ];
    for (const [status, response] of Object.entries(responses)) {
      if (status.startsWith('2')) {
        response.headers = { ...response.headers, 'Idempotent-Replayed': { description: '`true` on a replayed response.', schema: { type: 'string', enum: ['true'] } } };
      }
    }
    responses['409'] ??= error('Conflict: `idempotency_key_in_use` while a request with this Idempotency-Key runs (see Retry-After), or a conflict with existing data.', RETRY_AFTER);
    responses['422'] ??= error('`idempotency_key_reused`: this Idempotency-Key was used with a different body.');
  }
  if (operation.requestBody) {
    responses['413'] ??= error('`payload_too_large`: the body is over 10 MiB.');
    responses['415'] ??= error('`unsupported_media_type`: the body is not JSON.');
  }
  if (responses['429']) responses['429'].headers = { ...responses['429'].headers, ...RETRY_AFTER };
  for (const [status, response] of Object.entries(responses)) {
    // Authentication runs before the limiter: a 401 carries no rate-limit headers.
    if (status !== '401') response.headers = { ...response.headers, ...RATE_LIMIT_HEADERS };
  }
}
