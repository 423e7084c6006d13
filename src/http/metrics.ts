import { timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { collectDefaultMetrics, Histogram, Registry } from 'prom-client';
import { ApiError } from './errors.ts';

declare module 'fastify' {
  interface FastifyInstance {
    /** The registry /metrics serves. */
    metrics: Registry;
  }
}

/**
 * Prometheus metrics at /metrics. Each app gets its own registry, so several apps in one
 * process (tests, two instances) never fight over metric names. With a token, only a scraper
 * that sends it may read them (route names and traffic volumes are not for everyone).
 */
export function installMetrics(app: FastifyInstance, opts: { token?: string | undefined } = {}): Registry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'tollgate_' });
  const duration = new Histogram({
    name: 'tollgate_http_request_duration_seconds',
    help: 'HTTP request duration by route and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
    registers: [registry],
  });

  app.addHook('onResponse', async (request, reply) => {
    duration.observe(
      { method: request.method, route: request.routeOptions.url ?? 'unmatched', status: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
  });

  app.get('/metrics', { config: { public: true }, schema: { hide: true } }, async (request, reply) => {
    if (opts.token !== undefined && !bearerMatches(request, opts.token)) {
      throw new ApiError('unauthorized', 'GET /metrics needs Authorization: Bearer <METRICS_TOKEN>.');
    }
    reply.type(registry.contentType);
    return registry.metrics();
  });
  return registry;
}

function bearerMatches(request: FastifyRequest, token: string): boolean {
  const header = request.headers.authorization;
  if (!header?.startsWith('Bearer ')) return false;
  const sent = Buffer.from(header.slice('Bearer '.length));
  const expected = Buffer.from(token);
  return sent.length === expected.length && timingSafeEqual(sent, expected);
}
