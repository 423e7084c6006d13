import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database, EventsTable } from '../storage/schema.ts';
import type { EventType } from './events.ts';

export type { EventType } from './events.ts';

/**
 * An event to write. `data` is what receivers get as the payload's `data`: give the object as the
 * API returns it (e.g. a subscription as GET /v1/subscriptions/{id} shows it), never a secret of
 * Tollgate's own; `at` is the time of the change (the payload's `created_at`).
 */
export type NewEvent = { merchantId: string; type: EventType; data: Record<string, unknown>; at: string };

/**
 * Writes an event row in the caller's transaction, so an event exists exactly when the change
 * that caused it committed. The webhook dispatcher (dispatcher.ts) fans it out to the merchant's
 * webhooks later; nothing else needs to be called.
 */
export async function enqueueEvent(trx: Transaction<Database>, input: NewEvent): Promise<string> {
  const [id] = await enqueueEvents(trx, [input]);
  return id!;
}

/** Several event rows in one statement, in the order given (ids sort the same way). */
export async function enqueueEvents(trx: Transaction<Database>, inputs: NewEvent[]): Promise<string[]> {
  if (inputs.length === 0) return [];
  const rows = eventRows(inputs);
  await trx.insertInto('events').values(rows).execute();
  return rows.map((r) => r.id);
}

/** The rows of new events, with fresh ids (for callers that write them with their own batch statement). */
export function eventRows(inputs: NewEvent[]): EventsTable[] {
  return inputs.map((input) => ({
    id: newId('event'),
    merchant_id: input.merchantId,
    type: input.type,
    payload: JSON.stringify(input.data),
    created_at: input.at,
  }));
}
