import { z } from 'zod';
import { principalOf } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { deletedResponse, idParams, optionalBody, standardErrors } from '../http/schemas.ts';
import { nowIsoOf, type App } from '../http/types.ts';
import type { AppDeps } from '../app-deps.ts';
import {
  deleteWebhook,
  deliveryIdExists,
  findWebhook,
  insertWebhook,
  listDeliveries,
  listWebhooks,
  MAX_WEBHOOKS_PER_MERCHANT,
  redeliver,
  rotateWebhookSecret,
  updateWebhook,
  type DeliveryRow,
  type WebhookRow,
} from '../storage/webhooks.ts';
import { SUBSCRIBABLE_EVENTS } from '../webhooks/events.ts';
import { systemResolver, urlProblemAfterLookup, type Resolver } from '../webhooks/url-safety.ts';
import { merchantHasRow } from '../storage/pages.ts';

const ALL_EVENTS = '*';
const DEFAULT_OVERLAP_SECONDS = 24 * 3600;
const MAX_OVERLAP_SECONDS = 7 * 24 * 3600;

const eventList = z
  .array(z.enum([ALL_EVENTS, ...SUBSCRIBABLE_EVENTS]))
  .min(1)
  .max(SUBSCRIBABLE_EVENTS.length + 1)
  .refine((list) => new Set(list).size === list.length, 'must not repeat an event')
  .refine((list) => !list.includes(ALL_EVENTS) || list.length === 1, '"*" (every event) stands alone')
  .describe('Event names to receive; ["*"] (the default) is every event, including ones added later. ' +
    'connection.created, connection.deleted and connection.wallet.balance.updated select the customer events under their older names.');

const name = z.string().trim().min(1).max(255);
const url = z.string().trim().min(1).max(2048).describe('https:// URL that receives the events');

const createBody = z.object({ name, url, events: eventList.optional() });
const updateBody = optionalBody(
  z.object({
    name: name.optional(),
    url: url.optional(),
    events: eventList.optional(),
    enabled: z.boolean().optional().describe('true re-enables a webhook the dispatcher disabled after 5 days of failures; false pauses it'),
  }),
);
const rotateBody = optionalBody(
  z.object({
    overlap_seconds: z
      .number()
      .int()
      .min(0)
      .max(MAX_OVERLAP_SECONDS)
      .default(DEFAULT_OVERLAP_SECONDS)
      .describe('How long the replaced secret keeps signing beside the new one (default one day)'),
  }),
);

const webhookSchema = z.object({
  webhook_id: z.string(),
  name: z.string(),
  url: z.string(),
  events: z.array(z.string()),
  status: z.enum(['enabled', 'disabled']),
  disabled_at: z.string().nullable().describe('When deliveries stopped: by PATCH, or after 5 days of failing'),
  failing_since: z.string().nullable().describe('Start of the current run of failed deliveries, if any'),
  previous_secret_expires_at: z.string().nullable().describe('Until then the secret replaced by the last rotation signs too'),
  created_at: z.string(),
});
const webhookWithSecret = webhookSchema.extend({ webhook_secret: z.string().describe('Shown only here; signs every delivery') });

const deliverySchema = z.object({
  delivery_id: z.string(),
  webhook_id: z.string(),
  event_id: z.string(),
  event: z.string(),
  state: z.enum(['pending', 'succeeded', 'failed']),
  attempts: z.number().int(),
  last_status_code: z.number().int().nullable().describe('HTTP status of the last answer; null when none came'),
  last_error: z.string().nullable(),
  last_attempt_at: z.string().nullable(),
  next_attempt_at: z.string().nullable(),
  created_at: z.string(),
});
const deliveryParams = z.object({ id: z.string().min(1).max(100), delivery_id: z.string().min(1).max(100) });

export function presentWebhook(row: WebhookRow): z.infer<typeof webhookSchema> {
  return {
    webhook_id: row.id,
    name: row.name,
    url: row.url,
    events: row.events === null ? [ALL_EVENTS] : (JSON.parse(row.events) as string[]),
    status: row.disabled_at === null ? 'enabled' : 'disabled',
    disabled_at: row.disabled_at,
    failing_since: row.failing_since,
    previous_secret_expires_at: row.previous_secret_expires_at,
    created_at: row.created_at,
  };
}

export function presentDelivery(row: DeliveryRow): z.infer<typeof deliverySchema> {
  return {
    delivery_id: row.id,
    webhook_id: row.webhook_id,
    event_id: row.event_id,
    event: row.event_type,
    state: row.state,
    attempts: Number(row.attempts),
    last_status_code: row.last_status_code === null ? null : Number(row.last_status_code),
    last_error: row.last_error,
    last_attempt_at: row.last_attempt_at,
    next_attempt_at: row.state === 'pending' ? row.next_attempt_at : null,
    created_at: row.created_at,
  };
}

/** `["*"]` and an absent list both mean every event (stored as null). */
const chosenEvents = (events: string[] | undefined) => (events === undefined || events[0] === ALL_EVENTS ? null : events);

const tags = ['webhooks'];

export function registerWebhookRoutes(app: App, deps: AppDeps, resolve: Resolver = systemResolver): void {
  const { storage } = deps;
  const policy = { allowHttpLoopback: deps.config.webhooks.allowHttpLoopback };

  const assertUrlAllowed = async (raw: string) => {
    const problem = await urlProblemAfterLookup(raw, policy, resolve);
    if (problem) throw new ApiError('webhook_url_refused', `The webhook url ${problem}.`, { issues: [{ path: ['url'], message: problem }] });
  };
  const webhookOf = async (merchantId: string, id: string) => {
    const row = await findWebhook(storage, merchantId, id);
    if (!row) throw notFound('webhook', id);
    return row;
  };

  app.post(
    '/webhooks',
    { schema: { tags, body: createBody, response: { 201: webhookWithSecret, ...standardErrors } } },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      await assertUrlAllowed(request.body.url);
      const input = { name: request.body.name, url: request.body.url, events: chosenEvents(request.body.events) };
      const row = await insertWebhook(storage, merchantId, input, nowIsoOf(deps));
      if (row === 'limit_reached') {
        throw new ApiError('webhook_limit_reached', `A merchant may have at most ${MAX_WEBHOOKS_PER_MERCHANT} webhooks; delete one first.`);
      }
      return reply.status(201).send({ ...presentWebhook(row), webhook_secret: row.secret });
    },
  );

  app.get(
    '/webhooks',
    { schema: { tags, querystring: pageQuery, response: { 200: pageResponse(webhookSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'webhooks', merchantId, id));
      return toPage(await listWebhooks(storage, merchantId, cursor, limit), limit, presentWebhook);
    },
  );

  app.get(
    '/webhooks/:id',
    { schema: { tags, params: idParams, response: { 200: webhookSchema, ...standardErrors } } },
    async (request) => presentWebhook(await webhookOf(principalOf(request).merchantId, request.params.id)),
  );

  app.patch(
    '/webhooks/:id',
    { schema: { tags, params: idParams, body: updateBody, response: { 200: webhookSchema, ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      await webhookOf(merchantId, request.params.id);
      if (request.body.url !== undefined) await assertUrlAllowed(request.body.url);
      const { events, ...rest } = request.body;
      const changes = { ...rest, ...(events !== undefined ? { events: chosenEvents(events) } : {}) };
      const row = await updateWebhook(storage, merchantId, request.params.id, changes, nowIsoOf(deps));
      if (!row) throw notFound('webhook', request.params.id);
      return presentWebhook(row);
    },
  );

  app.delete(
    '/webhooks/:id',
    { schema: { tags, params: idParams, response: { 200: deletedResponse, ...standardErrors } } },
    async (request) => {
      const deleted = await deleteWebhook(storage, principalOf(request).merchantId, request.params.id);
      if (!deleted) throw notFound('webhook', request.params.id);
      return { id: request.params.id, deleted: true as const };
    },
  );

  app.post(
    '/webhooks/:id/rotate_secret',
    { schema: { tags, params: idParams, body: rotateBody, response: { 200: webhookWithSecret, ...standardErrors } } },
    async (request) => {
      const overlapUntil = new Date(deps.clock.now() + request.body.overlap_seconds * 1000).toISOString();
      const row = await rotateWebhookSecret(storage, principalOf(request).merchantId, request.params.id, overlapUntil);
      if (!row) throw notFound('webhook', request.params.id);
      return { ...presentWebhook(row), webhook_secret: row.secret };
    },
  );

  app.get(
    '/webhooks/:id/deliveries',
    { schema: { tags, params: idParams, querystring: pageQuery, response: { 200: pageResponse(deliverySchema), ...standardErrors } } },
    async (request) => {
      const webhook = await webhookOf(principalOf(request).merchantId, request.params.id);
      const { cursor, limit } = request.query;
      await assertCursor(cursor, (id) => deliveryIdExists(storage, webhook.id, id));
      return toPage(await listDeliveries(storage, webhook.id, cursor, limit), limit, presentDelivery);
    },
  );

  app.post(
    '/webhooks/:id/deliveries/:delivery_id/redeliver',
    { schema: { tags, params: deliveryParams, body: optionalBody(z.object({})), response: { 200: deliverySchema, ...standardErrors } } },
    async (request) => {
      const webhook = await webhookOf(principalOf(request).merchantId, request.params.id);
      const row = await redeliver(storage, webhook.id, request.params.delivery_id, nowIsoOf(deps));
      if (!row) throw notFound('delivery', request.params.delivery_id);
      return presentDelivery(row);
    },
  );
}

/** The dashboard's webhook form is read by the same schema. */
export { createBody as webhookCreateBody, chosenEvents };
