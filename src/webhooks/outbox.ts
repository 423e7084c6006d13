import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Database } from '../storage/schema.ts';

export type EventType =
  | 'customer.created'
  | 'customer.deleted'
  | 'customer.wallet.balance.updated'
  | 'merchant.wallet.balance.updated'
  | 'spend_key.limit_reached';

/**
 * Writes an event row in the caller's transaction, so an event exists exactly when the change
 * that caused it committed. Delivery to webhooks reads these rows later.
 */
export async function enqueueEvent(
  trx: Transaction<Database>,
  input: { merchantId: string; type: EventType; data: Record<string, unknown>; at: string },
): Promise<string> {
  const id = newId('event');
  await trx
    .insertInto('events')
    .values({ id, merchant_id: input.merchantId, type: input.type, payload: JSON.stringify(input.data), created_at: input.at })
    .execute();
  return id;
}
