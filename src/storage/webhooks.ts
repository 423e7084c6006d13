import { randomBytes } from 'node:crypto';
import { newId, SECRET_PREFIX } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import type { WebhookDeliveriesTable, WebhooksTable } from './schema.ts';
import { insertWithinMerchantLimit, newestFirstPage } from './pages.ts';
import { deliveryRow } from './webhook-deliveries.ts';

export type WebhookRow = WebhooksTable;
export type DeliveryRow = WebhookDeliveriesTable;

/** At most this many webhooks per merchant (the interface's limit). */
export const MAX_WEBHOOKS_PER_MERCHANT = 3;

export type NewWebhook = { name: string; url: string; events: string[] | null };
export type WebhookChanges = Partial<NewWebhook> & { enabled?: boolean };

/** A new webhook with a fresh secret, unless the merchant already has the maximum. */
export async function insertWebhook(storage: Storage, merchantId: string, input: NewWebhook, at: string): Promise<WebhookRow | 'limit_reached'> {
  return insertWithinMerchantLimit(storage, 'webhooks', MAX_WEBHOOKS_PER_MERCHANT, {
    id: newId('webhook'),
    merchant_id: merchantId,
    name: input.name,
    url: input.url,
    events: input.events === null ? null : JSON.stringify(input.events),
    secret: newWebhookSecret(),
    previous_secret: null,
    previous_secret_expires_at: null,
    failing_since: null,
    disabled_at: null,
    created_at: at,
  });
}

/**
 * `whsec_` and 32 random bytes in base64: the Standard Webhooks form, whose libraries take the
 * bytes after the prefix as the HMAC key; the hex signature keys with the whole string instead.
 */
function newWebhookSecret(): string {
  return SECRET_PREFIX.webhook + randomBytes(32).toString('base64');
}

export async function findWebhook(storage: Storage, merchantId: string, id: string): Promise<WebhookRow | undefined> {
  return storage.db.selectFrom('webhooks').selectAll().where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
}

export async function listWebhooks(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<WebhookRow[]> {
  return storage.db
    .selectFrom('webhooks')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

/**
 * Changes a webhook; `enabled: true` re-enables one (the dispatcher disables an endpoint that kept
 * failing) and forgets its failures, `enabled: false` stops its deliveries until then.
 */
export async function updateWebhook(
  storage: Storage,
  merchantId: string,
  id: string,
  changes: WebhookChanges,
  at: string,
): Promise<WebhookRow | undefined> {
  const set: Partial<WebhookRow> = {};
  if (changes.name !== undefined) set.name = changes.name;
  if (changes.url !== undefined) set.url = changes.url;
  if (changes.events !== undefined) set.events = changes.events === null ? null : JSON.stringify(changes.events);
  if (changes.enabled === true) Object.assign(set, { disabled_at: null, failing_since: null });
  if (changes.enabled === false) set.disabled_at = at;
  if (Object.keys(set).length > 0) {
    await storage.db.updateTable('webhooks').set(set).where('merchant_id', '=', merchantId).where('id', '=', id).execute();
  }
  return findWebhook(storage, merchantId, id);
}

/** Deletes a webhook and its deliveries for good. */
export async function deleteWebhook(storage: Storage, merchantId: string, id: string): Promise<boolean> {
  return storage.db.transaction().execute(async (trx) => {
    const result = await trx.deleteFrom('webhooks').where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
    if (Number(result.numDeletedRows) !== 1) return false;
    await trx.deleteFrom('webhook_deliveries').where('webhook_id', '=', id).execute();
    return true;
  });
}

/**
 * A new secret for a webhook; the one it replaces keeps signing (beside the new one) until
 * `overlapUntil`, so receivers can switch without refusing deliveries meanwhile.
 */
export async function rotateWebhookSecret(
  storage: Storage,
  merchantId: string,
  id: string,
  overlapUntil: string,
): Promise<WebhookRow | undefined> {
  return storage.db.transaction().execute(async (trx) => {
    const current = await trx.selectFrom('webhooks').select('secret').where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
    if (!current) return undefined;
    await trx
      .updateTable('webhooks')
      .set({ secret: newWebhookSecret(), previous_secret: current.secret, previous_secret_expires_at: overlapUntil })
      .where('id', '=', id)
      .execute();
    return trx.selectFrom('webhooks').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  });
}

export async function listDeliveries(storage: Storage, webhookId: string, cursor: string | undefined, limit: number): Promise<DeliveryRow[]> {
  return storage.db
    .selectFrom('webhook_deliveries')
    .selectAll()
    .where('webhook_id', '=', webhookId)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
}

export async function deliveryIdExists(storage: Storage, webhookId: string, id: string): Promise<boolean> {
  const row = await storage.db.selectFrom('webhook_deliveries').select('id').where('webhook_id', '=', webhookId).where('id', '=', id).executeTakeFirst();
  return row !== undefined;
}

/**
 * Schedules a delivery to be sent again now, whatever its state, with a fresh retry schedule
 * (attempts start again from zero).
 */
export async function redeliver(storage: Storage, webhookId: string, id: string, at: string): Promise<DeliveryRow | undefined> {
  await storage.db
    .updateTable('webhook_deliveries')
    .set({ state: 'pending', attempts: 0, next_attempt_at: at })
    .where('webhook_id', '=', webhookId)
    .where('id', '=', id)
    .execute();
  return storage.db.selectFrom('webhook_deliveries').selectAll().where('webhook_id', '=', webhookId).where('id', '=', id).executeTakeFirst();
}


/**
 * An event for one webhook only: written already fanned out (so no other webhook gets it) with
 * its one delivery, due now, in one transaction. The dispatcher sends it like any delivery.
 */
export async function insertSingleDelivery(
  storage: Storage,
  webhook: Pick<WebhookRow, 'id' | 'merchant_id'>,
  event: { type: string; data: Record<string, unknown> },
  at: string,
): Promise<DeliveryRow> {
  const eventId = newId('event');
  const row = deliveryRow(webhook.id, eventId, event.type, at);
  await storage.db.transaction().execute(async (trx) => {
    await trx.insertInto('events').values({ id: eventId, merchant_id: webhook.merchant_id, type: event.type, payload: JSON.stringify(event.data), created_at: at, dispatched_at: at }).execute();
    await trx.insertInto('webhook_deliveries').values(row).execute();
  });
  return row;
}

/** One delivery of a webhook with the event it carries (its data as stored), or undefined. */
export async function findDeliveryWithEvent(storage: Storage, webhookId: string, id: string): Promise<(DeliveryRow & { event_created_at: string; event_payload: string }) | undefined> {
  return storage.db
    .selectFrom('webhook_deliveries as d')
    .innerJoin('events as e', 'e.id', 'd.event_id')
    .selectAll('d')
    .select(['e.created_at as event_created_at', 'e.payload as event_payload'])
    .where('d.webhook_id', '=', webhookId)
    .where('d.id', '=', id)
    .executeTakeFirst();
}
