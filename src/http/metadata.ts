import { z } from 'zod';
import { ApiError, type Issue } from './errors.ts';
import { jsonNestsDeeperThan, MAX_JSON_DEPTH } from './json-depth.ts';

const MAX_METADATA_PAIRS = 100;
const KEY_PATTERN = /^[A-Za-z0-9_]+$/;

const metadataKey = z
  .string()
  .min(1, 'metadata keys must be 1 to 255 characters')
  .max(255, 'metadata keys must be 1 to 255 characters')
  .regex(KEY_PATTERN, 'metadata keys may contain only ASCII letters, digits and underscores');

const metadataValue = z
  .string({ error: 'metadata values must be strings' })
  .min(1, 'metadata values must be 1 to 255 characters')
  .max(255, 'metadata values must be 1 to 255 characters')
  // Checked after JSON decoding: `\u0000` in a header or query parameter is a NUL only once
  // decoded, and PostgreSQL text cannot hold one.
  .refine((v) => !v.includes('\u0000'), 'metadata values must not contain the NUL character (\\u0000)');

/** The metadata object accepted in bodies: at most 100 string pairs with restricted keys. */
export const metadataSchema = z
  .record(metadataKey, metadataValue)
  .refine((m) => Object.keys(m).length <= MAX_METADATA_PAIRS, {
    message: `metadata holds at most ${MAX_METADATA_PAIRS} pairs`,
  });

export type Metadata = z.infer<typeof metadataSchema>;

/** `metadata_filters`: a JSON array of [key, value] string pairs, as the published client sends it. */
export const metadataFiltersSchema = z
  .array(z.tuple([metadataKey, metadataValue]))
  .max(MAX_METADATA_PAIRS, `at most ${MAX_METADATA_PAIRS} filters`);

export const METADATA_HEADER = 'x-service-metadata';

/**
 * Metadata sent outside a body, merged key by key: the `metadata` query parameter wins over the
 * `x-service-metadata` header (the more specific source wins; a header is often set once for a
 * whole client). Empty text counts as absent.
 */
export function outsideMetadata(fromQuery: string | null | undefined, fromHeader: string | string[] | undefined): Metadata {
  const header = typeof fromHeader === 'string' && fromHeader !== '' ? parseJsonParam(fromHeader, metadataSchema, [METADATA_HEADER]) : {};
  const query = fromQuery ? parseJsonParam(fromQuery, metadataSchema, ['metadata']) : {};
  return mergeMetadata(header, query);
}

/** Metadata from several sources, later ones winning on a shared key; at most 100 pairs together. */
export function mergeMetadata(...sources: (Metadata | undefined)[]): Metadata {
  const metadata: Metadata = Object.assign({}, ...sources);
  if (Object.keys(metadata).length > MAX_METADATA_PAIRS) {
    const message = `metadata holds at most ${MAX_METADATA_PAIRS} pairs (body, query parameter and header together)`;
    throw new ApiError('invalid_metadata', message, { issues: [{ path: ['metadata'], message }] });
  }
  return metadata;
}

/**
 * Parses metadata that arrives as JSON text (a query parameter or header).
 * `where` names the source in error paths, e.g. ['metadata_filters'].
 */
export function parseJsonParam<T>(text: string, schema: z.ZodType<T>, where: string[]): T {
  let parsed: unknown;
  try {
    if (jsonNestsDeeperThan(text, MAX_JSON_DEPTH)) throw new Error('too deep');
    parsed = JSON.parse(text);
  } catch {
    throw new ApiError('invalid_metadata', `${where.join('.')} is not valid JSON.`, {
      issues: [{ path: where, message: 'is not valid JSON' }],
    });
  }
  const result = schema.safeParse(parsed);
  if (!result.success) {
    const issues: Issue[] = result.error.issues.map((i) => ({
      path: [...where, ...i.path.map(String)],
      message: i.message,
    }));
    throw new ApiError('invalid_metadata', `${where.join('.')} is invalid: ${issues[0]?.message ?? ''}`, { issues });
  }
  return result.data;
}
