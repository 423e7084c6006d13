import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database, EventsTable } from '../storage/schema.ts';

export type EventType =
  | 'customer.created'
  | 'customer.deleted'
  | 'customer.wallet.balance.updated'
  | 'merchant.wallet.balance.updated'
  | 'spend_key.limit_reached';

export type NewEvent = { merchantId: string; type: EventType; data: Record<string, unknown>; at: string };

/**
 * Writes an event row in the caller's transaction, so an event exists exactly when the change
 * that caused it committed. Delivery to webhooks reads these rows later.
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

/** The rows of new events, with fresh ids. */
export function eventRows(inputs: NewEvent[]): EventsTable[] {
  return inputs.map((input) => ({
    id: newId('event'),
    merchant_id: input.merchantId,
    type: input.type,
    payload: JSON.stringify(input.data),
    created_at: input.at,
  }));
}
