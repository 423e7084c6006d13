import { presentCheckoutSession } from '../commerce/checkout.ts';
import type { CommerceDeps } from '../commerce/subscriptions.ts';
import { principalOf } from '../http/auth.ts';
import { notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { errorResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import { checkoutSessionCreateBody, checkoutSessionSchema, createCheckoutSession, publicBase } from '../services/checkout-sessions.ts';
import { findCheckoutSession, listCheckoutSessions } from '../storage/checkout-sessions.ts';
import { merchantHasRow } from '../storage/pages.ts';

const tags = ['checkout sessions'];

export function registerCheckoutSessionRoutes(app: App, deps: CommerceDeps & { publicBaseUrl: string | undefined }): void {
  const { storage } = deps;

  app.post(
    '/checkout_sessions',
    {
      schema: {
        tags,
        body: checkoutSessionCreateBody,
        response: { 201: checkoutSessionSchema, ...standardErrors, 409: errorResponse('`subscription_exists`: the customer is already subscribed to this plan (another plan is a plan change)') },
      },
    },
    async (request, reply) => {
      const session = await createCheckoutSession(deps, principalOf(request).merchantId, request.body, publicBase(deps.publicBaseUrl, request));
      return reply.status(201).send(session);
    },
  );

  app.get(
    '/checkout_sessions',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(checkoutSessionSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (cid) => merchantHasRow(storage, 'checkout_sessions', merchantId, cid));
      const base = publicBase(deps.publicBaseUrl, request);
      return toPage(await listCheckoutSessions(storage, merchantId, cursor, limit), limit, (r) => presentCheckoutSession(r, null, base));
    },
  );

  app.get(
    '/checkout_sessions/:id',
    { schema: { tags, params: idParams, response: { 200: checkoutSessionSchema, ...standardErrors } } },
    async (request) => {
      const row = await findCheckoutSession(storage, principalOf(request).merchantId, request.params.id);
      if (!row) throw notFound('checkout session', request.params.id);
      return presentCheckoutSession(row, null, publicBase(deps.publicBaseUrl, request));
    },
  );
}
