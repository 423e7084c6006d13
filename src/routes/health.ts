import { sql } from 'kysely';
import { z } from 'zod';
import { ApiError } from '../http/errors.ts';
import type { App, AppDeps } from '../http/types.ts';

const healthResponse = z.object({ status: z.literal('ok') });
const readyResponse = z.object({ status: z.literal('ready'), database: z.enum(['sqlite', 'postgres']) });

export function registerHealthRoutes(app: App, deps: AppDeps): void {
  // Liveness: the process answers. It must not depend on the database.
  app.get(
    '/healthz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: healthResponse } } },
    async () => ({ status: 'ok' as const }),
  );

  // Readiness: the database answers a query.
  app.get(
    '/readyz',
    { config: { public: true }, schema: { tags: ['operations'], security: [], response: { 200: readyResponse } } },
    async () => {
      try {
        await sql`select 1`.execute(deps.storage.db);
      } catch {
        throw new ApiError('service_unavailable', 'The database is not reachable.');
      }
      return { status: 'ready' as const, database: deps.storage.dialect };
    },
  );
}
