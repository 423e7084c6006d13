import type { FastifyServerOptions } from 'fastify';
import { stdSerializers, type DestinationStream } from 'pino';

/** Header and field names whose values never reach a log line: credentials and personal data. */
export const REDACTED_PATHS = [
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers["x-goog-api-key"]',
  'req.headers["xi-api-key"]',
  'req.headers.cookie',
  'res.headers["set-cookie"]',
  ...['secret_key', 'key', 'connection_secret', 'product_secret', 'provider_key', 'webhook_secret', 'password']
    .flatMap((f) => [f, `*.${f}`]),
  ...['email', 'phone', 'first_name', 'last_name', 'name'].flatMap((f) => [`*.${f}`, `*.*.${f}`]),
];

/** Query parameters that may carry a credential (`key`) or customer data; masked in logged URLs. */
const SENSITIVE_QUERY = new Set(['key', 'metadata']);

export function redactUrl(url: string): string {
  const q = url.indexOf('?');
  if (q < 0) return url;
  const params = new URLSearchParams(url.slice(q + 1));
  for (const name of [...params.keys()]) {
    if (SENSITIVE_QUERY.has(name)) params.set(name, '[Redacted]');
    // The forward target may carry its own `key` (a provider key) when `u` is percent-encoded.
    else if (name === 'u') params.set(name, redactUrl(params.get(name)!));
  }
  return `${url.slice(0, q)}?${params.toString()}`;
}

/**
 * Database error fields that quote the data: PostgreSQL's `detail` ("Failing row contains (…)",
 * "Key (email)=(…)"), `where` and `internalQuery`, and the bound `parameters` some drivers attach.
 */
const ERROR_FIELDS_WITH_VALUES = ['detail', 'where', 'internalQuery', 'parameters', 'query', 'values'];

/** pino's error serializer without the fields that carry column values, nested errors included. */
export function serializeError(err: Error): ReturnType<typeof stdSerializers.err> {
  const serialized = stdSerializers.err(err);
  scrubErrorValues(serialized, Object.getPrototypeOf(serialized));
  return serialized;
}

/**
 * Only objects the serializer made (same prototype) are edited: other nested values are the
 * original error's own objects, which logging must not change.
 */
function scrubErrorValues(serialized: unknown, serializedProto: unknown): void {
  if (typeof serialized !== 'object' || serialized === null) return;
  if (Object.getPrototypeOf(serialized) !== serializedProto) return;
  const record = serialized as Record<string, unknown>;
  for (const field of ERROR_FIELDS_WITH_VALUES) delete record[field];
  for (const nested of Object.values(record)) {
    for (const item of Array.isArray(nested) ? nested : [nested]) scrubErrorValues(item, serializedProto);
  }
}

export function loggerOptions(level: string, stream?: DestinationStream): FastifyServerOptions['logger'] {
  if (level === 'silent') return false;
  return {
    level,
    ...(stream ? { stream } : {}),
    redact: { paths: REDACTED_PATHS, censor: '[Redacted]' },
    serializers: {
      req: (req: { method: string; url: string; id: string }) => ({
        id: req.id,
        method: req.method,
        url: redactUrl(req.url),
      }),
      err: serializeError,
    },
  };
}
