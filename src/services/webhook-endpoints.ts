/**
 * Webhook endpoints: where a merchant's events go. The API and the dashboard create and show them
 * through these operations. Sending is the dispatcher's (src/webhooks/).
 */
import { z } from 'zod';
import type { Clock } from '../domain/clock.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { optionalBody } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import {
  deleteWebhook,
  deliveryIdExists,
  findDeliveryWithEvent,
  findWebhook,
  insertSingleDelivery,
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
import { merchantHasRow } from '../storage/pages.ts';
import { payloadText, SUBSCRIBABLE_EVENTS, TEST_EVENT } from '../webhooks/events.ts';
import { systemResolver, urlProblemAfterLookup, type Resolver } from '../webhooks/url-safety.ts';

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

export const webhookCreateBody = z.object({ name, url, events: eventList.optional() });
export const webhookUpdateBody = optionalBody(
  z.object({
    name: name.optional(),
    url: url.optional(),
    events: eventList.optional(),
    enabled: z.boolean().optional().describe('true re-enables a webhook the dispatcher disabled after 5 days of failures; false pauses it'),
  }),
);
export const webhookRotateBody = optionalBody(
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

export const webhookSchema = z.object({
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
export const webhookWithSecret = webhookSchema.extend({ webhook_secret: z.string().describe('Shown only here; signs every delivery') });

export const deliverySchema = z.object({
  delivery_id: z.string(),
  webhook_id: z.string(),
  event_id: z.string(),
  event: z.string(),
  state: z.enum(['pending', 'succeeded', 'failed']),
  attempts: z.number().int(),
  last_status_code: z.number().int().nullable().describe('HTTP status of the last answer; null when none came'),
  last_error: z.string().nullable(),
  last_response_body: z.string().nullable().describe("The start of the last answer's body (at most 1 KiB); null when none came"),
  last_duration_ms: z.number().int().nullable().describe('How long the last attempt took, in milliseconds'),
  last_attempt_at: z.string().nullable(),
  next_attempt_at: z.string().nullable(),
  created_at: z.string(),
});
export const deliveryDetailSchema = deliverySchema.extend({
  request_body: z.string().describe('The exact body every attempt of this delivery sends; the signatures are computed over these bytes'),
});
export const deliveryParams = z.object({ id: z.string().min(1).max(100), delivery_id: z.string().min(1).max(100) });

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
    last_response_body: row.last_response_body ?? null,
    last_duration_ms: row.last_duration_ms === null || row.last_duration_ms === undefined ? null : Number(row.last_duration_ms),
    last_attempt_at: row.last_attempt_at,
    next_attempt_at: row.state === 'pending' ? row.next_attempt_at : null,
    created_at: row.created_at,
  };
}

/** `["*"]` and an absent list both mean every event (stored as null). */
export const chosenEvents = (events: string[] | undefined) => (events === undefined || events[0] === ALL_EVENTS ? null : events);

/** Refuses a receiver URL that is not https (or allowed loopback) or resolves to a private address. */
export function webhookUrlCheck(allowHttpLoopback: boolean, resolve: Resolver = systemResolver): (raw: string) => Promise<void> {
  const policy = { allowHttpLoopback };
  return async (raw) => {
    const problem = await urlProblemAfterLookup(raw, policy, resolve);
    if (problem) throw new ApiError('webhook_url_refused', `The webhook url ${problem}.`, { issues: [{ path: ['url'], message: problem }] });
  };
}

/** What the webhook operations need: storage, the clock, and the URL check the app configured. */
export type WebhookEndpointDeps = { storage: Storage; clock: Clock; assertUrlAllowed: (raw: string) => Promise<void> };

const nowIso = (deps: { clock: Clock }) => new Date(deps.clock.now()).toISOString();

/** The webhook, or a 404. */
export async function getWebhook(storage: Storage, merchantId: string, id: string): Promise<WebhookRow> {
  const row = await findWebhook(storage, merchantId, id);
  if (!row) throw notFound('webhook', id);
  return row;
}

export async function createWebhook(deps: WebhookEndpointDeps, merchantId: string, body: z.infer<typeof webhookCreateBody>): Promise<WebhookRow & { secret: string }> {
  await deps.assertUrlAllowed(body.url);
  const input = { name: body.name, url: body.url, events: chosenEvents(body.events) };
  const row = await insertWebhook(deps.storage, merchantId, input, nowIso(deps));
  if (row === 'limit_reached') {
    throw new ApiError('webhook_limit_reached', `A merchant may have at most ${MAX_WEBHOOKS_PER_MERCHANT} webhooks; delete one first.`);
  }
  return row;
}

export async function listWebhookPage(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<WebhookRow[]> {
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'webhooks', merchantId, id));
  return listWebhooks(storage, merchantId, cursor, limit);
}

export async function changeWebhook(deps: WebhookEndpointDeps, merchantId: string, id: string, body: z.infer<typeof webhookUpdateBody>): Promise<WebhookRow> {
  await getWebhook(deps.storage, merchantId, id);
  if (body.url !== undefined) await deps.assertUrlAllowed(body.url);
  const { events, ...rest } = body;
  const changes = { ...rest, ...(events !== undefined ? { events: chosenEvents(events) } : {}) };
  const row = await updateWebhook(deps.storage, merchantId, id, changes, nowIso(deps));
  if (!row) throw notFound('webhook', id);
  return row;
}

export async function removeWebhook(storage: Storage, merchantId: string, id: string): Promise<void> {
  if (!(await deleteWebhook(storage, merchantId, id))) throw notFound('webhook', id);
}

/** A new signing secret; the replaced one keeps signing beside it for overlapSeconds. */
export async function rotateSecret(deps: Pick<WebhookEndpointDeps, 'storage' | 'clock'>, merchantId: string, id: string, overlapSeconds: number): Promise<WebhookRow & { secret: string }> {
  const overlapUntil = new Date(deps.clock.now() + overlapSeconds * 1000).toISOString();
  const row = await rotateWebhookSecret(deps.storage, merchantId, id, overlapUntil);
  if (!row) throw notFound('webhook', id);
  return row;
}

export async function listDeliveryPage(storage: Storage, merchantId: string, webhookId: string, cursor: string | undefined, limit: number): Promise<DeliveryRow[]> {
  const webhook = await getWebhook(storage, merchantId, webhookId);
  await assertCursor(cursor, (id) => deliveryIdExists(storage, webhook.id, id));
  return listDeliveries(storage, webhook.id, cursor, limit);
}

/** Sends a delivery again, as a new attempt due now. */
export async function redeliverDelivery(deps: Pick<WebhookEndpointDeps, 'storage' | 'clock'>, merchantId: string, webhookId: string, deliveryId: string): Promise<DeliveryRow> {
  const webhook = await getWebhook(deps.storage, merchantId, webhookId);
  const row = await redeliver(deps.storage, webhook.id, deliveryId, nowIso(deps));
  if (!row) throw notFound('delivery', deliveryId);
  return row;
}

/** One delivery with the body it sends, or a 404. */
export async function getDelivery(storage: Storage, merchantId: string, webhookId: string, deliveryId: string): Promise<z.infer<typeof deliveryDetailSchema>> {
  const webhook = await getWebhook(storage, merchantId, webhookId);
  const row = await findDeliveryWithEvent(storage, webhook.id, deliveryId);
  if (!row) throw notFound('delivery', deliveryId);
  const requestBody = payloadText({ id: row.event_id, created_at: row.event_created_at, payload: row.event_payload }, row.event_type);
  return { ...presentDelivery(row), request_body: requestBody };
}

/**
 * Sends a `webhook.test` event to this webhook only, now, whatever events it chose: a delivery
 * like any other (signed, retried, listed). A disabled webhook sends nothing, so it is refused.
 */
export async function sendTestEvent(deps: Pick<WebhookEndpointDeps, 'storage' | 'clock'>, merchantId: string, webhookId: string): Promise<DeliveryRow> {
  const webhook = await getWebhook(deps.storage, merchantId, webhookId);
  if (webhook.disabled_at !== null) throw new ApiError('conflict', 'The webhook is disabled; enable it to send a test event.');
  const data = { webhook_id: webhook.id, message: 'A test event sent from Tollgate to check this endpoint; no action is needed.' };
  return insertSingleDelivery(deps.storage, webhook, { type: TEST_EVENT, data }, nowIso(deps));
}
