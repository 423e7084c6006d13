import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, idParams, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  changeMeter,
  createMeter,
  deleteMeter,
  getMeter,
  listMeterPage,
  meterCreateBody,
  meterSchema,
  meterUpdateBody,
  presentMeter,
} from '../services/meters.ts';

const tags = ['meters'];

export function registerMeterRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/meters',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(meterSchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listMeterPage(storage, principalOf(request).merchantId, cursor, limit), limit, presentMeter);
    },
  );

  app.post(
    '/meters',
    { schema: { tags, body: meterCreateBody, response: { 201: meterSchema, ...standardErrors } } },
    async (request, reply) => {
      const row = await createMeter(deps, principalOf(request).merchantId, request.body);
      return reply.status(201).send(presentMeter(row));
    },
  );

  app.get(
    '/meters/:id',
    { schema: { tags, params: idParams, response: { 200: meterSchema, ...standardErrors } } },
    async (request) => presentMeter(await getMeter(storage, principalOf(request).merchantId, request.params.id)),
  );

  app.patch(
    '/meters/:id',
    { schema: { tags, params: idParams, body: meterUpdateBody, response: { 200: meterSchema, ...standardErrors } } },
    async (request) => presentMeter(await changeMeter(storage, principalOf(request).merchantId, request.params.id, request.body)),
  );

  app.delete(
    '/meters/:id',
    { schema: { tags, params: idParams, response: { 200: deletedResponse, ...standardErrors } } },
    async (request) => {
      await deleteMeter(deps, principalOf(request).merchantId, request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );
}
