import { sql } from 'kysely';
import { z } from 'zod';
import { databaseUnavailable } from '../http/error-handler.ts';
import type { App, AppDeps } from '../http/types.ts';

const healthResponse = z.object({ status: z.literal('ok') });
const readyResponse = z.object({
  status: z.enum(['ready', 'degraded']),
  database: z.enum(['sqlite', 'postgres']),
  redis: z.enum(['ready', 'unreachable']).optional(),
});

export function registerHealthRoutes(app: App, deps: AppDeps): void {
  // Liveness: the process answers. It must not depend on the database.
  app.get(
    '/healthz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: healthResponse } } },
    async () => ({ status: 'ok' as const }),
  );

  // Readiness: the database answers a query (else 503). With REDIS_URL, Redis is checked too, but
  // its loss only degrades the instance (rate limits counted locally): every instance shares that
  // Redis, and failing readiness would take all of them out of service at once.
  app.get(
    '/readyz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: readyResponse } } },
    async () => {
      try {
        await sql`select 1`.execute(deps.storage.db);
      } catch {
        throw databaseUnavailable();
      }
      const database = deps.storage.dialect;
      if (!deps.config.redisUrl) return { status: 'ready' as const, database };
      const redis = (await deps.rateLimiter.reachable()) ? ('ready' as const) : ('unreachable' as const);
      return { status: redis === 'ready' ? ('ready' as const) : ('degraded' as const), database, redis };
    },
  );
}
