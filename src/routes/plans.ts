import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, errorResponse, idParams, standardErrors } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { changePlan, createPlan, deletePlan, getPlan, listPlanPage, planCreateBody, planSchema, planUpdateBody, presentPlan } from '../services/plans.ts';

const tags = ['plans'];

export function registerPlanRoutes(app: App, deps: AppDeps): void {
  const { storage } = deps;
  app.get(
    '/plans',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(planSchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listPlanPage(storage, principalOf(request).merchantId, cursor, limit), limit, presentPlan);
    },
  );

  app.post(
    '/plans',
    { schema: { tags, body: planCreateBody, response: { 201: planSchema, ...standardErrors } } },
    async (request, reply) => {
      const plan = await createPlan(storage, principalOf(request).merchantId, request.body, nowIsoOf(deps));
      return reply.status(201).send(presentPlan(plan));
    },
  );

  app.get(
    '/plans/:id',
    { schema: { tags, params: idParams, response: { 200: planSchema, ...standardErrors } } },
    async (request) => presentPlan(await getPlan(storage, principalOf(request).merchantId, request.params.id)),
  );

  app.patch(
    '/plans/:id',
    { schema: { tags, params: idParams, body: planUpdateBody, response: { 200: planSchema, ...standardErrors } } },
    async (request) => presentPlan(await changePlan(storage, principalOf(request).merchantId, request.params.id, request.body, nowIsoOf(deps))),
  );

  app.delete(
    '/plans/:id',
    {
      schema: {
        tags,
        params: idParams,
        response: { 200: deletedResponse, ...standardErrors, 409: errorResponse('`plan_in_use`: live subscriptions use the plan') },
      },
    },
    async (request) => {
      const id = await deletePlan(storage, principalOf(request).merchantId, request.params.id, nowIsoOf(deps));
      return { id, deleted: true as const };
    },
  );
}
