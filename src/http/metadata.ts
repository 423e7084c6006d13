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
/** The published client's documents name this one; it means the same as METADATA_HEADER. */
export const LAVA_METADATA_HEADER = 'x-lava-metadata';
/** One pair per header: `X-Lava-Metadata-User-Id: 42` is `{user_id: "42"}`. */
const PER_KEY_PREFIX = 'x-lava-metadata-';

/** Whether a request header carries metadata (and so is Tollgate's, never the provider's). */
export function isMetadataHeader(name: string): boolean {
  const lower = name.toLowerCase();
  return lower === METADATA_HEADER || lower === LAVA_METADATA_HEADER || lower.startsWith(PER_KEY_PREFIX);
}

export type MetadataHeaders = Record<string, string | string[] | undefined>;

/**
 * Metadata sent outside a body, merged key by key, the more specific source winning: the
 * `metadata` query parameter over the per-key `x-lava-metadata-<key>` headers, those over the
 * JSON headers (`x-lava-metadata` over `x-service-metadata`; a JSON header is often set once for
 * a whole client). Empty text counts as absent.
 */
export function outsideMetadata(fromQuery: string | null | undefined, headers: MetadataHeaders): Metadata {
  const query = fromQuery ? parseJsonParam(fromQuery, metadataSchema, ['metadata']) : {};
  return mergeMetadata(jsonHeader(headers, METADATA_HEADER), jsonHeader(headers, LAVA_METADATA_HEADER), perKeyHeaders(headers), query);
}

function jsonHeader(headers: MetadataHeaders, name: string): Metadata {
  const value = headers[name];
  return typeof value === 'string' && value !== '' ? parseJsonParam(value, metadataSchema, [name]) : {};
}

/**
 * Header names arrive lower-cased (HTTP does not keep their case), so the key is the name's rest
 * in lower case, its hyphens read as underscores: metadata keys allow no hyphen, header names
 * use them between words.
 */
function perKeyHeaders(headers: MetadataHeaders): Metadata {
  const pairs: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (!name.startsWith(PER_KEY_PREFIX) || value === undefined) continue;
    pairs[name.slice(PER_KEY_PREFIX.length).replaceAll('-', '_')] = Array.isArray(value) ? value.join(', ') : value;
  }
  if (Object.keys(pairs).length === 0) return {};
  const result = metadataSchema.safeParse(pairs);
  if (result.success) return result.data;
  const issues: Issue[] = result.error.issues.map((i) => {
    const key = i.path.length > 0 ? String(i.path[0]).replaceAll('_', '-') : '*';
    return { path: [`${PER_KEY_PREFIX}${key}`], message: i.message };
  });
  throw new ApiError('invalid_metadata', `An ${PER_KEY_PREFIX}* header is invalid: ${issues[0]?.message ?? ''}`, { issues });
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
