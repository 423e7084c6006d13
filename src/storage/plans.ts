import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import type { CreditBundlesTable, Database, PlansTable } from './schema.ts';
import { newestFirstPage } from './pages.ts';

export type PlanRow = PlansTable;
export type CreditBundleRow = CreditBundlesTable;
export type LinkedMeter = { meter_id: string; name: string };
/** A plan with what hangs off it: its live credit bundles (oldest first) and linked meters. */
export type PlanWithParts = PlanRow & { bundles: CreditBundleRow[]; meters: LinkedMeter[] };

export type NewBundle = { name: string; cost: bigint; credit_amount: bigint };
export type PlanFields = Pick<
  PlanRow,
  'name' | 'period_amount' | 'included_credit' | 'billing_interval' | 'rollover_type' | 'bundle_rollover_type'
>;

/**
 * A plan, its bundles and its meter links in one transaction. `defaultBundleIndex` names one of
 * the new bundles as the plan's default auto top-up bundle.
 */
export async function insertPlan(
  storage: Storage,
  merchantId: string,
  input: { fields: PlanFields; bundles: NewBundle[]; meterIds: string[]; defaultBundleIndex: number | null },
  createdAt: string,
): Promise<PlanWithParts> {
  const planId = await storage.db.transaction().execute(async (trx) => {
    const id = newId('plan');
    await trx
      .insertInto('plans')
      .values({ id, merchant_id: merchantId, ...input.fields, default_auto_top_up_bundle_id: null, created_at: createdAt, deleted_at: null })
      .execute();
    const bundleIds = await insertBundles(trx, merchantId, id, input.bundles, createdAt);
    if (input.defaultBundleIndex !== null) {
      await trx.updateTable('plans').set({ default_auto_top_up_bundle_id: bundleIds[input.defaultBundleIndex]! }).where('id', '=', id).execute();
    }
    await replaceMeterLinks(trx, id, input.meterIds);
    return id;
  });
  return (await findPlan(storage, merchantId, planId))!;
}

async function insertBundles(
  trx: Transaction<Database>,
  merchantId: string,
  planId: string,
  bundles: NewBundle[],
  createdAt: string,
): Promise<string[]> {
  const rows: CreditBundleRow[] = bundles.map((b) => ({
    id: newId('creditBundle'),
    merchant_id: merchantId,
    plan_id: planId,
    ...b,
    created_at: createdAt,
    deleted_at: null,
  }));
  if (rows.length > 0) await trx.insertInto('credit_bundles').values(rows).execute();
  return rows.map((r) => r.id);
}

async function replaceMeterLinks(trx: Transaction<Database>, planId: string, meterIds: string[]): Promise<void> {
  await trx.deleteFrom('plan_meters').where('plan_id', '=', planId).execute();
  const unique = [...new Set(meterIds)];
  if (unique.length > 0) await trx.insertInto('plan_meters').values(unique.map((meter_id) => ({ plan_id: planId, meter_id }))).execute();
}

export async function findPlan(storage: Storage, merchantId: string, id: string): Promise<PlanWithParts | undefined> {
  const plan = await storage.db
    .selectFrom('plans')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
  if (!plan) return undefined;
  return (await withParts(storage, [plan]))[0];
}

/** A plan by id whether deleted or not: subscriptions keep naming the plan they were sold. */
export async function findPlanIncludingDeleted(storage: Storage, id: string): Promise<PlanRow | undefined> {
  return storage.db.selectFrom('plans').selectAll().where('id', '=', id).executeTakeFirst();
}

export async function listPlans(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<PlanWithParts[]> {
  const plans = await storage.db
    .selectFrom('plans')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('deleted_at', 'is', null)
    .$call((q) => newestFirstPage(q, { cursor, limit }))
    .execute();
  return withParts(storage, plans);
}

async function withParts(storage: Storage, plans: PlanRow[]): Promise<PlanWithParts[]> {
  if (plans.length === 0) return [];
  const ids = plans.map((p) => p.id);
  const bundles = await storage.db
    .selectFrom('credit_bundles')
    .selectAll()
    .where('plan_id', 'in', ids)
    .where('deleted_at', 'is', null)
    .orderBy('id')
    .execute();
  const meters = await storage.db
    .selectFrom('plan_meters')
    .innerJoin('meters', 'meters.id', 'plan_meters.meter_id')
    .select(['plan_meters.plan_id', 'meters.id as meter_id', 'meters.name'])
    .where('plan_meters.plan_id', 'in', ids)
    .where('meters.deleted_at', 'is', null)
    .orderBy('meters.id')
    .execute();
  return plans.map((p) => ({
    ...p,
    bundles: bundles.filter((b) => b.plan_id === p.id),
    meters: meters.filter((m) => m.plan_id === p.id).map(({ meter_id, name }) => ({ meter_id, name })),
  }));
}

export type BundleChange = { credit_bundle_id?: string; name: string; cost: bigint; credit_amount: bigint; is_deleted?: boolean };
export type PlanChanges = {
  fields: Partial<Pick<PlanRow, 'name' | 'included_credit' | 'rollover_type' | 'bundle_rollover_type' | 'default_auto_top_up_bundle_id'>>;
  meterIds?: string[];
  bundles?: BundleChange[];
};

/**
 * Applies a plan update in one transaction. Bundles named by id are updated (or deleted with
 * `is_deleted`), the others are created. The caller has checked that the named ids are this plan's.
 */
export async function updatePlan(storage: Storage, merchantId: string, id: string, changes: PlanChanges, at: string): Promise<PlanWithParts | undefined> {
  const found = await storage.db.transaction().execute(async (trx) => {
    const plan = await trx.selectFrom('plans').select('id').where('merchant_id', '=', merchantId).where('id', '=', id).where('deleted_at', 'is', null).executeTakeFirst();
    if (!plan) return false;
    for (const b of changes.bundles ?? []) {
      if (b.credit_bundle_id === undefined) {
        await insertBundles(trx, merchantId, id, [{ name: b.name, cost: b.cost, credit_amount: b.credit_amount }], at);
      } else if (b.is_deleted) {
        await trx.updateTable('credit_bundles').set({ deleted_at: at }).where('id', '=', b.credit_bundle_id).where('plan_id', '=', id).execute();
        await trx.updateTable('plans').set({ default_auto_top_up_bundle_id: null }).where('id', '=', id).where('default_auto_top_up_bundle_id', '=', b.credit_bundle_id).execute();
      } else {
        await trx
          .updateTable('credit_bundles')
          .set({ name: b.name, cost: b.cost, credit_amount: b.credit_amount })
          .where('id', '=', b.credit_bundle_id)
          .where('plan_id', '=', id)
          .execute();
      }
    }
    if (Object.keys(changes.fields).length > 0) await trx.updateTable('plans').set(changes.fields).where('id', '=', id).execute();
    if (changes.meterIds !== undefined) await replaceMeterLinks(trx, id, changes.meterIds);
    return true;
  });
  return found ? findPlan(storage, merchantId, id) : undefined;
}

export async function softDeletePlan(storage: Storage, merchantId: string, id: string, at: string): Promise<boolean> {
  const result = await storage.db
    .updateTable('plans')
    .set({ deleted_at: at })
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
  return Number(result.numUpdatedRows) === 1;
}

export async function countLiveSubscriptions(storage: Storage, planId: string): Promise<number> {
  const row = await storage.db
    .selectFrom('subscriptions')
    .select((eb) => eb.fn.countAll<number | bigint>().as('n'))
    .where((eb) => eb.or([eb('plan_id', '=', planId), eb('pending_plan_id', '=', planId)]))
    .where('status', '<>', 'cancelled')
    .executeTakeFirstOrThrow();
  return Number(row.n);
}

/** Which of these meter ids are live meters of the merchant. */
export async function existingMeterIds(storage: Storage, merchantId: string, ids: string[]): Promise<Set<string>> {
  if (ids.length === 0) return new Set();
  const rows = await storage.db
    .selectFrom('meters')
    .select('id')
    .where('merchant_id', '=', merchantId)
    .where('id', 'in', ids)
    .where('deleted_at', 'is', null)
    .execute();
  return new Set(rows.map((r) => r.id));
}

export async function findCreditBundle(storage: Storage, merchantId: string, id: string): Promise<CreditBundleRow | undefined> {
  return storage.db
    .selectFrom('credit_bundles')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .where('deleted_at', 'is', null)
    .executeTakeFirst();
}

export async function listCreditBundles(
  storage: Storage,
  merchantId: string,
  opts: { cursor?: string; limit: number; planId?: string },
): Promise<CreditBundleRow[]> {
  return storage.db
    .selectFrom('credit_bundles')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .where('deleted_at', 'is', null)
    .$if(opts.planId !== undefined, (q) => q.where('plan_id', '=', opts.planId!))
    .$call((q) => newestFirstPage(q, opts))
    .execute();
}
