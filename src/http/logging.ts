import type { FastifyServerOptions } from 'fastify';

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

export function loggerOptions(level: string): FastifyServerOptions['logger'] {
  if (level === 'silent') return false;
  return {
    level,
    redact: { paths: REDACTED_PATHS, censor: '[Redacted]' },
    serializers: {
      req: (req: { method: string; url: string; id: string }) => ({
        id: req.id,
        method: req.method,
        url: redactUrl(req.url),
      }),
    },
  };
}
