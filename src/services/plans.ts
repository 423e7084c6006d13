/**
 * Plans: their terms, credit bundles and linked meters. The API's /v1/plans and the dashboard's
 * plan pages both go through these operations and show a plan with presentPlan.
 */
import { z } from 'zod';
import { formatMoney, parseMoney } from '../domain/money.ts';
import { ApiError, notFound, validationError, type Issue } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { nonNegativeDecimal, optionalBody, positiveDecimal } from '../http/schemas.ts';
import type { Storage } from '../storage/db.ts';
import {
  countLiveSubscriptions,
  existingMeterIds,
  findPlan,
  insertPlan,
  listPlans,
  softDeletePlan,
  updatePlan,
  type CreditBundleRow,
  type PlanChanges,
  type PlanWithParts,
} from '../storage/plans.ts';
import { merchantHasRow } from '../storage/pages.ts';

export const BILLING_INTERVALS = ['day', 'week', 'month', 'year'] as const;
export const ROLLOVER_TYPES = ['full', 'none'] as const;

const name = z.string().trim().min(1).max(255);
const meterIds = z.array(z.string().min(1).max(100)).max(100);
const newBundle = z.object({ name, cost: nonNegativeDecimal, credit_amount: positiveDecimal });

export const planCreateBody = z.object({
  name,
  period_amount: nonNegativeDecimal,
  included_credit: nonNegativeDecimal.optional().describe('Credit granted each cycle; defaults to period_amount'),
  billing_interval: z.enum(BILLING_INTERVALS),
  rollover_type: z.enum(ROLLOVER_TYPES).default('full'),
  bundle_rollover_type: z.enum(ROLLOVER_TYPES).default('full'),
  meter_ids: meterIds.default([]),
  credit_bundles: z.array(newBundle).max(50).default([]),
  default_auto_top_up_bundle_index: z.number().int().min(0).nullable().optional().describe('Index into credit_bundles'),
});

export const planUpdateBody = optionalBody(
  z.object({
    name: name.optional(),
    rollover_type: z.enum(ROLLOVER_TYPES).optional(),
    bundle_rollover_type: z.enum(ROLLOVER_TYPES).optional(),
    included_credit: nonNegativeDecimal.optional(),
    default_auto_top_up_bundle_id: z.string().min(1).max(100).nullable().optional(),
    meter_ids: meterIds.optional(),
    credit_bundles: z
      .array(newBundle.extend({ credit_bundle_id: z.string().min(1).max(100).optional(), is_deleted: z.boolean().optional() }))
      .max(50)
      .optional(),
  }),
);

export const creditBundleSchema = z.object({
  credit_bundle_id: z.string(),
  plan_id: z.string(),
  name: z.string(),
  cost: z.string(),
  credit_amount: z.string(),
  created_at: z.string(),
});

/** A plan's commercial terms; subscriptions show them too. */
export const planTermsSchema = z.object({
  name: z.string(),
  period_amount: z.string(),
  included_credit: z.string(),
  billing_interval: z.enum(BILLING_INTERVALS),
  rollover_type: z.enum(ROLLOVER_TYPES),
  bundle_rollover_type: z.enum(ROLLOVER_TYPES),
});

export const planSchema = planTermsSchema.extend({
  plan_id: z.string(),
  subscription_config_id: z.string().describe('Older name of plan_id'),
  merchant_id: z.string(),
  default_auto_top_up_bundle_id: z.string().nullable(),
  linked_meters: z.array(z.object({ meter_id: z.string(), name: z.string() })),
  credit_bundles: z.array(creditBundleSchema.omit({ plan_id: true, created_at: true })),
  created_at: z.string(),
});

export function presentCreditBundle(row: CreditBundleRow): z.infer<typeof creditBundleSchema> {
  return {
    credit_bundle_id: row.id,
    plan_id: row.plan_id,
    name: row.name,
    cost: formatMoney(row.cost),
    credit_amount: formatMoney(row.credit_amount),
    created_at: row.created_at,
  };
}

export function presentPlan(plan: PlanWithParts): z.infer<typeof planSchema> {
  return {
    plan_id: plan.id,
    subscription_config_id: plan.id,
    merchant_id: plan.merchant_id,
    name: plan.name,
    period_amount: formatMoney(plan.period_amount),
    included_credit: formatMoney(plan.included_credit),
    billing_interval: plan.billing_interval,
    rollover_type: plan.rollover_type,
    bundle_rollover_type: plan.bundle_rollover_type,
    default_auto_top_up_bundle_id: plan.default_auto_top_up_bundle_id,
    linked_meters: plan.meters,
    credit_bundles: plan.bundles.map((b) => ({
      credit_bundle_id: b.id,
      name: b.name,
      cost: formatMoney(b.cost),
      credit_amount: formatMoney(b.credit_amount),
    })),
    created_at: plan.created_at,
  };
}

/** Every meter id must name a live meter of the merchant. */
async function checkMeterIds(storage: Storage, merchantId: string, ids: string[]): Promise<void> {
  const known = await existingMeterIds(storage, merchantId, ids);
  const issues: Issue[] = ids.flatMap((id, i) => (known.has(id) ? [] : [{ path: ['meter_ids', String(i)], message: `no meter with id ${id}` }]));
  if (issues.length > 0) throw validationError(issues);
}

/** A page of the merchant's plans, newest first (the cursor must name one of them). */
export async function listPlanPage(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<PlanWithParts[]> {
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'plans', merchantId, id));
  return listPlans(storage, merchantId, cursor, limit);
}

/** The plan, or a 404. */
export async function getPlan(storage: Storage, merchantId: string, id: string): Promise<PlanWithParts> {
  const plan = await findPlan(storage, merchantId, id);
  if (!plan) throw notFound('plan', id);
  return plan;
}

/** PATCH /plans/{id}: the body checked against the plan it changes, then applied. */
export async function changePlan(storage: Storage, merchantId: string, id: string, body: z.infer<typeof planUpdateBody>, at: string): Promise<PlanWithParts> {
  const current = await getPlan(storage, merchantId, id);
  const changes = await planChanges(storage, merchantId, current, body);
  const plan = await updatePlan(storage, merchantId, current.id, changes, at);
  if (!plan) throw notFound('plan', id);
  return plan;
}

/** A plan that live subscriptions still use is kept (409 plan_in_use). */
export async function deletePlan(storage: Storage, merchantId: string, id: string, at: string): Promise<string> {
  const plan = await getPlan(storage, merchantId, id);
  if ((await countLiveSubscriptions(storage, plan.id)) > 0) throw new ApiError('plan_in_use');
  await softDeletePlan(storage, merchantId, plan.id, at);
  return plan.id;
}

/** A plan as POST /plans creates it (the dashboard's plan form too); validation errors name the field. */
export async function createPlan(storage: Storage, merchantId: string, body: z.infer<typeof planCreateBody>, createdAt: string): Promise<PlanWithParts> {
  const index = body.default_auto_top_up_bundle_index ?? null;
  if (index !== null && index >= body.credit_bundles.length) {
    throw validationError([{ path: ['default_auto_top_up_bundle_index'], message: 'must be the index of one of credit_bundles' }]);
  }
  await checkMeterIds(storage, merchantId, body.meter_ids);
  const periodAmount = parseMoney(body.period_amount);
  return insertPlan(storage, merchantId, {
    fields: {
      name: body.name,
      period_amount: periodAmount,
      included_credit: body.included_credit === undefined ? periodAmount : parseMoney(body.included_credit),
      billing_interval: body.billing_interval,
      rollover_type: body.rollover_type,
      bundle_rollover_type: body.bundle_rollover_type,
    },
    bundles: body.credit_bundles.map((b) => ({ name: b.name, cost: parseMoney(b.cost), credit_amount: parseMoney(b.credit_amount) })),
    meterIds: body.meter_ids,
    defaultBundleIndex: index,
  }, createdAt);
}

/** Checks a PATCH body against the plan it changes and turns it into storage changes. */
async function planChanges(
  storage: Storage,
  merchantId: string,
  current: PlanWithParts,
  body: z.infer<typeof planUpdateBody>,
): Promise<PlanChanges> {
  const ownBundles = new Set(current.bundles.map((b) => b.id));
  const issues: Issue[] = [];
  body.credit_bundles?.forEach((b, i) => {
    if (b.credit_bundle_id !== undefined && !ownBundles.has(b.credit_bundle_id)) {
      issues.push({ path: ['credit_bundles', String(i), 'credit_bundle_id'], message: `no credit bundle ${b.credit_bundle_id} on this plan` });
    }
  });
  const deleted = new Set((body.credit_bundles ?? []).filter((b) => b.is_deleted).map((b) => b.credit_bundle_id));
  const defaultId = body.default_auto_top_up_bundle_id;
  if (typeof defaultId === 'string' && (!ownBundles.has(defaultId) || deleted.has(defaultId))) {
    issues.push({ path: ['default_auto_top_up_bundle_id'], message: 'must name a live credit bundle of this plan' });
  }
  if (issues.length > 0) throw validationError(issues);
  if (body.meter_ids) await checkMeterIds(storage, merchantId, body.meter_ids);

  const fields: PlanChanges['fields'] = {};
  if (body.name !== undefined) fields.name = body.name;
  if (body.rollover_type !== undefined) fields.rollover_type = body.rollover_type;
  if (body.bundle_rollover_type !== undefined) fields.bundle_rollover_type = body.bundle_rollover_type;
  if (body.included_credit !== undefined) fields.included_credit = parseMoney(body.included_credit);
  if (defaultId !== undefined) fields.default_auto_top_up_bundle_id = defaultId;
  return {
    fields,
    ...(body.meter_ids ? { meterIds: body.meter_ids } : {}),
    ...(body.credit_bundles
      ? {
          bundles: body.credit_bundles.map((b) => ({
            ...(b.credit_bundle_id ? { credit_bundle_id: b.credit_bundle_id } : {}),
            name: b.name,
            cost: parseMoney(b.cost),
            credit_amount: parseMoney(b.credit_amount),
            ...(b.is_deleted ? { is_deleted: true } : {}),
          })),
        }
      : {}),
  };
}
