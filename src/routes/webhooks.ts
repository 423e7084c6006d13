import { principalOf } from '../http/auth.ts';
import { pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, idParams, optionalBody, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import { z } from 'zod';
import {
  changeWebhook,
  createWebhook,
  deliveryDetailSchema,
  deliveryParams,
  deliverySchema,
  getDelivery,
  getWebhook,
  listDeliveryPage,
  listWebhookPage,
  presentDelivery,
  presentWebhook,
  redeliverDelivery,
  removeWebhook,
  rotateSecret,
  sendTestEvent,
  webhookCreateBody,
  webhookRotateBody,
  webhookSchema,
  webhookUpdateBody,
  webhookUrlCheck,
  webhookWithSecret,
} from '../services/webhook-endpoints.ts';
import { systemResolver, type Resolver } from '../webhooks/url-safety.ts';

const tags = ['webhooks'];

export function registerWebhookRoutes(app: App, deps: AppDeps, resolve: Resolver = systemResolver): void {
  const { storage } = deps;
  const endpoints = { storage, clock: deps.clock, assertUrlAllowed: webhookUrlCheck(deps.config.webhooks.allowHttpLoopback, resolve) };

  app.post(
    '/webhooks',
    { schema: { tags, body: webhookCreateBody, response: { 201: webhookWithSecret, ...standardErrors } } },
    async (request, reply) => {
      const row = await createWebhook(endpoints, principalOf(request).merchantId, request.body);
      return reply.status(201).send({ ...presentWebhook(row), webhook_secret: row.secret });
    },
  );

  app.get(
    '/webhooks',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(webhookSchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listWebhookPage(storage, principalOf(request).merchantId, cursor, limit), limit, presentWebhook);
    },
  );

  app.get(
    '/webhooks/:id',
    { schema: { tags, params: idParams, response: { 200: webhookSchema, ...standardErrors } } },
    async (request) => presentWebhook(await getWebhook(storage, principalOf(request).merchantId, request.params.id)),
  );

  app.patch(
    '/webhooks/:id',
    { schema: { tags, params: idParams, body: webhookUpdateBody, response: { 200: webhookSchema, ...standardErrors } } },
    async (request) => presentWebhook(await changeWebhook(endpoints, principalOf(request).merchantId, request.params.id, request.body)),
  );

  app.delete(
    '/webhooks/:id',
    { schema: { tags, params: idParams, response: { 200: deletedResponse, ...standardErrors } } },
    async (request) => {
      await removeWebhook(storage, principalOf(request).merchantId, request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );

  app.post(
    '/webhooks/:id/rotate_secret',
    { schema: { tags, params: idParams, body: webhookRotateBody, response: { 200: webhookWithSecret, ...standardErrors } } },
    async (request) => {
      const row = await rotateSecret(endpoints, principalOf(request).merchantId, request.params.id, request.body.overlap_seconds);
      return { ...presentWebhook(row), webhook_secret: row.secret };
    },
  );

  app.get(
    '/webhooks/:id/deliveries',
    { schema: { tags, params: idParams, querystring: pageQuery, response: { 200: pageResponse(deliverySchema), ...standardErrors } } },
    async (request) => {
      const { cursor, limit } = request.query;
      return toPage(await listDeliveryPage(storage, principalOf(request).merchantId, request.params.id, cursor, limit), limit, presentDelivery);
    },
  );

  app.post(
    '/webhooks/:id/test',
    {
      schema: {
        tags,
        summary: 'Send a test event to a webhook',
        description: 'Sends a `webhook.test` event to this webhook only, at once, whatever events it chose; the delivery is signed, retried and listed like any other. 409 `conflict` when the webhook is disabled.',
        params: idParams,
        body: optionalBody(z.object({})),
        response: { 201: deliverySchema, ...standardErrors },
      },
    },
    async (request, reply) => reply.status(201).send(presentDelivery(await sendTestEvent(endpoints, principalOf(request).merchantId, request.params.id))),
  );

  app.get(
    '/webhooks/:id/deliveries/:delivery_id',
    { schema: { tags, params: deliveryParams, response: { 200: deliveryDetailSchema, ...standardErrors } } },
    async (request) => getDelivery(storage, principalOf(request).merchantId, request.params.id, request.params.delivery_id),
  );

  app.post(
    '/webhooks/:id/deliveries/:delivery_id/redeliver',
    { schema: { tags, params: deliveryParams, body: optionalBody(z.object({})), response: { 200: deliverySchema, ...standardErrors } } },
    async (request) => presentDelivery(await redeliverDelivery(endpoints, principalOf(request).merchantId, request.params.id, request.params.delivery_id)),
  );
}
