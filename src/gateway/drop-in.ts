/**
 * Drop-in provider endpoints: `POST /v1/chat/completions`, `/v1/responses`, `/v1/embeddings`,
 * `GET /v1/models` (OpenAI shape) and `POST /v1/messages` (Anthropic shape). A client configured
 * with Tollgate as its base URL and a Tollgate key as its API key works unchanged: the request is
 * routed by its model to a provider and then takes the same path as /v1/forward.
 */
import { findProvider as findCatalogProvider } from '@pydantic/genai-prices';
import type { FastifyRequest } from 'fastify';
import { dateOf } from '../domain/clock.ts';
import { ApiError } from '../http/errors.ts';
import { assertJsonDepth } from '../http/json-depth.ts';
import type { App, AppDeps } from '../http/types.ts';
import type { ProviderModule } from '../providers/types.ts';
import { installDialectErrorHandler } from './error-dialects.ts';
import { extractCredential, resolveCredential, type BillingContext } from './credentials.ts';
import { forwardRequest, metadataOf, type Gateway } from './forward.ts';
import { authenticateSpendKey, checkRequestShape, modelAllowed, providerAllowed } from './spend-key-guard.ts';
import { resolveTarget } from './target.ts';

type Shape = 'openai' | 'anthropic';

const OPENAI_PATHS = ['/chat/completions', '/responses', '/embeddings'] as const;

/** Model-name prefixes that identify a provider when the model is not written `provider/model`. */
const MODEL_PREFIXES: readonly [RegExp, string][] = [
  [/^(gpt-|o\d|chatgpt-|text-embedding-|davinci|babbage|omni-moderation|tts-|whisper-|dall-e)/, 'openai'],
  [/^claude-/, 'anthropic'],
  [/^gemini-|^text-embedding-00|^gemma-/, 'google-openai'],
  [/^(mistral-|codestral|ministral|pixtral|open-mistral|magistral)/, 'mistral'],
  [/^deepseek-/, 'deepseek'],
  [/^grok-/, 'xai'],
  [/^(command|embed-)/, 'cohere'],
  [/^(kimi-|moonshot-)/, 'moonshot'],
];

export function registerDropInRoutes(app: App, deps: AppDeps, gateway: Gateway): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));
  // Authenticated before the body is read (onRequest runs before parsing): a caller without a
  // valid key never makes the server buffer up to the body limit.
  const callers = new WeakMap<FastifyRequest, Caller>();
  // Refusals answer in the shape of the endpoint's provider: Anthropic's on /messages, else OpenAI's.
  installDialectErrorHandler(app, (request) => (request.url.split('?')[0]!.endsWith('/messages') ? 'anthropic' : 'openai'));
  app.addHook('onRequest', async (request) => {
    callers.set(request, await authenticate(deps, gateway, request));
  });
  const callerOf = async (request: FastifyRequest) => callers.get(request) ?? (await authenticate(deps, gateway, request));

  for (const path of OPENAI_PATHS) {
    app.post(path, { schema: { hide: true } }, async (request, reply) =>
      dropIn(deps, gateway, request, reply, { shape: 'openai', path, caller: await callerOf(request) }),
    );
  }
  app.post('/messages', { schema: { hide: true } }, async (request, reply) =>
    dropIn(deps, gateway, request, reply, { shape: 'anthropic', path: '/messages', caller: await callerOf(request) }),
  );
  app.get('/models', { exposeHeadRoute: false, schema: { hide: true } }, async (request) => {
    const { billing, token } = await callerOf(request);
    // The cached key may be up to 2 s old: one read of its row refuses a key just revoked,
    // rotated, paused or expired on another instance, and filters by its current allow-lists.
    const spendKey = billing.spendKey ? await authenticateSpendKey(deps.storage, token, dateOf(deps.clock)) : null;
    const data = listModels(deps, gateway);
    // A spend key sees only what its allow-lists (and its request shape) let it use.
    if (!spendKey) return { object: 'list', data };
    const family = spendKey.request_shape === 'anthropic' ? 'anthropic' : 'openai-compatible';
    return {
      object: 'list',
      data: data.filter((m) => {
        const provider = gateway.registry.getProvider(m.owned_by);
        const bare = m.id.startsWith(`${m.owned_by}/`) ? m.id.slice(m.owned_by.length + 1) : m.id;
        return provider?.family === family && providerAllowed(spendKey, m.owned_by) && modelAllowed(spendKey, m.owned_by, bare);
      }),
    };
  });
}

type Caller = { billing: BillingContext; token: string };

async function authenticate(deps: AppDeps, gateway: Gateway, request: FastifyRequest): Promise<Caller> {
  const credential = extractCredential(request.headers, null);
  if (!credential) throw new ApiError('unauthorized', 'Missing API key: send Authorization: Bearer <key> or x-api-key.');
  return { billing: await resolveCredential(deps.storage, gateway.credentials, credential.token, dateOf(deps.clock)), token: credential.token };
}

async function dropIn(
  deps: AppDeps,
  gateway: Gateway,
  request: FastifyRequest,
  reply: Parameters<typeof forwardRequest>[3],
  { shape, path, caller: { billing } }: { shape: Shape; path: string; caller: Caller },
): Promise<void> {
  if (billing.spendKey) checkRequestShape(billing.spendKey, shape === 'anthropic' ? 'anthropic' : 'openai-compatible');
  const body = parseBody(request);
  const requested = typeof body.model === 'string' ? body.model : '';
  const { provider, model } = routeModel(gateway, requested, shape);
  if (model !== requested) {
    // `provider/model` names the provider for us; the provider itself only knows the model.
    request.body = Buffer.from(JSON.stringify({ ...body, model }));
  }
  const url = `${provider.baseUrl.replace(/\/$/, '')}${path}`;
  const target = resolveTarget(url, gateway.registry, deps.config.upstreamOverrides);
  const fromQuery = new URL(request.url, 'http://x').searchParams.get('metadata');
  await forwardRequest(deps, gateway, request, reply, { target, billing, metadata: metadataOf(request, fromQuery) });
}

function parseBody(request: FastifyRequest): Record<string, unknown> {
  const text = Buffer.isBuffer(request.body) ? request.body.toString('utf8') : '';
  assertJsonDepth(text);
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)) return parsed as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw new ApiError('invalid_json', 'The request body must be a JSON object with a model.');
}

/** Picks the provider for a model: `provider/model` explicitly, else by the model's name. */
export function routeModel(gateway: Pick<Gateway, 'registry'>, requested: string, shape: Shape): { provider: ProviderModule; model: string } {
  if (!requested) {
    throw new ApiError('validation_error', 'model is required.', { issues: [{ path: ['model'], message: 'is required' }] });
  }
  const slash = requested.indexOf('/');
  const explicit = slash > 0 ? gateway.registry.getProvider(requested.slice(0, slash)) : undefined;
  const providerId = explicit ? explicit.id : MODEL_PREFIXES.find(([re]) => re.test(requested))?.[1];
  const provider = explicit ?? (providerId ? gateway.registry.getProvider(providerId) : undefined);
  if (!provider) {
    throw new ApiError('unsupported_provider', `No provider serves model "${requested}"; write it as provider/model.`, {
      issues: [{ path: ['model'], message: 'names no known provider' }],
    });
  }
  const expected = shape === 'anthropic' ? 'anthropic' : 'openai-compatible';
  if (provider.family !== expected) {
    const where = shape === 'anthropic' ? 'the OpenAI-shaped endpoints' : 'POST /v1/messages';
    throw new ApiError('unsupported_provider', `Model "${requested}" is served by ${provider.id}; use ${where}.`, {
      issues: [{ path: ['model'], message: `is not served through this endpoint` }],
    });
  }
  return { provider, model: explicit ? requested.slice(slash + 1) : requested };
}

/**
 * Models of every provider with a managed key, from the price catalog, in OpenAI's list shape.
 * Gemini is listed under google-openai, the path the drop-in endpoints route it to (a google/…
 * id would name the native Gemini API, which no drop-in endpoint speaks).
 */
function listModels(deps: AppDeps, gateway: Gateway) {
  const data: { id: string; object: 'model'; created: number; owned_by: string }[] = [];
  const providers = new Set<ProviderModule>();
  for (const providerId of Object.keys(deps.config.providerKeys)) {
    const provider = gateway.registry.getProvider(providerId === 'google' ? 'google-openai' : providerId);
    if (provider) providers.add(provider);
  }
  for (const provider of providers) {
    const catalog = findCatalogProvider({ providerId: provider.id === 'google-openai' ? 'google' : provider.id });
    for (const model of catalog?.models ?? []) {
      if (model.deprecated) continue;
      const id = provider.id === 'openai' ? model.id : `${provider.id}/${model.id}`;
      data.push({ id, object: 'model', created: 0, owned_by: provider.id });
    }
  }
  return data;
}
