/**
 * Checkout sessions: a link that sends a customer to the hosted checkout (sign up, top up,
 * subscribe, buy a credit bundle). The API's POST /v1/checkout_sessions and the dashboard's
 * checkout-link form both create one here; the hosted page itself is commerce's.
 */
import { z } from 'zod';
import { CHECKOUT_SESSION_TTL_MS, presentCheckoutSession } from '../commerce/checkout.ts';
import type { CommerceDeps } from '../commerce/subscriptions.ts';
import { dateOf } from '../domain/clock.ts';
import { newId, newSecret } from '../domain/ids.ts';
import { hashSecret } from '../domain/secrets.ts';
import { ApiError, validationError, type Issue } from '../http/errors.ts';
import { customerRef } from '../http/schemas.ts';
import { insertCheckoutSession, type CheckoutSessionRow } from '../storage/checkout-sessions.ts';
import { findConnection, isCustomerId } from '../storage/connections.ts';
import { findCreditBundle, findPlan } from '../storage/plans.ts';
import { findCustomerSubscriptionView } from '../storage/subscriptions.ts';

export const CHECKOUT_MODES = ['onboarding', 'topup', 'subscription', 'credit_bundle'] as const;

const id = z.string().min(1).max(100);
export const checkoutSessionCreateBody = z.object({
  checkout_mode: z.enum(CHECKOUT_MODES),
  origin_url: z
    .url({ protocol: /^https?$/, error: 'must be an http(s) URL' })
    .max(2048)
    .describe('The page checkout is opened from: it may frame the checkout, receives its completion message (at its origin), and the customer is sent back to it'),
  reference_id: z
    .string()
    .trim()
    .min(1)
    .max(255)
    .refine((v) => !isCustomerId(v), 'must not start with con_ (a customer id does)')
    .optional()
    .describe('The customer this checkout creates gets it; when a customer already has it, the checkout is for that customer'),
  customer_id: customerRef.optional().describe('The customer id, or its reference_id'),
  connection_id: customerRef.optional().describe('Older name of customer_id'),
  plan_id: id.optional(),
  subscription_config_id: id.optional().describe('Older name of plan_id'),
  credit_bundle_id: id.optional(),
});

export const checkoutSessionSchema = z.object({
  checkout_session_id: z.string(),
  checkout_session_token: z.string().nullable().describe('Only in the creation response: base64 of JSON {secret, base}; stored only as a hash'),
  checkout_url: z.string().optional().describe('The hosted checkout page for this session (creation response only)'),
  checkout_mode: z.enum(CHECKOUT_MODES),
  origin_url: z.string(),
  reference_id: z.string().nullable(),
  customer_id: z.string().nullable(),
  connection_id: z.string().nullable().describe('Older name of customer_id'),
  plan_id: z.string().nullable(),
  subscription_config_id: z.string().nullable().describe('Older name of plan_id'),
  credit_bundle_id: z.string().nullable(),
  subscription_id: z.string().nullable(),
  created_at: z.string(),
  expires_at: z.string(),
  completed_at: z.string().nullable(),
  receipt_url: z
    .string()
    .nullable()
    .optional()
    .describe("A completed session's receipt: a stable, unguessable page the customer can be sent (null until completed)"),
});

/**
 * The page checkout is opened from, kept whole (the customer returns to it; frames and messages
 * use its origin), as the URL parser writes it; a bare origin stays without a trailing slash.
 */
function keptOriginUrl(given: string): string {
  const url = new URL(given);
  return url.pathname === '/' && !url.search && !url.hash && !given.endsWith('/') ? url.origin : url.href;
}

/** This Tollgate's public URL, with a trailing slash: configured, or the one the request reached. */
export function publicBase(configured: string | undefined, request: { protocol: string; host: string }): string {
  const base = configured ?? `${request.protocol}://${request.host}`;
  return base.endsWith('/') ? base : `${base}/`;
}

/**
 * A new session for what its mode needs (checked against the merchant's data), with its token and
 * the hosted page's URL under `base` (this Tollgate's public URL): shown once, stored as a hash.
 */
export async function createCheckoutSession(deps: CommerceDeps, merchantId: string, body: z.infer<typeof checkoutSessionCreateBody>, base: string) {
  const target = await checkedTarget(deps, merchantId, body);
  const secret = newSecret('checkoutSession');
  const now = dateOf(deps.clock);
  const row: CheckoutSessionRow = {
    id: newId('checkoutSession'),
    merchant_id: merchantId,
    mode: body.checkout_mode,
    origin_url: keptOriginUrl(body.origin_url),
    reference_id: body.reference_id ?? null,
    connection_id: target.customerId,
    plan_id: target.planId,
    credit_bundle_id: target.bundleId,
    subscription_id: null,
    token_hash: hashSecret(secret),
    expires_at: new Date(now.getTime() + CHECKOUT_SESSION_TTL_MS).toISOString(),
    completed_at: null,
    created_at: now.toISOString(),
    contact: null,
  };
  await insertCheckoutSession(deps.storage, row);
  const token = Buffer.from(JSON.stringify({ secret, base })).toString('base64');
  return { ...presentCheckoutSession(row, token, base), checkout_url: `${base}checkout?token=${encodeURIComponent(token)}` };
}

/** What the mode needs, checked against the merchant's data; both vocabularies accepted. */
async function checkedTarget(deps: CommerceDeps, merchantId: string, body: z.infer<typeof checkoutSessionCreateBody>) {
  const customerId = body.customer_id ?? body.connection_id;
  const planId = body.plan_id ?? body.subscription_config_id;
  const mode = body.checkout_mode;
  const issues: Issue[] = [];
  const need = (value: unknown, path: string, message: string) => {
    if (value === undefined) issues.push({ path: [path], message });
  };
  if (mode === 'topup') need(customerId, 'connection_id', 'is required in topup mode (or customer_id)');
  if (mode === 'subscription') need(planId, 'plan_id', 'is required in subscription mode (or subscription_config_id)');
  if (mode === 'credit_bundle') {
    need(customerId, 'customer_id', 'is required in credit_bundle mode');
    need(body.credit_bundle_id, 'credit_bundle_id', 'is required in credit_bundle mode');
  }
  if (issues.length > 0) throw validationError(issues);

  const named = customerId === undefined ? undefined : await findConnection(deps.storage, merchantId, customerId);
  if (customerId !== undefined && !named) throw validationError([{ path: ['customer_id'], message: `no customer with id ${customerId}` }]);
  // A checkout that would create a customer whose reference_id a customer already has is that
  // customer's, decided now, before anybody pays: customer create is idempotent on reference_id.
  const createsCustomer = named === undefined && (mode === 'onboarding' || mode === 'subscription');
  const referenced = createsCustomer && body.reference_id !== undefined ? await findConnection(deps.storage, merchantId, body.reference_id) : undefined;
  const customer = named ?? referenced;
  const plan = mode === 'subscription' ? await findPlan(deps.storage, merchantId, planId!) : undefined;
  if (mode === 'subscription' && !plan) throw validationError([{ path: ['plan_id'], message: `no plan with id ${planId}` }]);
  const live = customer ? await findCustomerSubscriptionView(deps.storage, merchantId, customer.id) : undefined;
  const subscribed = live && live.status !== 'cancelled' ? live : undefined;
  // A subscriber's checkout for another plan changes the plan (decision 0037); the current plan, or
  // a first period still being charged, leaves nothing to buy.
  if (mode === 'subscription' && subscribed && (subscribed.plan_id === plan!.id || subscribed.status === 'incomplete')) {
    throw new ApiError('subscription_exists', 'The customer is already subscribed to this plan.');
  }
  if (mode === 'credit_bundle') {
    const bundle = await findCreditBundle(deps.storage, merchantId, body.credit_bundle_id!);
    if (!bundle) throw validationError([{ path: ['credit_bundle_id'], message: `no credit bundle with id ${body.credit_bundle_id}` }]);
    if (!subscribed || subscribed.plan_id !== bundle.plan_id) {
      throw validationError([{ path: ['credit_bundle_id'], message: "the customer's subscription is not on this bundle's plan" }]);
    }
  }
  return {
    customerId: mode === 'onboarding' ? (referenced?.id ?? null) : (customer?.id ?? null),
    planId: plan?.id ?? null,
    bundleId: mode === 'credit_bundle' ? body.credit_bundle_id! : null,
  };
}
