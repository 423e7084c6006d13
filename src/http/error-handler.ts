import type { FastifyError, FastifyInstance } from 'fastify';
import { hasZodFastifySchemaValidationErrors } from 'fastify-type-provider-zod';
import { ProviderUnavailableError, PROVIDER_RETRY_AFTER_S } from '../domain/payment-provider-errors.ts';
import { isDatabaseUnavailable } from '../storage/errors.ts';
import { ApiError, envelope, validationError, type ErrorCode, type Issue } from './errors.ts';

/**
 * Turns every failure into the one envelope: our ApiErrors, schema validation failures,
 * framework errors (bad JSON, too large, wrong content type) and anything unexpected.
 */
export function installErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | ApiError, request, reply) => {
    const apiError = toApiError(err);
    if (apiError.code === 'service_unavailable') request.log.warn({ err }, 'request refused: service unavailable');
    else if (apiError.status >= 500) request.log.error({ err }, 'request failed');
    for (const [name, value] of Object.entries(apiError.headers)) reply.header(name, value);
    return reply.status(apiError.status).send(apiError.toEnvelope());
  });

  const routes = collectRoutes(app);
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?')[0] ?? '';
    const allowed = routes.methodsFor(path);
    if (allowed.length > 0) {
      return reply
        .status(405)
        .header('allow', allowed.join(', '))
        .send(envelope('method_not_allowed', `${request.method} is not allowed on ${path}; use ${allowed.join(', ')}.`));
    }
    return reply.status(404).send(envelope('route_not_found', `No endpoint ${request.method} ${path}.`));
  });
}

/**
 * The methods of every registered path, to tell "no such endpoint" (404) from "this endpoint,
 * another method" (405 with Allow). Only consulted when routing found nothing.
 */
function collectRoutes(app: FastifyInstance): { methodsFor(path: string): string[] } {
  const routes: { pattern: RegExp; methods: string[] }[] = [];
  app.addHook('onRoute', (route) => {
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    routes.push({ pattern: patternOf(route.url ?? route.path), methods });
  });
  return {
    methodsFor: (path) => {
      const trimmed = path.length > 1 ? path.replace(/\/$/, '') : path;
      const methods = new Set(routes.filter((r) => r.pattern.test(trimmed)).flatMap((r) => r.methods));
      return [...methods].sort();
    },
  };
}

/** `/v1/meters/:id` → a pattern matching one path segment per parameter; `*` matches the rest. */
function patternOf(url: string): RegExp {
  const trimmed = url.length > 1 ? url.replace(/\/$/, '') : url;
  const source = trimmed
    .split('/')
    .map((segment) => {
      if (segment === '*') return '.*';
      if (segment.startsWith(':')) return '[^/]+';
      return segment.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    })
    .join('/');
  return new RegExp(`^${source}$`);
}

/** Seconds a client is asked to wait before retrying while the database is unreachable. */
const DATABASE_RETRY_AFTER_S = 1;

/** 503 in the envelope for a request that failed because the database is unreachable. */
export function databaseUnavailable(): ApiError {
  return new ApiError('service_unavailable', 'The database is not reachable; retry shortly.', {
    headers: { 'retry-after': String(DATABASE_RETRY_AFTER_S) },
  });
}

/** 503 in the envelope for a request whose payment provider did not answer (nothing was credited). */
export function paymentProviderUnavailable(): ApiError {
  return new ApiError('service_unavailable', 'The payment provider cannot be reached right now; nothing was charged or credited. Retry shortly.', {
    headers: { 'retry-after': String(PROVIDER_RETRY_AFTER_S) },
  });
}

/** Any failure as an ApiError: ours as they are, schema and framework errors mapped, anything else internal_error. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (isDatabaseUnavailable(err)) return databaseUnavailable();
  if (err instanceof ProviderUnavailableError) return paymentProviderUnavailable();
  if (hasZodFastifySchemaValidationErrors(err)) {
    const context = (err as { validationContext?: string }).validationContext;
    const issues: Issue[] = err.validation.flatMap((v) => {
      const path = pathOf(v.instancePath, context);
      // A strict body's unknown fields: one issue per field, at the field itself.
      const unknown = v.keyword === 'unrecognized_keys' ? (v.params as { keys?: unknown }).keys : undefined;
      if (Array.isArray(unknown) && unknown.length > 0) {
        return unknown.map((key) => ({ path: [...path, String(key)], message: 'is not a known field' }));
      }
      return [{ path, message: v.message ?? 'is invalid' }];
    });
    return validationError(issues);
  }
  const fastifyCode = typeof err === 'object' && err !== null && 'code' in err ? String(err.code) : '';
  const mapped = FRAMEWORK_ERRORS[fastifyCode];
  if (mapped) return new ApiError(mapped, undefined);
  const status = typeof err === 'object' && err !== null && 'statusCode' in err ? Number(err.statusCode) : 500;
  if (status >= 400 && status < 500) return new ApiError('validation_error', (err as Error).message);
  return new ApiError('internal_error');
}

const FRAMEWORK_ERRORS: Record<string, ErrorCode> = {
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_BODY_TOO_LARGE: 'payload_too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'validation_error',
  FST_ERR_BAD_URL: 'route_not_found',
};

/** Zod reports `/tiers/0/rate`; the envelope wants ["tiers","0","rate"] (query params by name). */
function pathOf(instancePath: string, context: string | undefined): string[] {
  const parts = instancePath.split('/').filter((p) => p.length > 0);
  if (context === 'headers') return ['headers', ...parts];
  return parts;
}
