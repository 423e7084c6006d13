import { z } from 'zod';
import { principalOf } from '../http/auth.ts';
import { notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { findCreditBundle, listCreditBundles } from '../storage/plans.ts';
import { creditBundleSchema, presentCreditBundle } from '../services/plans.ts';
import { merchantHasRow } from '../storage/pages.ts';

const listQuery = pageQuery.extend({
  plan_id: z.string().min(1).max(100).optional(),
  subscription_config_id: z.string().min(1).max(100).optional().describe('Older name of plan_id'),
});

const tags = ['credit bundles'];

/** Credit bundles are created and changed through their plan; here they are read. */
export function registerCreditBundleRoutes(app: App, { storage }: AppDeps): void {
  app.get(
    '/credit_bundles',
    { schema: { tags, querystring: listQuery, response: { 200: pageResponse(creditBundleSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      const planId = request.query.plan_id ?? request.query.subscription_config_id;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'credit_bundles', merchantId, id));
      const rows = await listCreditBundles(storage, merchantId, { cursor, limit, ...(planId ? { planId } : {}) });
      return toPage(rows, limit, presentCreditBundle);
    },
  );

  app.get(
    '/credit_bundles/:id',
    { schema: { tags, params: idParams, response: { 200: creditBundleSchema, ...standardErrors } } },
    async (request) => {
      const row = await findCreditBundle(storage, principalOf(request).merchantId, request.params.id);
      if (!row) throw notFound('credit bundle', request.params.id);
      return presentCreditBundle(row);
    },
  );
}
