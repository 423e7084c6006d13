/**
 * Subscription operations the API and the dashboard share. Starting, changing and renewing one
 * are commerce's (they take payments and write the events); these find the subscription first.
 */
import { scheduleCancellation } from '../commerce/plan-changes.ts';
import type { CommerceDeps } from '../commerce/subscriptions.ts';
import { dateOf } from '../domain/clock.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { findSubscription } from '../storage/subscriptions.ts';

/** DELETE /subscriptions/{id} and the dashboard's Cancel: the subscription ends when its paid cycle does (decision 0016). */
export async function cancelAtCycleEnd(deps: Pick<CommerceDeps, 'storage' | 'clock'>, merchantId: string, id: string): Promise<void> {
  const sub = await liveSubscription(deps, merchantId, id);
  await scheduleCancellation(deps.storage, sub, dateOf(deps.clock).toISOString());
}

/** A subscription that may still change: 404 when there is none (or it never started), 409 when cancelled. */
export async function liveSubscription(deps: Pick<CommerceDeps, 'storage'>, merchantId: string, id: string) {
  const sub = await findSubscription(deps.storage.db, merchantId, id);
  if (!sub || sub.status === 'incomplete') throw notFound('subscription', id);
  if (sub.status === 'cancelled') throw new ApiError('subscription_cancelled');
  return sub;
}
