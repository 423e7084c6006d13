import type { AppDeps } from '../app-deps.ts';
import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import {
  alertCreateBody,
  alertFiringSchema,
  alertSchema,
  alertUpdateBody,
  changeAlert,
  createAlert,
  getAlert,
  listAlertPage,
  listFiringPage,
  presentAlert,
  presentFiring,
  removeAlert,
} from '../services/alerts.ts';

const tags = ['alerts'];

/** Alert rules: a customer's low balance, a customer's or spend key's spend per period (decision 0043). */
export function registerAlertRoutes(app: App, deps: AppDeps): void {
  const { storage, clock } = deps;
  const now = () => new Date(clock.now());

  app.post(
    '/alerts',
    { schema: { tags, body: alertCreateBody, response: { 201: alertSchema, ...standardErrors } } },
    async (request, reply) => reply.status(201).send(presentAlert(await createAlert(deps, principalOf(request).merchantId, request.body), now())),
  );

  app.get(
    '/alerts',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(alertSchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      const at = now();
      return toPage(await listAlertPage(storage, principalOf(request).merchantId, cursor, limit), limit, (row) => presentAlert(row, at));
    },
  );

  app.get(
    '/alerts/:id',
    { schema: { tags, params: idParams, response: { 200: alertSchema, ...standardErrors } } },
    async (request) => presentAlert(await getAlert(storage, principalOf(request).merchantId, request.params.id), now()),
  );

  app.patch(
    '/alerts/:id',
    { schema: { tags, params: idParams, body: alertUpdateBody, response: { 200: alertSchema, ...standardErrors } } },
    async (request) => presentAlert(await changeAlert(deps, principalOf(request).merchantId, request.params.id, request.body), now()),
  );

  app.delete(
    '/alerts/:id',
    { schema: { tags, params: idParams, response: { 200: deletedResponse, ...standardErrors } } },
    async (request) => {
      await removeAlert(storage, principalOf(request).merchantId, request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );

  app.get(
    '/alerts/:id/firings',
    { schema: { tags, params: idParams, querystring: pageQuery, response: { 200: pageResponse(alertFiringSchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listFiringPage(storage, principalOf(request).merchantId, request.params.id, cursor, limit), limit, presentFiring);
    },
  );
}
