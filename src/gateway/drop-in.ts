/**
 * Drop-in provider endpoints: `POST /v1/chat/completions`, `/v1/responses`, `/v1/embeddings`,
 * `GET /v1/models` and `GET /v1/models/{model}` (OpenAI shape, Anthropic's for an Anthropic client,
 * Gemini's for a Gemini client), `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic
 * shape), and Gemini's native `GET /v1beta/models[/{model}]` and
 * `POST /{v1beta|v1}/models/{model}:{generateContent|streamGenerateContent|…}`. A client configured
 * with Tollgate as its base URL and a Tollgate key as its API key works unchanged: the request is
 * routed by its model to a provider and then takes the same path as /v1/forward.
 */
import { findProvider as findCatalogProvider } from '@pydantic/genai-prices';
import type { FastifyRequest } from 'fastify';
import { dateOf } from '../domain/clock.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertJsonDepth } from '../http/json-depth.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import type { ProviderFamily, ProviderModule } from '../providers/types.ts';
import { installDialectErrorHandler } from './error-dialects.ts';
import { extractCredential, resolveCredential } from './credentials.ts';
import type { BillingContext } from '../ledger/billing.ts';
import { forwardRequest, metadataOf, type Gateway } from './forward.ts';
import { formFields, multipartBoundary, replaceFieldValue, type FormField } from './form-fields.ts';
import { authenticateSpendKey, checkRequestShape } from './spend-key-guard.ts';
import { modelAllowed, providerAllowed, requestShapeRefusal } from '../ledger/spend-key-limits.ts';
import { resolveTarget } from './target.ts';
import type { SpendKeyRow } from '../storage/spend-keys.ts';

type Shape = 'openai' | 'anthropic';

/** The media endpoints' uploads (transcriptions, translations) are multipart forms naming their model in a field. */
const OPENAI_PATHS = [
  '/chat/completions',
  '/responses',
  '/embeddings',
  '/audio/transcriptions',
  '/audio/translations',
  '/audio/speech',
  '/images/generations',
] as const;
const ANTHROPIC_PATHS = ['/messages', '/messages/count_tokens'] as const;

/** The Gemini API methods the native drop-in forwards (`models/{model}:{method}`). */
const GEMINI_METHODS = new Set(['generateContent', 'streamGenerateContent', 'countTokens', 'embedContent', 'batchEmbedContents']);

export function registerDropInRoutes(app: App, deps: AppDeps, gateway: Gateway): void {
  acceptRawBodies(app);
  // Refusals answer in the shape of the endpoint's provider: Anthropic's on /messages and for an
  // Anthropic client's model list, else OpenAI's.
  installDialectErrorHandler(app, (request) => (request.method === 'GET' ? modelListShape(request) : isAnthropicShaped(request) ? 'anthropic' : 'openai'));
  const callerOf = authenticateBeforeBody(app, deps, gateway, (request) => (request.method === 'GET' ? queryKeyOf(request) : null), { publicReads: true });

  for (const path of OPENAI_PATHS) {
    app.post(path, { schema: { hide: true } }, async (request, reply) =>
      dropIn(deps, gateway, request, reply, { shape: 'openai', path, caller: await callerOf(request) }),
    );
  }
  for (const path of ANTHROPIC_PATHS) {
    app.post(path, { schema: { hide: true } }, async (request, reply) =>
      dropIn(deps, gateway, request, reply, { shape: 'anthropic', path, caller: await callerOf(request) }),
    );
  }
  app.get('/models', { exposeHeadRoute: false, schema: { hide: true } }, async (request) => {
    const shape = modelListShape(request);
    const models = await modelsVisibleTo(deps, gateway, await modelReaderOf(request, callerOf), shape);
    if (shape === 'anthropic') return anthropicModelList(models);
    return shape === 'google' ? geminiModelList(models) : { object: 'list', data: models.map(openaiModel) };
  });
  app.get('/models/*', { exposeHeadRoute: false, schema: { hide: true } }, async (request) => {
    const shape = modelListShape(request);
    const model = findModel(await modelsVisibleTo(deps, gateway, await modelReaderOf(request, callerOf), shape), shape, wildcardOf(request));
    if (shape === 'anthropic') return anthropicModel(model);
    return shape === 'google' ? geminiModel(model) : openaiModel(model);
  });
}

/**
 * Gemini's native API, for @google/genai given Tollgate as its base URL: registered under
 * `/v1beta` and `/v1` (the client's `apiVersion`). The key comes as `x-goog-api-key` or `?key=`;
 * refusals are in Google's dialect.
 */
export function registerGeminiDropInRoutes(app: App, deps: AppDeps, gateway: Gateway, { modelReads }: { modelReads: boolean }): void {
  acceptRawBodies(app);
  installDialectErrorHandler(app, () => 'google');
  const callerOf = authenticateBeforeBody(app, deps, gateway, queryKeyOf);
  // Under /v1 the model reads are the OpenAI-shaped drop-in's, which answer a Gemini client in
  // Gemini's shape; /v1beta has only these.
  if (modelReads) {
    app.get('/models', { exposeHeadRoute: false, schema: { hide: true } }, async (request) =>
      geminiModelList(await modelsVisibleTo(deps, gateway, await callerOf(request), 'google')),
    );
    app.get('/models/*', { exposeHeadRoute: false, schema: { hide: true } }, async (request) =>
      geminiModel(findModel(await modelsVisibleTo(deps, gateway, await callerOf(request), 'google'), 'google', wildcardOf(request))),
    );
  }
  app.post('/models/*', { schema: { hide: true } }, async (request, reply) => {
    const { billing, token } = await callerOf(request);
    const call = geminiCallOf(request.url);
    const google = gateway.registry.getProvider('google')!;
    if (billing.spendKey) checkRequestShape(billing.spendKey, google.family);
    const url = `${new URL(google.baseUrl).origin}/${call.version}/models/${call.model}:${call.method}${call.providerQuery}`;
    const target = resolveTarget(url, gateway.registry, deps.config.upstreamOverrides);
    await forwardRequest(deps, gateway, request, reply, { target, billing, metadata: metadataOf(request, call.metadata), credential: token });
  });
}

function acceptRawBodies(app: App): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));
}

type Caller = { billing: BillingContext; token: string };

/**
 * Authenticates every request of the scope before its body is read (onRequest runs before
 * parsing): a caller without a valid key never makes the server buffer up to the body limit.
 */
function authenticateBeforeBody(
  app: App,
  deps: AppDeps,
  gateway: Gateway,
  queryKeyOf: (request: FastifyRequest) => string | null,
  { publicReads }: { publicReads: boolean } = { publicReads: false },
): (request: FastifyRequest) => Promise<Caller> {
  const callers = new WeakMap<FastifyRequest, Caller>();
  const authenticate = async (request: FastifyRequest): Promise<Caller> => {
    const credential = extractCredential(request.headers, queryKeyOf(request));
    if (!credential) throw new ApiError('unauthorized', 'Missing API key: send Authorization: Bearer <key> or x-api-key.');
    return { billing: await resolveCredential(deps.storage, gateway.credentials, credential.token, dateOf(deps.clock)), token: credential.token };
  };
  app.addHook('onRequest', async (request) => {
    // The OpenAI-shaped model reads are public, as the published client's are: one without a key
    // is answered for everybody (modelReaderOf). Gemini's native API always wants its key.
    if (publicReads && request.method === 'GET' && !extractCredential(request.headers, queryKeyOf(request))) return;
    callers.set(request, await authenticate(request));
  });
  return async (request) => callers.get(request) ?? (await authenticate(request));
}

/**
 * Who reads the model list: anybody may, without a key (the whole list); a key that is sent must
 * be valid, and a spend key sees only what it may use.
 */
async function modelReaderOf(request: FastifyRequest, callerOf: (request: FastifyRequest) => Promise<Caller>): Promise<Caller | null> {
  return extractCredential(request.headers, queryKeyOf(request)) ? callerOf(request) : null;
}

const queryKeyOf = (request: FastifyRequest): string | null => new URL(request.url, 'http://x').searchParams.get('key');

/** Anthropic's endpoints, and a model list asked for by an Anthropic client (its version header, or its key header alone). */
function isAnthropicShaped(request: FastifyRequest): boolean {
  const path = request.url.split('?')[0]!;
  if (path.endsWith('/messages') || path.endsWith('/messages/count_tokens')) return true;
  return request.headers['anthropic-version'] !== undefined || (request.headers['x-api-key'] !== undefined && request.headers.authorization === undefined);
}

/** A Gemini client sends its key as `x-goog-api-key` or `?key=`. */
function isGeminiClient(request: FastifyRequest): boolean {
  return request.headers['x-goog-api-key'] !== undefined || (request.headers.authorization === undefined && queryKeyOf(request) !== null);
}

type ModelListShape = Shape | 'google';

function modelListShape(request: FastifyRequest): ModelListShape {
  if (isAnthropicShaped(request)) return 'anthropic';
  return isGeminiClient(request) ? 'google' : 'openai';
}

/** The model a `/models/{model}` path names (clients may percent-escape the `/` of `provider/model`). */
function wildcardOf(request: FastifyRequest): string {
  const raw = (request.params as { '*'?: string })['*'] ?? '';
  try {
    return decodeURIComponent(raw).replace(/^models\//, '');
  } catch {
    return raw;
  }
}

async function dropIn(
  deps: AppDeps,
  gateway: Gateway,
  request: FastifyRequest,
  reply: Parameters<typeof forwardRequest>[3],
  { shape, path, caller: { billing, token } }: { shape: Shape; path: string; caller: Caller },
): Promise<void> {
  if (billing.spendKey) checkRequestShape(billing.spendKey, shape === 'anthropic' ? 'anthropic' : 'openai-compatible');
  const form = formOf(request);
  const body = form ? null : parseBody(request);
  const modelField = form?.fields.find((field) => field.name === 'model');
  const requested = (form ? modelField?.value : typeof body?.model === 'string' ? body.model : '') ?? '';
  const { provider, model } = routeModel(gateway, requested, shape);
  if (model !== requested) {
    // `provider/model` names the provider for us; the provider itself only knows the model.
    request.body = form && modelField ? replaceFieldValue(form.body, modelField, model) : Buffer.from(JSON.stringify({ ...body, model }));
  }
  const url = `${provider.baseUrl.replace(/\/$/, '')}${path}`;
  const target = resolveTarget(url, gateway.registry, deps.config.upstreamOverrides);
  const fromQuery = new URL(request.url, 'http://x').searchParams.get('metadata');
  await forwardRequest(deps, gateway, request, reply, { target, billing, metadata: metadataOf(request, fromQuery), credential: token });
}

type GeminiCall = { version: string; model: string; method: string; providerQuery: string; metadata: string | null };

/**
 * `/{version}/models/{model}:{method}?…` as @google/genai sends it. The model stays as sent
 * (percent-escapes included); `key` and `metadata` are Tollgate's, every other parameter
 * (`alt=sse`) goes on to Google.
 */
function geminiCallOf(rawUrl: string): GeminiCall {
  const question = rawUrl.indexOf('?');
  const path = question === -1 ? rawUrl : rawUrl.slice(0, question);
  const match = /^\/(v1beta|v1)\/models\/([^/:]+):([A-Za-z]+)$/.exec(path);
  if (!match || !GEMINI_METHODS.has(match[3]!)) {
    throw new ApiError('route_not_found', `No endpoint POST ${path}: the Gemini drop-in serves models/{model}:${[...GEMINI_METHODS].join('|')}.`);
  }
  const query = new URLSearchParams(question === -1 ? '' : rawUrl.slice(question + 1));
  const metadata = query.get('metadata');
  query.delete('key');
  query.delete('metadata');
  const rest = query.toString();
  return { version: match[1]!, model: match[2]!, method: match[3]!, providerQuery: rest === '' ? '' : `?${rest}`, metadata };
}

/** A multipart upload's body and text fields; null for any other body. */
function formOf(request: FastifyRequest): { body: Buffer; fields: FormField[] } | null {
  const boundary = multipartBoundary(request.headers['content-type']);
  if (!boundary || !Buffer.isBuffer(request.body)) return null;
  return { body: request.body, fields: formFields(request.body, boundary) };
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

const FAMILY_OF_SHAPE: Record<Shape, ProviderFamily> = { openai: 'openai-compatible', anthropic: 'anthropic' };

/** Picks the provider for a model: `provider/model` explicitly, else by the model's name. */
export function routeModel(gateway: Pick<Gateway, 'registry'>, requested: string, shape: Shape): { provider: ProviderModule; model: string } {
  if (!requested) {
    throw new ApiError('validation_error', 'model is required.', { issues: [{ path: ['model'], message: 'is required' }] });
  }
  const slash = requested.indexOf('/');
  const explicit = slash > 0 ? gateway.registry.getProvider(requested.slice(0, slash)) : undefined;
  const provider = explicit ?? gateway.registry.listProviders().find((p) => p.modelNames?.test(requested));
  if (!provider) {
    throw new ApiError('unsupported_provider', `No provider serves model "${requested}"; write it as provider/model.`, {
      issues: [{ path: ['model'], message: 'names no known provider' }],
    });
  }
  if (provider.family !== FAMILY_OF_SHAPE[shape]) {
    const where = shape === 'anthropic' ? 'the OpenAI-shaped endpoints' : 'POST /v1/messages';
    throw new ApiError('unsupported_provider', `Model "${requested}" is served by ${provider.id}; use ${where}.`, {
      issues: [{ path: ['model'], message: `is not served through this endpoint` }],
    });
  }
  return { provider, model: explicit ? requested.slice(slash + 1) : requested };
}

type ListedModel = { provider: ProviderModule; model: string; name: string };

/**
 * Models of every provider with a managed key, from the price catalog, each with the provider the
 * drop-in endpoints route it to. In the OpenAI and Anthropic lists a provider that is another API
 * of a keyed provider's account (Gemini's OpenAI-compatible path) is listed in its place when it
 * speaks a drop-in shape, since the native one may not (Gemini's native API has no OpenAI- or
 * Anthropic-shaped endpoint); Gemini's own list is the native provider's models.
 */
function listModels(deps: AppDeps, gateway: Gateway, shape: ModelListShape): ListedModel[] {
  const providers = new Set<ProviderModule>();
  for (const provider of servedProviders(deps, gateway)) {
    if (shape === 'google') {
      if (provider.family === 'google') providers.add(provider);
      continue;
    }
    const dropInTwin = gateway.registry.listProviders().find((p) => p.sharesAccountWith === provider.id && p.family === 'openai-compatible');
    const listed = provider.family === 'google' && dropInTwin ? dropInTwin : provider;
    if (shape === 'openai' || listed.family === 'anthropic') providers.add(listed);
  }
  const listed: ListedModel[] = [];
  for (const provider of providers) {
    const catalog = findCatalogProvider({ providerId: provider.sharesAccountWith ?? provider.id });
    for (const model of catalog?.models ?? []) {
      if (!model.deprecated) listed.push({ provider, model: model.id, name: model.name ?? model.id });
    }
    for (const model of provider.ownModels ?? []) listed.push({ provider, model, name: model });
  }
  return listed;
}

/** The providers a call can reach: those with a managed key, and those that answer in process with none (the demo). */
function servedProviders(deps: AppDeps, gateway: Gateway): ProviderModule[] {
  const keyed = Object.keys(deps.config.providerKeys).flatMap((id) => gateway.registry.getProvider(id) ?? []);
  const keyless = gateway.registry.listProviders().filter((p) => p.answerLocally !== undefined);
  return [...new Set([...keyed, ...keyless])];
}

/**
 * The models the caller may use: all listed for a secret key or no key, those a spend key's request shape
 * and allow-lists admit for a spend key. The cached key may be up to 2 s old: one read of its row
 * refuses a key just revoked, rotated, paused or expired on another instance.
 */
async function modelsVisibleTo(deps: AppDeps, gateway: Gateway, caller: Caller | null, shape: ModelListShape): Promise<ListedModel[]> {
  const spendKey = caller?.billing.spendKey ? await authenticateSpendKey(deps.storage, caller.token, dateOf(deps.clock)) : null;
  const models = listModels(deps, gateway, shape);
  return spendKey ? models.filter((m) => visibleTo(spendKey, m.provider, m.model)) : models;
}

/** What a spend key's allow-lists (and its request shape) let it use. */
function visibleTo(key: SpendKeyRow, provider: ProviderModule, model: string): boolean {
  return (
    requestShapeRefusal(key, provider.family) === null &&
    providerAllowed(key, provider.id, provider.sharesAccountWith) &&
    modelAllowed(key, provider.id, model)
  );
}

/** The listed model a path names, by the id its shape's list shows; a 404 in the caller's dialect otherwise. */
function findModel(models: ListedModel[], shape: ModelListShape, id: string): ListedModel {
  const found = models.find((m) => (shape === 'openai' ? openaiModel(m).id : m.model) === id);
  if (!found) throw notFound('model', id);
  return found;
}

/** OpenAI's list item; the id is one the drop-in endpoints route (`provider/model` but for OpenAI's own). */
function openaiModel({ provider, model }: ListedModel) {
  return { id: provider.id === 'openai' ? model : `${provider.id}/${model}`, object: 'model' as const, created: 0, owned_by: provider.id };
}

/** Anthropic's model object: its models are routed by their bare ids. */
function anthropicModel({ model, name }: ListedModel) {
  return { type: 'model' as const, id: model, display_name: name, created_at: '1970-01-01T00:00:00Z' };
}

/** Anthropic's model list (one page). */
function anthropicModelList(models: ListedModel[]) {
  const data = models.map(anthropicModel);
  return { data, has_more: false, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null };
}

/** Gemini's model resource. */
function geminiModel({ model, name }: ListedModel) {
  return { name: `models/${model}`, displayName: name };
}

/** Gemini's model list (one page: no `nextPageToken`). */
function geminiModelList(models: ListedModel[]) {
  return { models: models.map(geminiModel) };
}
