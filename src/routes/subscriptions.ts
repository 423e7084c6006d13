import { z } from 'zod';
import { presentSubscription } from '../commerce/subscription-view.ts';
import { updateSubscriptionTerms, type SubscriptionUpdate } from '../commerce/plan-changes.ts';
import type { CommerceDeps } from '../commerce/subscriptions.ts';
import { dateOf } from '../domain/clock.ts';
import { principalOf } from '../http/auth.ts';
import { notFound, validationError } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse, toPage } from '../http/pagination.ts';
import { customerParams, customerRef, errorResponse, idParams, optionalBody, standardErrors, successResponse } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import { findConnection, resolveCustomerId } from '../storage/connections.ts';
import { findCreditBundle, findPlan } from '../storage/plans.ts';
import {
  findCustomerSubscriptionView,
  findSubscriptionView,
  listSubscriptionViews,
} from '../storage/subscriptions.ts';
import { planTermsSchema } from '../services/plans.ts';
import { cancelAtCycleEnd, liveSubscription, subscribeCustomer, subscriptionCreateBody } from '../services/subscriptions.ts';
import { merchantHasRow } from '../storage/pages.ts';

const subscriptionBaseSchema = z.object({
  subscription_id: z.string(),
  plan_id: z.string(),
  status: z
    .enum(['active', 'past_due', 'cancelled'])
    .describe(
      "`past_due` is Tollgate's extension (the published client's type knows `active` and `cancelled`): a renewal payment failed and is being retried; the subscription still works and is listed with status=active",
    ),
  auto_top_up_bundle_id: z.string().nullable(),
  started_at: z.string(),
  cancelled_at: z.string().nullable(),
  cycle_start_at: z.string().nullable(),
  cycle_end_at: z.string().nullable(),
  plan: planTermsSchema,
  credits: z.object({ total_remaining: z.string(), cycle_remaining: z.string(), bundle_remaining: z.string() }),
  pending_change: z
    .object({
      type: z
        .enum(['cancellation', 'downgrade', 'upgrade'])
        .describe(
          "`upgrade` is Tollgate's extension (the published client's type knows `cancellation` and `downgrade`): a scheduled change to a plan with a higher period amount, taking effect at effective_at like a downgrade",
        ),
      effective_at: z.string().nullable(),
      plan_id: z.string().optional(),
      name: z.string().optional(),
      period_amount: z.string().optional(),
      included_credit: z.string().optional(),
    })
    .nullable(),
});

const subscriptionSchema = subscriptionBaseSchema.extend({
  customer_id: z.string(),
  connection_id: z.string().describe('Older name of customer_id'),
  customer: z.object({ phone: z.string().nullable(), email: z.string().nullable(), first_name: z.string().nullable(), last_name: z.string().nullable() }),
});

const listQuery = pageQuery.extend({
  status: z.enum(['active', 'cancelled', 'all']).default('active'),
  customer_id: customerRef.optional().describe('The customer id, or its reference_id'),
  connection_id: customerRef.optional().describe('Older name of customer_id'),
});
const updateBody = optionalBody(
  z.object({
    auto_top_up_bundle_id: z.string().min(1).max(100).nullable().optional(),
    plan_id: z
      .string()
      .min(1)
      .max(100)
      .optional()
      .describe('Schedules this plan for the next cycle (replacing a scheduled cancellation); the current plan withdraws a scheduled change or cancellation. An upgrade that starts now is a subscription checkout'),
  }),
);

const tags = ['subscriptions'];

export function registerSubscriptionRoutes(app: App, deps: CommerceDeps): void {
  const { storage } = deps;

  app.get(
    '/subscriptions',
    { schema: { tags, querystring: listQuery, response: { 200: pageResponse(subscriptionSchema), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const { cursor, limit, status } = request.query;
      const named = request.query.customer_id ?? request.query.connection_id;
      const customerId = named === undefined ? undefined : await resolveCustomerId(storage.db, merchantId, named);
      await assertCursor(cursor, (id) => merchantHasRow(storage, 'subscriptions', merchantId, id));
      const rows = await listSubscriptionViews(storage, merchantId, { status, cursor, limit, ...(customerId ? { customerId } : {}) });
      return toPage(rows, limit, presentSubscription);
    },
  );

  app.post(
    '/subscriptions',
    {
      schema: {
        tags,
        body: subscriptionCreateBody,
        response: {
          201: z.object({ subscription: subscriptionSchema }),
          200: z.object({ subscription: subscriptionSchema }).describe('The customer had a subscription: its plan changed (an upgrade, paid with the saved payment method) or will at the cycle end (a downgrade, in pending_change)'),
          ...standardErrors,
          402: errorResponse('`payment_method_required` (a paid plan or an upgrade, no saved payment method: use a subscription checkout) or `payment_failed`'),
          409: errorResponse('`subscription_exists`: the customer is already subscribed to this plan, or its first period is still being charged'),
        },
      },
    },
    async (request, reply) => {
      const { subscription, created } = await subscribeCustomer(deps, principalOf(request).merchantId, request.body);
      return reply.status(created ? 201 : 200).send({ subscription });
    },
  );

  app.get(
    '/subscriptions/:id',
    { schema: { tags, params: idParams, response: { 200: subscriptionSchema, ...standardErrors } } },
    async (request) => {
      const view = await findSubscriptionView(storage.db, principalOf(request).merchantId, request.params.id);
      if (!view) throw notFound('subscription', request.params.id);
      return presentSubscription(view);
    },
  );

  app.patch(
    '/subscriptions/:id',
    { schema: { tags, params: idParams, body: updateBody, response: { 200: successResponse, ...standardErrors, 409: errorResponse('`subscription_cancelled`') } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const sub = await liveSubscription(deps, merchantId, request.params.id);
      const { auto_top_up_bundle_id: bundleId, plan_id: planId } = request.body;
      const update: SubscriptionUpdate = {};
      if (planId !== undefined) {
        const plan = await findPlan(storage, merchantId, planId);
        if (!plan) throw validationError([{ path: ['plan_id'], message: `no plan with id ${planId}` }]);
        update.plan = plan;
      }
      if (bundleId !== undefined) {
        const bundle = bundleId === null ? null : await findCreditBundle(storage, merchantId, bundleId);
        if (bundle === undefined || (bundle && bundle.plan_id !== (planId ?? sub.plan_id))) {
          throw validationError([{ path: ['auto_top_up_bundle_id'], message: "must name a credit bundle of the subscription's plan" }]);
        }
        update.autoTopUpBundleId = bundleId;
      }
      await updateSubscriptionTerms(storage, sub, update, dateOf(deps.clock).toISOString());
      return { success: true as const };
    },
  );

  app.delete(
    '/subscriptions/:id',
    { schema: { tags, params: idParams, response: { 200: successResponse, ...standardErrors, 409: errorResponse('`subscription_cancelled`') } } },
    async (request) => {
      await cancelAtCycleEnd(deps, principalOf(request).merchantId, request.params.id);
      return { success: true as const };
    },
  );

  app.get(
    '/customers/:id/subscription',
    { schema: { tags: ['customers'], params: customerParams, response: { 200: z.object({ subscription: subscriptionBaseSchema.nullable() }), ...standardErrors } } },
    async (request) => {
      const { merchantId } = principalOf(request);
      const customer = await findConnection(storage, merchantId, request.params.id);
      if (!customer) throw notFound('customer', request.params.id);
      const view = await findCustomerSubscriptionView(storage, merchantId, customer.id);
      if (!view || view.status === 'cancelled') return { subscription: null };
      const { customer_id: _c, connection_id: _k, customer: _p, ...base } = presentSubscription(view);
      return { subscription: base };
    },
  );
}
