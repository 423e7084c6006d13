import type { ServerResponse } from 'node:http';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Dispatcher } from 'undici';
import { admitWithAutoTopUp } from '../commerce/auto-top-up.ts';
import { dateOf } from '../domain/clock.ts';
import { newId } from '../domain/ids.ts';
import { lookupBasePrices } from '../domain/base-prices.ts';
import type { BasePrices } from '../domain/pricing.ts';
import { ApiError, validationError, type ErrorCode } from '../http/errors.ts';
import { assertJsonDepth } from '../http/json-depth.ts';
import { outsideMetadata, type Metadata } from '../http/metadata.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { ADMIT_JOB, payingWalletIds, type AdmitInput } from '../ledger/admission/admit.ts';
import { admitDeferred, deferredWrites, type DeferredAdmission, type DeferredWrites } from '../ledger/admission/deferred.ts';
import type { UnwrittenHolds } from '../ledger/wallets.ts';
import { pricingFor } from '../ledger/billing.ts';
import { WalletLeases } from '../ledger/leases.ts';
import { createRegistry, type ProviderModule, type ProviderRegistry } from '../providers/index.ts';
import { dialectOfFamily, installDialectErrorHandler, renderError, type ErrorDialect } from './error-dialects.ts';
import { CredentialCache, watchCredentialChanges } from './credential-cache.ts';
import { extractCredential, resolveCredential } from './credentials.ts';
import type { BillingContext } from '../ledger/billing.ts';
import { checkSpendKeyRequest, SpendKeyBuckets, spendKeyError } from './spend-key-guard.ts';
import { estimateHold } from './hold-estimate.ts';
import { ProviderContextSizes } from './provider-context.ts';
import { DEFAULT_HOLD_RULES } from '../providers/estimate.ts';
import { HoldKeeper } from '../ledger/hold-keeper.ts';
import { closeAfterResponse, createUpstreamAgent, relay, shutdownHeaders, upstreamRequestHeaders, type RelayOutcome, type ResponseTranslator } from './relay.ts';
import { uploadFields } from './form-fields.ts';
import { claimForwardKey, finishForwardKey, releaseForwardKey, tapResponse } from './forward-idempotency.ts';
import { upstreamFor } from './local-upstream.ts';
import type { CallJournal } from '../ledger/journal/journal.ts';
import { admittedLine } from '../ledger/journal/calls.ts';
import { Settlements } from './settle.ts';
import type { ForwardPlan } from './forward-plan.ts';
import { GroupCommitWriter } from '../ledger/group-commit.ts';
import { isDatabaseUnavailable } from '../storage/errors.ts';
import { resolveTarget, splitForwardQuery, type ResolvedTarget } from './target.ts';

export type Gateway = {
  registry: ProviderRegistry;
  /** Resolved credentials, emptied by every credential change made through this app's storage. */
  credentials: CredentialCache;
  /** Spend keys' rate-limit buckets (and the Redis client they use). */
  buckets: SpendKeyBuckets;
  agent: Dispatcher;
  settlements: Settlements;
  /** Group commit of admissions made on the response path. */
  writer: GroupCommitWriter;
  /** Group commit of work off the response path: settlements, failures, deferred admission writes. */
  background: GroupCommitWriter;
  /** Where deferred admissions are written from: the background writer, after a short delay (decision 0011). */
  deferredWrites: DeferredWrites;
  /** Keeps the holds of requests still relaying (and wallet leases) from expiring. */
  holds: HoldKeeper;
  /** PostgreSQL: this instance's leases on hot wallets (decision 0013); null on SQLite or when off. */
  leases: WalletLeases | null;
  /**
   * The call journal (decision 0024): each call is written to it before its provider is called, so
   * a crash before its settlement commits leaves it to the next start's replay. Null when off.
   */
  journal: CallJournal | null;
  /** True once the app started closing (hijacked responses then close their connections). */
  closing: boolean;
  /** Base prices by provider and model (see pricesOf). */
  prices: Map<string, { prices: BasePrices | null; until: number }>;
  /** Resolved forward targets by the `u` they were given (see targetOf). */
  targets: Map<string, ResolvedTarget>;
  /** Sizes of provider-side context (previous responses, cached content) learned from usage. */
  contexts: ProviderContextSizes;
};

/** The background writer's largest batch (settlements, failures, deferred admission writes). */
const SETTLEMENT_MAX_BATCH = 256;

/** The forward gateway's shared parts; closing the app waits for settlements in flight. */
/** `unwritten`: the app's holds admitted in process and not written yet (decision 0011), which POST /requests subtracts too. */
export function createGateway(deps: AppDeps, app: App, unwritten: UnwrittenHolds): Gateway {
  const credentials = new CredentialCache(deps.clock);
  // Installed now, before any request: every credential change from here on empties the cache.
  watchCredentialChanges(deps.storage, credentials);
  // Admissions never share a batch with settlements: the next request's admission would wait for
  // the previous request's settlement.
  const writer = new GroupCommitWriter(deps.storage, app.log);
  // Settlement batches take up to 256 members (decision 0008): SQLite pays per page a commit
  // writes, and PostgreSQL a few round trips per batch, so a larger batch costs less per request.
  // A batch is only that large when that much is queued.
  const background = new GroupCommitWriter(deps.storage, app.log, { maxBatch: SETTLEMENT_MAX_BATCH });
  const holds = new HoldKeeper(deps.storage, deps.config.holdTtlMs, app.log, deps.clock);
  const { walletLeaseHotAfter: hotAfter, walletLeaseIdleMs: idleMs, walletLeaseTtlMs: ttlMs } = deps.config;
  // Leases live seconds, not a request hold's TTL, so a dead instance's slice returns quickly (decision 0019).
  const leaseKeeper = deps.storage.dialect === 'postgres' && hotAfter !== null ? new HoldKeeper(deps.storage, ttlMs, app.log, deps.clock) : null;
  const contexts = new ProviderContextSizes();
  const gateway: Gateway = {
    contexts,
    registry: createRegistry({ custom: deps.config.customProviders }),
    credentials,
    buckets: new SpendKeyBuckets(deps.storage, deps.config.redisUrl, deps.clock),
    agent: createUpstreamAgent({
      headersTimeoutMs: deps.config.upstreamTimeoutMs,
      bodyTimeoutMs: deps.config.upstreamIdleTimeoutMs,
    }),
    settlements: new Settlements(app.log, background, contexts, deps.journal ?? null),
    writer,
    background,
    deferredWrites: deferredWrites(background, unwritten, deps.config.admissionWriteDelayMs),
    holds,
    leases: leaseKeeper && hotAfter !== null ? new WalletLeases(deps.storage, leaseKeeper, { hotAfter, idleMs, ttlMs }, app.log, deps.clock) : null,
    journal: deps.journal ?? null,
    closing: false,
    prices: new Map(),
    targets: new Map(),
  };
  // Tests look at the app's own state through it (e.g. what its credential cache holds).
  app.decorate('gateway', gateway);
  app.addHook('preClose', async () => {
    gateway.closing = true;
  });
  app.addHook('onClose', async () => {
    await gateway.settlements.drain();
    await gateway.holds.close();
    await background.drain();
    await gateway.writer.drain();
    // Every settlement is written: no admission's share is left in a lease.
    await gateway.leases?.close();
    await leaseKeeper?.close();
    // Every relay has ended: what the agent still has is idle sockets and connects no request waits
    // for (a provider that never finishes a TLS handshake), which close() would wait out.
    await gateway.agent.destroy();
    await gateway.buckets.close();
  });
  return gateway;
}

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;
/** What a provider answering in process (the demo) is given as its managed key: it needs none. */
const LOCAL_PROVIDER_KEY = 'local';
/**
 * The record's id on every forwarded response: Tollgate's own header, and the one the published
 * client's documents promise.
 */
function requestIdHeaders(requestId: string): Record<string, string> {
  return { 'x-tollgate-request-id': requestId, 'x-lava-request-id': requestId };
}

/**
 * `/v1/forward?u=<target>`: admission (hold), relay, then settlement off the response path.
 * Registered in its own scope: bodies arrive as raw bytes (passed through byte for byte), and the
 * standard endpoints' secret-key auth, rate limit and idempotency do not apply.
 */
export function registerForwardRoutes(app: App, deps: AppDeps, gateway: Gateway): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_request, body, done) => done(null, body));

  // The call is authorised before its body is read (onRequest runs before parsing): a caller
  // without a valid credential never makes the server buffer up to the body limit.
  const calls = new WeakMap<FastifyRequest, ForwardCall>();
  installDialectErrorHandler(app, (request) => forwardDialectOf(gateway, request));
  app.addHook('onRequest', async (request) => {
    calls.set(request, await authorisedForwardCall(deps, gateway, request));
  });
  // `/forward?u=<full url>`, and `/forward/<path>?u=<base url>` from clients that append their
  // path to a base URL which is the forward URL (openai 7, @google/genai, …).
  for (const url of ['/forward', '/forward/*']) {
    app.route({
      method: [...METHODS],
      url,
      // HEAD is not a forwarded verb: without this Fastify would answer it by running the GET route.
      exposeHeadRoute: false,
      schema: { hide: true },
      handler: async (request, reply) => {
        await forwardRequest(deps, gateway, request, reply, calls.get(request) ?? (await authorisedForwardCall(deps, gateway, request)));
      },
    });
  }
}

/** The error dialect of the provider a forward URL names; Tollgate's envelope when it names none. */
function forwardDialectOf(gateway: Gateway, request: FastifyRequest): ErrorDialect {
  const { target } = splitForwardQuery(request.url, forwardPathOf(request.url));
  if (!target) return 'tollgate';
  try {
    const provider = gateway.registry.findProvider(new URL(target));
    return provider ? dialectOfFamily(provider.family) : 'tollgate';
  } catch {
    return 'tollgate';
  }
}

/** What follows `/forward` in the request's path, as sent (`/chat/completions`), or ''. */
function forwardPathOf(rawUrl: string): string {
  const question = rawUrl.indexOf('?');
  const path = question === -1 ? rawUrl : rawUrl.slice(0, question);
  const at = path.indexOf('/forward');
  return at === -1 ? '' : path.slice(at + '/forward'.length);
}

/** The target, payer and metadata of a /v1/forward call, from its URL and headers alone. */
async function authorisedForwardCall(deps: AppDeps, gateway: Gateway, request: FastifyRequest): Promise<ForwardCall> {
  const { target: rawTarget, params } = splitForwardQuery(request.url, forwardPathOf(request.url));
  if (!rawTarget) {
    throw new ApiError('validation_error', 'The query parameter u (the provider URL to forward to) is required.', {
      issues: [{ path: ['u'], message: 'is required' }],
    });
  }
  const target = targetOf(gateway, rawTarget, deps.config.upstreamOverrides);
  const credential = extractCredential(request.headers, target.strippedKey ?? params.get('key'));
  if (!credential) {
    throw new ApiError('unauthorized', 'Missing credential: send Authorization: Bearer <secret key or forward token>.');
  }
  const billing = await resolveCredential(deps.storage, gateway.credentials, credential.token, dateOf(deps.clock));
  return { target, billing, metadata: metadataOf(request, params.get('metadata')), credential: credential.token };
}

/** How long a model's catalog price is reused (the catalog has dated prices; they change rarely). */
const PRICE_TTL_MS = 60_000;
const PRICE_CACHE_MAX = 1_000;

/** The base prices of a provider's model, from the catalog (or an override), looked up once a minute. */
function pricesOf(gateway: Gateway, provider: ProviderModule, model: string, config: AppDeps['config'], now: number): BasePrices | null {
  const key = `${provider.id}\n${model}`;
  const hit = gateway.prices.get(key);
  if (hit && hit.until > now) return hit.prices;
  const prices = lookupBasePrices(provider.id, model, { overrides: config.priceOverrides, account: provider.sharesAccountWith, ownPrices: provider.ownPrices });
  if (gateway.prices.size >= PRICE_CACHE_MAX) gateway.prices.clear();
  gateway.prices.set(key, { prices, until: now + PRICE_TTL_MS });
  return prices;
}

const TARGET_CACHE_MAX = 1_000;

/**
 * resolveTarget, remembered per `u`: it is pure (the registry and the overrides are fixed for the
 * gateway's life) and parsing and checking a URL is a visible share of a forwarded request. A
 * target carrying a `key` credential, or refused, is never kept.
 */
function targetOf(gateway: Gateway, rawTarget: string, overrides: Readonly<Record<string, string>>): ResolvedTarget {
  const hit = gateway.targets.get(rawTarget);
  if (hit) return hit;
  const target = resolveTarget(rawTarget, gateway.registry, overrides);
  if (target.strippedKey === null) {
    if (gateway.targets.size >= TARGET_CACHE_MAX) gateway.targets.clear();
    gateway.targets.set(rawTarget, target);
  }
  return target;
}

/** The operator's key for a provider: its own, else its account's (GOOGLE_API_KEY serves both Gemini paths). */
export function managedKeyFor(config: Pick<AppDeps['config'], 'providerKeys'>, provider: Pick<ProviderModule, 'id' | 'sharesAccountWith'>): string | undefined {
  const account = provider.sharesAccountWith;
  return config.providerKeys[provider.id] ?? (account === undefined ? undefined : config.providerKeys[account]);
}

export type ForwardCall = {
  target: ResolvedTarget;
  billing: BillingContext;
  metadata: Metadata;
  rewrite?: Rewrite;
  /** The dialect of Tollgate's own errors to this caller; default: that of the target provider's clients. */
  dialect?: ErrorDialect;
  /** The caller's raw credential (scopes and seals its Idempotency-Keys); default: the one its headers carry. */
  credential?: string;
};

/** The rewrite proxy's changes to a forwarded call: its body and headers, and its answer's translation. */
export type Rewrite = { body: unknown; headers: Record<string, string | string[] | undefined>; translator: ResponseTranslator };

/**
 * Forwards one request whose target and payer are known: used by /v1/forward and by the drop-in
 * provider endpoints. Refusals before the provider is called are thrown as ApiErrors.
 */
export async function forwardRequest(
  deps: AppDeps,
  gateway: Gateway,
  request: FastifyRequest,
  reply: FastifyReply,
  call: ForwardCall,
): Promise<void> {
  // Most calls carry no key: they pay nothing for the feature.
  const key =
    request.headers['idempotency-key'] === undefined
      ? null
      : await claimForwardKey(deps.storage, deps.clock, request, reply, {
          credential: call.credential ?? extractCredential(request.headers, null)?.token ?? '',
          leaseMs: deps.config.holdTtlMs,
        });
  if (key === 'replayed') return;
  let plan: ForwardPlan;
  try {
    plan = await planForward(deps, gateway, request, call);
  } catch (err) {
    // Refused before the provider was called: nothing was charged, the key is free for a retry.
    if (key) await releaseForwardKey(deps.storage, key);
    throw err;
  }
  reply.hijack();
  const tap = key ? tapResponse(reply.raw) : null;
  const outcome = await forward(deps, gateway, plan, reply.raw);
  if (key && tap) {
    await finishForwardKey(deps.storage, key, outcome, tap, request.log).catch((err: unknown) => {
      request.log.error({ err, idempotencyKey: key.claim.key }, 'the answer of an idempotent forward could not be stored');
    });
  }
}

/** Everything decided before the provider is called; any refusal here costs no provider call. */
async function planForward(
  deps: AppDeps,
  gateway: Gateway,
  request: FastifyRequest,
  { target, billing, metadata, rewrite, dialect }: ForwardCall,
): Promise<ForwardPlan> {
  const { config, storage } = deps;
  // Every forwarded request ends in background work (its settlement or failure, maybe its
  // admission's write): while that writer is behind, new requests wait for it.
  const room = gateway.background.room();
  if (room) await room;

  let body = rewrite ? Buffer.from(JSON.stringify(rewrite.body)) : Buffer.isBuffer(request.body) && request.body.length > 0 ? request.body : undefined;
  let requestJson = rewrite ? rewrite.body : (parseJsonBody(request, body) ?? uploadFields(request.headers['content-type'], body));
  let hideInjectedUsage = false;
  if (target.provider.requestsStream(requestJson, target.publicUrl)) {
    const prepared = target.provider.prepareStreamRequest(requestJson, target.publicUrl);
    if (prepared.body !== requestJson) {
      requestJson = prepared.body;
      body = Buffer.from(JSON.stringify(prepared.body));
    }
    hideInjectedUsage = prepared.injectedUsage;
  }

  const providerKey = billing.providerKey ?? managedKeyFor(config, target.provider) ?? (target.provider.answerLocally ? LOCAL_PROVIDER_KEY : undefined);
  if (!providerKey) {
    throw new ApiError(
      'provider_key_missing',
      `No managed key is configured for ${target.provider.id}; configure one or pass provider_key in the forward token.`,
    );
  }
  const providerKeyType = billing.providerKey ? 'unmanaged' : 'managed';
  const headers = upstreamRequestHeaders(rewrite?.headers ?? request.headers, body?.length);
  target.provider.applyAuth(headers, providerKey);

  const model = target.provider.modelFrom(requestJson, target.publicUrl);
  if (model?.includes('\u0000')) {
    throw validationError([{ path: ['model'], message: 'must not contain the NUL character (\\u0000)' }]);
  }
  const spendKeyRequest = { providerId: target.provider.id, family: target.provider.family, model, sharesAccountWith: target.provider.sharesAccountWith };
  if (billing.spendKey) {
    checkSpendKeyRequest(billing.spendKey, spendKeyRequest);
    await gateway.buckets.take(billing.spendKey);
  }
  const prices = model ? pricesOf(gateway, target.provider, model, config, deps.clock.now()) : null;
  const { pricing, walletId, meterPriced } = pricingFor(billing);
  const serviceChargeRate = billing.serviceChargeRate ?? config.serviceChargeRate;
  const holdRules = target.provider.holdRules ?? DEFAULT_HOLD_RULES;
  const contexts = { merchantId: billing.merchantId, keys: ProviderContextSizes.referencesOf(billing.merchantId, holdRules, requestJson), rules: holdRules };
  const estimate = estimateHold({
    requestBody: requestJson,
    pricing,
    prices,
    baseCostCharged: providerKeyType === 'managed' && prices !== null,
    serviceChargeRate,
    defaultOutputCap: config.defaultMaxOutputTokens,
    referenceTokens: config.mediaReferenceHoldTokens,
    contextTokens: gateway.contexts.tokensFor(contexts.keys, config.providerContextHoldTokens),
    rules: holdRules,
    model,
  });

  const requestId = newId('request');
  const endpoint = `${request.method} ${target.publicUrl.toString()}`;
  const admission: AdmitInput = {
    requestId,
    billing,
    walletId,
    estimate,
    ttlMs: config.holdTtlMs,
    now: dateOf(deps.clock),
    record: {
      provider: target.provider.id,
      model,
      endpoint,
      provider_key_type: providerKeyType,
      metadata,
    },
    spendKeyRequest,
    unwritten: gateway.deferredWrites.unwritten,
  };
  const admitted = await admitWithAutoTopUp(
    deps,
    () => ({ walletId, needed: estimate.wallet, drawsPlanCredit: meterPriced && billing.drawsPlanCredit === true, unwritten: gateway.deferredWrites.unwritten }),
    () => admit(storage, gateway, admission),
  ).catch((err: unknown) => {
    // The commit may have landed before the connection was lost: the request is not sent, so its
    // record and holds are released once the database answers again (decision 0019).
    if (isDatabaseUnavailable(err)) gateway.settlements.releaseUnsent(storage, requestId, deps.clock);
    throw err;
  });
  if (admitted.outcome === 'insufficient_balance') {
    throw new ApiError('insufficient_balance', undefined, { headers: requestIdHeaders(requestId) });
  }
  if (admitted.outcome === 'spend_key_refused') throw spendKeyError(admitted.refusal);
  return {
    requestId,
    admission,
    recordId: admitted.recordId,
    holdIds: admitted.holdIds,
    admittedAt: admitted.createdAt,
    deferred: admitted.deferred,
    method: request.method,
    endpoint,
    target,
    billing,
    headers,
    body,
    requestJson,
    hideInjectedUsage,
    model,
    prices,
    providerKeyType,
    metadata,
    contexts,
    translator: rewrite?.translator,
    dialect: dialect ?? dialectOfFamily(target.provider.family),
  };
}

/**
 * The embedded shape decides in process and writes later (decision 0011), and so do PostgreSQL
 * requests on hot wallets, taken from this instance's leases on them (decision 0013). A spend
 * key's limits and every other PostgreSQL decision are taken in the database before the provider
 * is called.
 */
function admit(storage: AppDeps['storage'], gateway: Gateway, admission: AdmitInput): Promise<DeferredAdmission> {
  if (admission.billing.spendKey) return gateway.writer.run(ADMIT_JOB, admission);
  if (storage.dialect === 'sqlite') return admitDeferred(storage, gateway.deferredWrites, admission);
  if (gateway.leases?.serves(payingWalletIds(admission))) return admitFromLeases(storage, gateway, gateway.leases, admission);
  return gateway.writer.run(ADMIT_JOB, admission);
}

/**
 * A lease that cannot cover the request is not the wallet's last word: the database decides, as
 * for a cold wallet, so a wallet that can pay is not refused for how this instance sliced it
 * (decision 0019).
 */
async function admitFromLeases(storage: AppDeps['storage'], gateway: Gateway, leases: WalletLeases, admission: AdmitInput): Promise<DeferredAdmission> {
  const leased = await admitDeferred(storage, gateway.deferredWrites, admission, leases);
  return leased.outcome === 'insufficient_balance' ? gateway.writer.run(ADMIT_JOB, admission) : leased;
}

async function forward(deps: AppDeps, gateway: Gateway, plan: ForwardPlan, res: ServerResponse): Promise<RelayOutcome> {
  const closing = () => gateway.closing;
  const unjournalled = journalAdmitted(deps, gateway, plan);
  if (unjournalled) {
    // Not sent: a call that could not be journalled could be served and then lost to a crash.
    const notSent: RelayOutcome = { kind: 'failed', reason: 'unreachable' };
    gateway.settlements.refuseUnjournalled(deps, plan, unjournalled, notSent);
    sendError(res, new ApiError('service_unavailable', 'The gateway cannot record calls right now.'), plan, closing);
    return notSent;
  }
  gateway.holds.add(plan.holdIds);
  gateway.settlements.relayStarted(plan);
  try {
    const { provider } = plan.target;
    const outcome = await relay({
      agent: upstreamFor(provider, gateway.agent, deps.clock),
      // A provider answering in process is asked at its own address, whatever an override says.
      upstreamUrl: provider.answerLocally ? plan.target.publicUrl : plan.target.upstreamUrl,
      method: plan.method,
      headers: plan.headers,
      body: plan.body,
      provider: plan.target.provider,
      meterContext: { url: plan.target.publicUrl, requestBody: plan.requestJson, now: deps.clock.now() },
      hideInjectedUsage: plan.hideInjectedUsage,
      extraHeaders: requestIdHeaders(plan.requestId),
      res,
      closing,
      translator: plan.translator,
    }).finally(() => gateway.holds.delete(plan.holdIds));
    if (outcome.kind === 'failed') {
      const code: ErrorCode = outcome.reason === 'timeout' ? 'upstream_timeout' : 'upstream_unreachable';
      sendError(res, new ApiError(code), plan, closing);
    }
    // The client has its answer; the record and the money are settled off its path.
    gateway.settlements.settle(deps, plan, outcome);
    return outcome;
  } finally {
    gateway.settlements.relayEnded();
  }
}

/**
 * Writes the admitted call to the call journal, before its provider is called (decision 0024);
 * the error when the journal cannot be written (a full or failing disk), else null.
 */
function journalAdmitted(deps: AppDeps, gateway: Gateway, plan: ForwardPlan): unknown {
  if (!gateway.journal) return null;
  const { admission } = plan;
  try {
    plan.journalled = gateway.journal.admitted(
      plan.recordId,
      admittedLine({
        id: plan.recordId,
        admittedAt: plan.admittedAt,
        ttlMs: admission.ttlMs,
        walletId: admission.walletId,
        estimate: admission.estimate,
        record: admission.record,
        billing: plan.billing,
        prices: plan.prices,
        baseCostCharged: plan.providerKeyType === 'managed' && plan.prices !== null,
        serviceChargeRate: plan.billing.serviceChargeRate ?? deps.config.serviceChargeRate,
      }),
    );
    return null;
  } catch (err) {
    return err ?? new Error('the call journal could not be written');
  }
}

/** An error of Tollgate's own after the response was taken over from Fastify, in the caller's dialect. */
function sendError(res: ServerResponse, error: ApiError, plan: Pick<ForwardPlan, 'requestId' | 'dialect'>, closing: () => boolean): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(error.status, {
    'content-type': 'application/json; charset=utf-8',
    ...requestIdHeaders(plan.requestId),
    ...shutdownHeaders(closing),
  });
  res.end(JSON.stringify(renderError(plan.dialect, error)));
  if (closing()) closeAfterResponse(res);
}

/** Request metadata from the `metadata` query parameter and the metadata headers, merged (see outsideMetadata). */
export function metadataOf(request: FastifyRequest, fromQuery: string | null): Metadata {
  return outsideMetadata(fromQuery, request.headers);
}

function parseJsonBody(request: FastifyRequest, body: Buffer | undefined): unknown {
  if (!body || !String(request.headers['content-type'] ?? '').includes('json')) return undefined;
  const text = body.toString('utf8');
  // Ours to judge: every estimate and usage walk over it must stay shallow.
  assertJsonDepth(text);
  try {
    return JSON.parse(text);
  } catch {
    // Not ours to judge: the provider answers a malformed body itself.
    return undefined;
  }
}

export type { ProviderModule };

declare module 'fastify' {
  interface FastifyInstance {
    /** The forward gateway's shared parts (createGateway). */
    gateway: Gateway;
  }
}
