import { principalOf } from '../http/auth.ts';
import { standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { dateOf } from '../domain/clock.ts';
import { usageQuery, usageReport, usageResponseSchema } from '../services/usage-reports.ts';

export function registerUsageRoutes(app: App, { storage, clock }: AppDeps): void {
  app.get(
    '/usage',
    { schema: { tags: ['usage'], querystring: usageQuery, response: { 200: usageResponseSchema, ...standardErrors } } },
    async (request) => {
      return usageReport(storage, principalOf(request).merchantId, request.query, dateOf(clock));
    },
  );
}
