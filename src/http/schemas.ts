import { z } from 'zod';
import { MAX_AMOUNT_UNITS, parseMoney } from '../domain/money.ts';
import { ERRORS } from './errors.ts';

/** A money amount on the wire: a decimal string with at most 10 fractional digits. */
export const decimalString = z
  .string()
  .regex(/^-?\d+(\.\d{1,10})?$/, 'must be a decimal string with at most 10 fractional digits');

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
