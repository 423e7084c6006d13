/**
 * Subscription operations the API and the dashboard share. Starting, changing and renewing one
 * are commerce's (they take payments and write the events); these find the customer, the plan
 * and the subscription first.
 */
import { z } from 'zod';
import { changePlanByApi, scheduleCancellation } from '../commerce/plan-changes.ts';
import { presentSubscription, type PresentedSubscription } from '../commerce/subscription-view.ts';
import { startSubscription, type CommerceDeps } from '../commerce/subscriptions.ts';
import { dateOf } from '../domain/clock.ts';
import { ApiError, notFound, validationError } from '../http/errors.ts';
import { customerRef } from '../http/schemas.ts';
import { findConnection } from '../storage/connections.ts';
import { findPlan } from '../storage/plans.ts';
import { findSubscription, findSubscriptionView } from '../storage/subscriptions.ts';

export const subscriptionCreateBody = z.object({ customer_id: customerRef.describe('The customer id, or its reference_id'), plan_id: z.string().min(1).max(100) });

/**
 * POST /subscriptions and the dashboard's subscription form. A customer without a running
 * subscription starts one (`created`); a running one changes plan instead (decision 0037): an
 * upgrade now, paid with the saved payment method, a downgrade at the cycle end.
 */
export async function subscribeCustomer(
  deps: CommerceDeps,
  merchantId: string,
  body: z.infer<typeof subscriptionCreateBody>,
): Promise<{ subscription: PresentedSubscription; created: boolean }> {
  const customer = await findConnection(deps.storage, merchantId, body.customer_id);
  if (!customer) throw validationError([{ path: ['customer_id'], message: `no customer with id ${body.customer_id}` }]);
  const plan = await findPlan(deps.storage, merchantId, body.plan_id);
  if (!plan) throw validationError([{ path: ['plan_id'], message: `no plan with id ${body.plan_id}` }]);
  const live = await runningSubscriptionOf(deps, customer.id);
  const started = live
    ? await changePlanByApi(deps, live, customer, plan, dateOf(deps.clock))
    : await startSubscription(deps, merchantId, customer, plan, dateOf(deps.clock));
  if (!started.ok) throw new ApiError(started.reason, started.message);
  const view = await findSubscriptionView(deps.storage.db, merchantId, started.subscription.id);
  return { subscription: presentSubscription(view!), created: !live };
}

/** The customer's subscription that is running (active or past due), if any. */
async function runningSubscriptionOf(deps: Pick<CommerceDeps, 'storage'>, connectionId: string) {
  return deps.storage.db.selectFrom('subscriptions').selectAll().where('connection_id', '=', connectionId).where('status', 'in', ['active', 'past_due']).executeTakeFirst();
}

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
