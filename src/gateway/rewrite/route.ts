/**
 * `POST /v1/rewrite/{format}/{providerUrl}`: a request in the client's format (`openai`,
 * `anthropic`, `google`) goes to a provider that speaks another, translated both ways; admission,
 * relay, metering and settlement are /v1/forward's (forwardRequest), so billing reads the
 * provider's own answer. Decision 0022 has the URL and translation rules.
 */
import type { FastifyRequest } from 'fastify';
import { dateOf } from '../../domain/clock.ts';
import { ApiError } from '../../http/errors.ts';
import { assertJsonDepth } from '../../http/json-depth.ts';
import type { Metadata } from '../../http/metadata.ts';
import type { App } from '../../http/types.ts';
import type { AppDeps } from '../../app-deps.ts';
import type { ProviderFamily, ProviderModule } from '../../providers/types.ts';
import { extractCredential, resolveCredential } from '../credentials.ts';
import type { BillingContext } from '../../ledger/billing.ts';
import { installDialectErrorHandler } from '../error-dialects.ts';
import { forwardRequest, metadataOf, type Gateway } from '../forward.ts';
import type { ResponseTranslator } from '../relay.ts';
import { resolveTarget } from '../target.ts';
import { REWRITE_FORMATS, type RewriteFormat } from './canonical.ts';
import { clientCallOf, ownEndpoint, providerEndpoint, providerOfBase, type ClientCall } from './endpoint.ts';
import { createStreamTranslator, translateRequest, translateResponseBody } from './translate.ts';

const FORMAT_OF_FAMILY: Partial<Record<ProviderFamily, RewriteFormat>> = {
  'openai-compatible': 'openai',
  anthropic: 'anthropic',
  google: 'google',
};

/** Headers that speak one provider's dialect: not sent to another provider. */
const CLIENT_DIALECT_HEADER = /^(anthropic-|openai-|x-goog-)/;
const ANTHROPIC_VERSION = '2023-06-01';
/** Query parameters that are Tollgate's own. */
const TOLLGATE_PARAMETERS = new Set(['metadata', 'key']);
/** Query parameters that are Tollgate's or the client format's own, never a translated call's provider's. */
const OWN_PARAMETERS = new Set([...TOLLGATE_PARAMETERS, 'alt']);

export function registerRewriteRoutes(app: App, deps: AppDeps, gateway: Gateway): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));
  // Refusals in the client's own dialect, which its format names; Tollgate's envelope before that.
  installDialectErrorHandler(app, (request) => clientFormatOf(request.url) ?? 'tollgate');
  // The call is authorised before its body is read (onRequest runs before parsing), as on
  // /v1/forward: a caller without a valid credential never makes the server buffer the body.
  const calls = new WeakMap<FastifyRequest, RewriteCall>();
  app.addHook('onRequest', async (request) => {
    calls.set(request, await authorisedRewriteCall(deps, gateway, request));
  });
  app.post('/rewrite/*', { schema: { hide: true } }, async (request, reply) => {
    const { client, provider, module, call, url, billing, metadata, query } = calls.get(request) ?? (await authorisedRewriteCall(deps, gateway, request));
    if (client === provider) {
      // Nothing to translate: the call is /v1/forward's, its query the provider's (Tollgate's own taken out).
      const target = resolveTarget(ownEndpoint(module, call, url, providerQuery(query)), gateway.registry, deps.config.upstreamOverrides);
      await forwardRequest(deps, gateway, request, reply, { target, billing, metadata, dialect: client });
      return;
    }
    refuseProviderParameters(query);
    const translated = translateRequest(call.api, provider, bodyJson(request), call);
    const endpoint = providerEndpoint(provider, module, call, translated.request.model, translated.request.stream);
    const target = resolveTarget(endpoint, gateway.registry, deps.config.upstreamOverrides);
    const created = Math.floor(deps.clock.now() / 1000);
    const translator: ResponseTranslator = {
      body: (status, json) => Buffer.from(JSON.stringify(translateResponseBody(provider, call.api, status, json, { created }))),
      stream: (seen) => createStreamTranslator(provider, call.api, { created, includeUsage: translated.request.streamUsage === true }, seen),
    };
    const rewrite = { body: translated.body, headers: providerHeaders(request, provider), translator };
    await forwardRequest(deps, gateway, request, reply, { target, billing, metadata, rewrite, dialect: client });
  });
}

type RewriteCall = {
  client: RewriteFormat;
  provider: RewriteFormat;
  /** The provider the URL names, and what the client's own path said. */
  module: ProviderModule;
  call: ClientCall;
  /** The provider URL as given. */
  url: URL;
  billing: BillingContext;
  metadata: Metadata;
  query: URLSearchParams;
};

/** The formats, provider and payer of a rewrite call, from its URL and headers alone. */
async function authorisedRewriteCall(deps: AppDeps, gateway: Gateway, request: FastifyRequest): Promise<RewriteCall> {
  const { client, providerUrl, query } = splitRewritePath(request.url);
  const url = providerUrlOf(providerUrl);
  const call = clientCallOf(client, url);
  const module = providerOfBase(gateway.registry, call.base) ?? resolveTarget(url.toString(), gateway.registry, deps.config.upstreamOverrides).provider;
  const provider = FORMAT_OF_FAMILY[module.family];
  if (!provider) throw new ApiError('unsupported_format', `${module.displayName} is not a chat provider the rewrite proxy can translate to.`);
  const credential = extractCredential(request.headers, query.get('key'));
  if (!credential) throw new ApiError('unauthorized', 'Missing credential: send Authorization: Bearer <secret key or forward token>.');
  const billing = await resolveCredential(deps.storage, gateway.credentials, credential.token, dateOf(deps.clock));
  return { client, provider, module, call, url, billing, metadata: metadataOf(request, query.get('metadata')), query };
}

/** The client's format named by a rewrite URL, or null when it names none this proxy speaks. */
function clientFormatOf(rawUrl: string): RewriteFormat | null {
  const format = /\/rewrite\/([^/?]+)/.exec(rawUrl)?.[1];
  return format !== undefined && (REWRITE_FORMATS as readonly string[]).includes(format) ? (format as RewriteFormat) : null;
}

type RewritePath = { client: RewriteFormat; providerUrl: string; query: URLSearchParams };

/**
 * `/v1/rewrite/<format>/<provider URL>[?query]`, read from the raw URL: the provider URL keeps
 * its `//` (the published client appends it raw) and may also come without a scheme.
 */
function splitRewritePath(rawUrl: string): RewritePath {
  const queryStart = rawUrl.indexOf('?');
  const path = queryStart === -1 ? rawUrl : rawUrl.slice(0, queryStart);
  const query = new URLSearchParams(queryStart === -1 ? '' : rawUrl.slice(queryStart + 1));
  const rest = path.slice(path.indexOf('/rewrite/') + '/rewrite/'.length);
  const slash = rest.indexOf('/');
  const format = decodeURIComponent(slash === -1 ? rest : rest.slice(0, slash));
  if (format === 'bedrock') {
    throw new ApiError('unsupported_format', 'The rewrite proxy does not translate the bedrock format (it needs AWS SigV4 signing); use openai, anthropic or google.');
  }
  if (!(REWRITE_FORMATS as readonly string[]).includes(format)) {
    throw new ApiError('unsupported_format', `Unknown rewrite format "${format}"; use openai, anthropic or google.`, {
      issues: [{ path: ['format'], message: 'must be openai, anthropic or google' }],
    });
  }
  const providerUrl = slash === -1 ? '' : rest.slice(slash + 1);
  if (providerUrl === '') {
    throw new ApiError('unsupported_provider', 'The provider URL is missing: POST /v1/rewrite/{format}/{provider URL}.');
  }
  return { client: format as RewriteFormat, providerUrl, query };
}

/** `https://host/…`, `https:/host/…` (a proxy that merged slashes) or `host/…` (scheme-less, https). */
function providerUrlOf(text: string): URL {
  const withScheme = /^https?:\/\//i.test(text) ? text : /^https?:\//i.test(text) ? text.replace(/:\//, '://') : `https://${text}`;
  try {
    return new URL(withScheme);
  } catch {
    throw new ApiError('unsupported_provider', 'The provider URL is not a URL of a supported provider.');
  }
}

/** The query parameters that are the provider's: all but Tollgate's own. */
function providerQuery(query: URLSearchParams): URLSearchParams {
  const own = new URLSearchParams();
  for (const [name, value] of query) if (!TOLLGATE_PARAMETERS.has(name)) own.append(name, value);
  return own;
}

/** A query parameter meant for the provider cannot follow a translated request: refused by name. */
function refuseProviderParameters(query: URLSearchParams): void {
  const foreign = [...new Set(query.keys())].filter((name) => !OWN_PARAMETERS.has(name));
  if (foreign.length === 0) return;
  throw new ApiError('untranslatable_request', `These query parameters cannot be translated: ${foreign.join(', ')}.`, {
    issues: foreign.map((name) => ({ path: ['query', name], message: 'is not supported by the rewrite proxy' })),
  });
}

function bodyJson(request: FastifyRequest): unknown {
  const body = Buffer.isBuffer(request.body) ? request.body.toString('utf8') : '';
  // The readers walk the whole body: it must stay shallow.
  assertJsonDepth(body);
  try {
    return JSON.parse(body);
  } catch {
    throw new ApiError('invalid_json', 'The request body must be a JSON object.');
  }
}

/**
 * The client's headers minus its own provider's dialect (`anthropic-version` means nothing to
 * OpenAI); a beta feature asked for by header cannot be translated and is refused by name.
 */
function providerHeaders(request: FastifyRequest, provider: RewriteFormat): Record<string, string | string[] | undefined> {
  const headers: Record<string, string | string[] | undefined> = {};
  for (const [name, value] of Object.entries(request.headers)) {
    const lower = name.toLowerCase();
    if (lower === 'anthropic-beta') {
      throw new ApiError('untranslatable_request', 'The anthropic-beta header cannot be translated.', {
        issues: [{ path: ['headers', 'anthropic-beta'], message: 'is not supported by the rewrite proxy' }],
      });
    }
    if (!CLIENT_DIALECT_HEADER.test(lower) && lower !== 'content-type') headers[lower] = value;
  }
  headers['content-type'] = 'application/json';
  if (provider === 'anthropic') headers['anthropic-version'] = ANTHROPIC_VERSION;
  return headers;
}
