import { randomUUID } from 'node:crypto';
import fastifySwagger from '@fastify/swagger';
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { jsonSchemaTransform, validatorCompiler, type ZodTypeProvider } from 'fastify-type-provider-zod';
import { authenticateApiKey, principalOf } from './http/auth.ts';
import { ApiError, envelope, ERRORS } from './http/errors.ts';
import { installErrorHandling } from './http/error-handler.ts';
import { beginIdempotentRequest, finishIdempotentRequest } from './http/idempotency.ts';
import { installJsonBodyParser } from './http/json-body.ts';
import { lazyRequestLogger, loggerOptions } from './http/logging.ts';
import { rejectNulCharacters } from './http/nul-characters.ts';
import { installMetrics } from './http/metrics.ts';
import { documentSharedBehaviour } from './http/schemas.ts';
import type { App } from './http/types.ts';
import type { AppDeps, AppOptions } from './app-deps.ts';
import { broadcastCredentialChanges } from './gateway/credential-broadcast.ts';
import { systemClock } from './domain/clock.ts';
import { registerDropInRoutes, registerGeminiDropInRoutes } from './gateway/drop-in.ts';
import { createPaymentProvider } from './payments/index.ts';
import { CommerceState } from './commerce/state.ts';
import { createGateway, registerForwardRoutes } from './gateway/forward.ts';
import { registerAuthCallbackRoute } from './routes/auth-callback.ts';
import { registerRewriteRoutes } from './gateway/rewrite/route.ts';
import { registerAlertRoutes } from './routes/alerts.ts';
import { registerCreditBundleRoutes } from './routes/credit-bundles.ts';
import { registerConnectionRoutes, registerCustomerRoutes } from './routes/customers.ts';
import { registerHealthRoutes } from './routes/health.ts';
import { registerMeterRoutes } from './routes/meters.ts';
import { registerOpenApiRoute } from './routes/openapi.ts';
import { registerPaymentWebhookRoutes } from './routes/payment-webhooks.ts';
import { registerPaymentRoutes } from './routes/payments.ts';
import { registerPlanRoutes } from './routes/plans.ts';
import { registerRequestRoutes } from './routes/requests.ts';
import { registerSecretKeyRoutes } from './routes/secret-keys.ts';
import { registerSpendKeyRoutes } from './routes/spend-keys.ts';
import { registerSubscriptionRoutes } from './routes/subscriptions.ts';
import { registerCheckoutSessionRoutes } from './routes/checkout-sessions.ts';
import { registerCheckoutPage } from './web/checkout-page.ts';
import { registerWalletKeyRoutes } from './routes/wallet-keys.ts';
import { registerUsageRoutes } from './routes/usage.ts';
import { registerWebRoutes } from './web/index.ts';
import { registerWebhookRoutes } from './routes/webhooks.ts';
import { UnwrittenHolds } from './ledger/wallets.ts';

export type { AppDeps, AppOptions } from './app-deps.ts';

const BODY_LIMIT = 10 * 1024 * 1024;
const RATE_WINDOW_MS = 60_000;

/** A hop count trusts that many proxies nearest to us (Fastify's types take it as a function). */
function trustProxyOption(trust: boolean | number | string[]): boolean | string[] | ((address: string, hop: number) => boolean) {
  return typeof trust === 'number' ? (_address, hop) => hop < trust : trust;
}

/** The only wiring point: every route, hook and plugin is attached here. */
export async function buildApp(options: AppOptions): Promise<App> {
  const deps: AppDeps = {
    ...options,
    clock: options.clock ?? systemClock,
    payments: options.payments ?? createPaymentProvider(options.config),
    commerceState: options.commerceState ?? new CommerceState(),
  };
  const app = Fastify({
    logger: loggerOptions(deps.config.logLevel, deps.logStream),
    childLoggerFactory: lazyRequestLogger,
    bodyLimit: BODY_LIMIT,
    trustProxy: trustProxyOption(deps.config.trustProxy),
    genReqId: (req) => headerValue(req.headers['x-request-id']) ?? randomUUID(),
    // Fastify's own 503 while closing has its own body; closeConnectionsWhenShuttingDown answers
    // with the envelope instead.
    return503OnClosing: false,
    // The SDK's rewrite URLs carry `https://` inside the path; never merge slashes.
    routerOptions: { ignoreTrailingSlash: true, ignoreDuplicateSlashes: false, maxParamLength: 1000 },
    // Errors raised before routing (a malformed percent-escape) get the envelope too.
    frameworkErrors: (error, _request, reply: FastifyReply) => {
      const code = error.code === 'FST_ERR_BAD_URL' ? 'route_not_found' : 'validation_error';
      void reply.status(ERRORS[code].status).send(envelope(code, code === 'route_not_found' ? 'No such endpoint.' : error.message));
    },
  }).withTypeProvider<ZodTypeProvider>();

  app.setValidatorCompiler(validatorCompiler);
  // Response schemas document the API; handlers already build the exact shapes.
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
  installJsonBodyParser(app, BODY_LIMIT);
  installErrorHandling(app);
  // Background work (the webhook dispatcher) adds its metrics to the same registry.
  app.decorate('metrics', installMetrics(app, { token: deps.config.metricsToken }));
  closeConnectionsWhenShuttingDown(app, deps.config.shutdownGraceMs);

  await app.register(fastifySwagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Tollgate API',
        version: '1.0.0',
        description: 'Usage-billing and AI-proxy interface, v1. Money is a decimal string with 10 fractional digits.',
      },
      servers: [{ url: '/' }],
      components: {
        securitySchemes: { secretKey: { type: 'http', scheme: 'bearer', description: 'Merchant secret key' } },
      },
      security: [{ secretKey: [] }],
    },
    transform: jsonSchemaTransform,
    transformObject: (documents) =>
      'openapiObject' in documents ? documentSharedBehaviour(documents.openapiObject) : documents.swaggerObject,
  });

  const commerce = { storage: deps.storage, payments: deps.payments, clock: deps.clock, commerceState: deps.commerceState };
  registerHealthRoutes(app, deps);
  await app.register(async (scope) => registerCheckoutPage(scope, { ...commerce, rateLimiter: deps.rateLimiter, currency: deps.config.currency, publicBaseUrl: deps.config.publicBaseUrl }));
  await app.register(async (scope) => registerPaymentWebhookRoutes(scope.withTypeProvider<ZodTypeProvider>(), commerce), { prefix: '/v1' });
  registerOpenApiRoute(app);
  await registerWebRoutes(app, deps);

  // The holds this app admitted in process and has not written yet: every spending decision of the
  // app (the gateway's, POST /requests') subtracts them (decision 0011).
  const unwrittenHolds = new UnwrittenHolds();
  const gateway = createGateway(deps, app, unwrittenHolds);
  if (deps.config.redisUrl) {
    const broadcast = broadcastCredentialChanges(deps.storage, gateway.credentials, deps.config.redisUrl, app.log);
    app.addHook('onClose', () => broadcast.close());
  }
  await app.register(async (scope) => registerForwardRoutes(scope.withTypeProvider<ZodTypeProvider>(), deps, gateway), {
    prefix: '/v1',
  });
  await app.register(async (scope) => registerDropInRoutes(scope.withTypeProvider<ZodTypeProvider>(), deps, gateway), {
    prefix: '/v1',
  });
  // Gemini's native API, at the paths @google/genai builds from its base URL and API version.
  for (const prefix of ['/v1beta', '/v1']) {
    const modelReads = prefix === '/v1beta';
    await app.register(async (scope) => registerGeminiDropInRoutes(scope.withTypeProvider<ZodTypeProvider>(), deps, gateway, { modelReads }), { prefix });
  }
  await app.register(async (scope) => registerRewriteRoutes(scope.withTypeProvider<ZodTypeProvider>(), deps, gateway), {
    prefix: '/v1',
  });

  await app.register(
    async (v1) => {
      const api = v1.withTypeProvider<ZodTypeProvider>();
      api.addHook('onRequest', (request, reply) => authenticateAndLimit(deps, request, reply));
      rejectNulCharacters(api);
      api.addHook('preHandler', async (request, reply) => {
        if (request.method !== 'POST' || !request.principal) return;
        const outcome = await beginIdempotentRequest(deps.storage, request, reply, request.principal.keyId, deps.clock);
        if (outcome === 'replayed') return reply;
      });
      api.addHook('onSend', async (request, reply, payload) => {
        await finishIdempotentRequest(deps.storage, request, reply.statusCode, payload);
        return payload;
      });
      registerAuthCallbackRoute(api, deps);
      registerSecretKeyRoutes(api, deps);
      registerMeterRoutes(api, deps);
      registerCustomerRoutes(api, deps);
      registerConnectionRoutes(api, deps);
      registerRequestRoutes(api, deps, unwrittenHolds, gateway.settlements.pending);
      registerUsageRoutes(api, deps);
      registerSpendKeyRoutes(api, deps);
      registerWalletKeyRoutes(api, deps);
      registerPlanRoutes(api, deps);
      registerCreditBundleRoutes(api, deps);
      registerWebhookRoutes(api, deps);
      registerAlertRoutes(api, deps);
      registerSubscriptionRoutes(api, commerce);
      registerPaymentRoutes(api, commerce);
      registerCheckoutSessionRoutes(api, { ...commerce, publicBaseUrl: deps.config.publicBaseUrl });
    },
    { prefix: '/v1' },
  );

  return app;
}

async function authenticateAndLimit(deps: AppDeps, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  if (request.routeOptions.config.public) return;
  // A merchant secret key, or a wallet key on the routes that admit one.
  request.principal = await authenticateApiKey(deps.storage, request, deps.clock);
  const now = deps.clock.now();
  const decision = await deps.rateLimiter.hit(
    principalOf(request).keyId,
    deps.config.rateLimitPerMinute,
    RATE_WINDOW_MS,
    now,
  );
  reply.header('x-ratelimit-limit', String(decision.limit));
  reply.header('x-ratelimit-remaining', String(decision.remaining));
  reply.header('x-ratelimit-reset', String(decision.resetAt));
  if (!decision.allowed) {
    const retryAfter = Math.max(1, decision.resetAt - Math.floor(now / 1000));
    throw new ApiError('rate_limited', `Rate limit of ${decision.limit} requests per minute exceeded.`, {
      headers: { 'retry-after': String(retryAfter) },
    });
  }
}

/**
 * During shutdown, answers in flight are sent with `Connection: close`: otherwise a keep-alive
 * client would hold the server open until its socket times out. A request that arrives meanwhile
 * (the port accepts until the preClose hooks are done) is refused with 503 in the envelope, so the
 * client retries it elsewhere instead of starting work this process may not finish.
 *
 * Requests still in flight after `graceMs` (a stream that goes on, a client that stopped reading)
 * have their connections closed, so a shutdown ends within a deadline an orchestrator can wait for;
 * a forwarded request cut that way is settled from what was relayed, as any client that left.
 */
function closeConnectionsWhenShuttingDown(app: App, graceMs: number): void {
  let closing = false;
  let deadline: NodeJS.Timeout | undefined;
  app.addHook('preClose', async () => {
    closing = true;
    deadline = setTimeout(() => {
      app.log.warn({ graceMs }, 'shutdown grace period over: closing the connections of requests still in flight');
      app.server.closeAllConnections();
    }, graceMs);
  });
  app.addHook('onClose', async () => clearTimeout(deadline));
  app.addHook('onRequest', async () => {
    if (closing) throw new ApiError('service_unavailable', 'The server is shutting down; retry the request.');
  });
  app.addHook('onSend', async (_request, reply, payload) => {
    if (closing) reply.header('connection', 'close');
    return payload;
  });
}

function headerValue(v: string | string[] | undefined): string | undefined {
  const s = Array.isArray(v) ? v[0] : v;
  return s && s.length <= 128 ? s : undefined;
}
