/**
 * Tollgate's own refusals on provider-shaped routes, in the dialect of the provider the client
 * thinks it talks to, so that each provider's client surfaces the message and its typed error.
 * The interface's `code` and `status` are kept in every dialect (Gemini's own `code` and
 * `status` mean the HTTP status and the RPC status, so there the interface's code is the
 * ErrorInfo `reason`). Used by the forward and drop-in scopes, and meant for the rewrite proxy.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { ApiError } from '../http/errors.ts';
import { toApiError } from '../http/error-handler.ts';
import type { App } from '../http/types.ts';
import type { ProviderFamily } from '../providers/types.ts';

export type ErrorDialect = 'tollgate' | 'openai' | 'anthropic' | 'google';

/** The dialect a provider family's clients understand. */
export function dialectOfFamily(family: ProviderFamily): ErrorDialect {
  if (family === 'anthropic') return 'anthropic';
  if (family === 'google') return 'google';
  if (family === 'openai-compatible') return 'openai';
  return 'tollgate';
}

/** The response body of a refusal in a dialect. */
export function renderError(dialect: ErrorDialect, error: ApiError): unknown {
  const { code, status, message, issues } = error;
  switch (dialect) {
    case 'openai':
      return {
        error: {
          message,
          type: OPENAI_TYPES[status] ?? (status >= 500 ? 'server_error' : 'invalid_request_error'),
          param: issues?.[0]?.path.join('.') || null,
          code,
          status,
          ...(issues ? { issues } : {}),
        },
      };
    case 'anthropic':
      return {
        type: 'error',
        error: {
          type: ANTHROPIC_TYPES[status] ?? (status >= 500 ? 'api_error' : 'invalid_request_error'),
          message,
          // Where Anthropic puts a machine-readable code (@anthropic-ai/sdk's `errorCode`).
          details: { error_code: code },
          code,
          status,
          ...(issues ? { issues } : {}),
        },
      };
    case 'google':
      return {
        error: {
          code: status,
          message,
          status: GOOGLE_STATUSES[status] ?? (status >= 500 ? 'INTERNAL' : 'FAILED_PRECONDITION'),
          details: [{ '@type': 'type.googleapis.com/google.rpc.ErrorInfo', reason: code, domain: 'tollgate', metadata: { status: String(status) } }],
        },
      };
    default:
      return error.toEnvelope();
  }
}

const OPENAI_TYPES: Readonly<Record<number, string>> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'insufficient_quota',
  403: 'permission_error',
  404: 'invalid_request_error',
  429: 'rate_limit_error',
};

const ANTHROPIC_TYPES: Readonly<Record<number, string>> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  403: 'permission_error',
  404: 'not_found_error',
  413: 'request_too_large',
  429: 'rate_limit_error',
  503: 'overloaded_error',
  504: 'timeout_error',
};

const GOOGLE_STATUSES: Readonly<Record<number, string>> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  402: 'RESOURCE_EXHAUSTED',
  403: 'PERMISSION_DENIED',
  404: 'NOT_FOUND',
  409: 'ABORTED',
  413: 'INVALID_ARGUMENT',
  429: 'RESOURCE_EXHAUSTED',
  502: 'UNAVAILABLE',
  503: 'UNAVAILABLE',
  504: 'DEADLINE_EXCEEDED',
};

/** Answers every error of a scope in the dialect `dialectOf` picks for its request. */
export function installDialectErrorHandler(app: App, dialectOf: (request: FastifyRequest) => ErrorDialect): void {
  app.setErrorHandler((err: unknown, request: FastifyRequest, reply: FastifyReply) => {
    const apiError = toApiError(err);
    if (apiError.status >= 500) request.log.error({ err }, 'request failed');
    for (const [name, value] of Object.entries(apiError.headers)) reply.header(name, value);
    return reply.status(apiError.status).send(renderError(dialectOf(request), apiError));
  });
}
