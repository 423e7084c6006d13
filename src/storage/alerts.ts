/**
 * Alert rules and their firings (decision 0043), and the readings the alert round compares with
 * the thresholds: customers' balances, customers' spend per period (the daily usage rollups) and
 * spend keys' counters. Writes of the round compare and set on the rule's revision, so an edit or
 * another instance's round in between makes the write a no-op instead of a second firing.
 */
import type { Transaction } from 'kysely';
import { newId } from '../domain/ids.ts';
import type { Storage } from './db.ts';
import { carriedSumColumns, exactSumOf } from './exact-sum.ts';
import { insertWithinMerchantLimit, newestFirstPage, type PageRequest } from './pages.ts';
import type { AlertFiringsTable, AlertKind, AlertPeriod, AlertsTable, Database, SpendKeysTable } from './schema.ts';

export type AlertRow = AlertsTable;
export type AlertFiringRow = AlertFiringsTable;

/** At most this many rules per merchant: each is read by every round. */
export const MAX_ALERTS_PER_MERCHANT = 100;

export type NewAlert = {
  kind: AlertKind;
  connectionId: string | null;
  spendKeyId: string | null;
  threshold: bigint;
  period: AlertPeriod | null;
  enabled: boolean;
};
export type AlertChanges = { threshold?: bigint; period?: AlertPeriod; enabled?: boolean };

/** A new armed rule, unless the merchant already has the maximum. */
export async function insertAlert(storage: Storage, merchantId: string, input: NewAlert, at: string): Promise<AlertRow | 'limit_reached'> {
  return insertWithinMerchantLimit(storage, 'alerts', MAX_ALERTS_PER_MERCHANT, {
    id: newId('alert'),
    merchant_id: merchantId,
    kind: input.kind,
    connection_id: input.connectionId,
    spend_key_id: input.spendKeyId,
    threshold: input.threshold,
    period: input.period,
    enabled: input.enabled ? 1 : 0,
    fired_at: null,
    fired_period: null,
    baseline_period: null,
    baseline_spend: null,
    revision: 0,
    created_at: at,
    updated_at: at,
  });
}

export async function findAlert(storage: Storage, merchantId: string, id: string): Promise<AlertRow | undefined> {
  return storage.db.selectFrom('alerts').selectAll().where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
}

export async function listAlerts(storage: Storage, merchantId: string, page: PageRequest): Promise<AlertRow[]> {
  return storage.db
    .selectFrom('alerts')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .$call((q) => newestFirstPage(q, page))
    .execute();
}

/**
 * Changes a rule. A new threshold or period re-arms it (its crossing state and a spend key's
 * baseline belong to the old setting), and so does enabling it again.
 */
export async function updateAlert(storage: Storage, merchantId: string, id: string, changes: AlertChanges, at: string): Promise<AlertRow | undefined> {
  const set: Partial<AlertRow> = { updated_at: at };
  if (changes.threshold !== undefined) set.threshold = changes.threshold;
  if (changes.period !== undefined) set.period = changes.period;
  if (changes.enabled !== undefined) set.enabled = changes.enabled ? 1 : 0;
  if (changes.threshold !== undefined || changes.period !== undefined || changes.enabled === true) {
    Object.assign(set, { fired_at: null, fired_period: null, baseline_period: null, baseline_spend: null });
  }
  return storage.db
    .updateTable('alerts')
    .set((eb) => ({ ...set, revision: eb('revision', '+', 1) }))
    .where('merchant_id', '=', merchantId)
    .where('id', '=', id)
    .returningAll()
    .executeTakeFirst();
}

/** Deletes a rule and its firings; false when there was none. */
export async function deleteAlert(storage: Storage, merchantId: string, id: string): Promise<boolean> {
  return storage.db.transaction().execute(async (trx) => {
    const gone = await trx.deleteFrom('alerts').where('merchant_id', '=', merchantId).where('id', '=', id).executeTakeFirst();
    if (gone.numDeletedRows === 0n) return false;
    await trx.deleteFrom('alert_firings').where('merchant_id', '=', merchantId).where('alert_id', '=', id).execute();
    return true;
  });
}

/** The merchant's most recent firings, newest first (of one rule when `alertId` is given). */
export async function listFirings(storage: Storage, merchantId: string, page: PageRequest & { alertId?: string }): Promise<AlertFiringRow[]> {
  return storage.db
    .selectFrom('alert_firings')
    .selectAll()
    .where('merchant_id', '=', merchantId)
    .$if(page.alertId !== undefined, (q) => q.where('alert_id', '=', page.alertId!))
    .$call((q) => newestFirstPage(q, page))
    .execute();
}

// ---------------------------------------------------------------------------------------------
// The round's reads and writes

/** Enabled rules of every merchant after `afterId`, in id order: one page of a round. */
export async function enabledAlertsAfter(storage: Storage, afterId: string | null, limit: number): Promise<AlertRow[]> {
  return storage.db
    .selectFrom('alerts')
    .selectAll()
    .where('enabled', '=', 1)
    .$if(afterId !== null, (q) => q.where('id', '>', afterId!))
    .orderBy('id')
    .limit(limit)
    .execute();
}

/** The balances of a merchant's live customers' wallets, by customer id. */
export async function customerBalances(storage: Storage, merchantId: string, connectionIds: string[]): Promise<Map<string, bigint>> {
  if (connectionIds.length === 0) return new Map();
  const rows = await storage.db
    .selectFrom('connections')
    .innerJoin('wallets', 'wallets.id', 'connections.wallet_id')
    .select(['connections.id as id', 'wallets.balance as balance'])
    .where('connections.merchant_id', '=', merchantId)
    .where('connections.id', 'in', connectionIds)
    .where('connections.deleted_at', 'is', null)
    .execute();
  return new Map(rows.map((r) => [r.id, BigInt(r.balance)]));
}

/**
 * What each customer's wallet paid for usage from the UTC day `sinceDay` on (every day when null),
 * from the daily rollups the settlement writes with each charge; a customer without usage is 0.
 */
export async function customerSpendSince(storage: Storage, merchantId: string, connectionIds: string[], sinceDay: string | null): Promise<Map<string, bigint>> {
  if (connectionIds.length === 0) return new Map();
  const rows = await storage.db
    .selectFrom('usage_rollups_by_day')
    .select('key')
    // A daily rollup's sum carries past 10^18 units (decision 0042): its carry counts too.
    .select(carriedSumColumns('wallet_cost', 'spend'))
    .where('merchant_id', '=', merchantId)
    .where('dimension', '=', 'customer')
    .where('key', 'in', connectionIds)
    .$if(sinceDay !== null, (q) => q.where('day_start', '>=', sinceDay!))
    .groupBy('key')
    .execute();
  const spend = new Map(connectionIds.map((id) => [id, 0n]));
  for (const row of rows) spend.set(row.key, exactSumOf(row, 'spend'));
  return spend;
}

export type SpendKeyCounters = Pick<SpendKeysTable, 'id' | 'spend_limit_cycle' | 'spend_cycle_start' | 'current_spend' | 'total_spend'>;

/** The spend counters of a merchant's spend keys (revoked ones too: what they spent still counts). */
export async function spendKeyCounters(storage: Storage, merchantId: string, ids: string[]): Promise<Map<string, SpendKeyCounters>> {
  if (ids.length === 0) return new Map();
  const rows = await storage.db
    .selectFrom('spend_keys')
    .select(['id', 'spend_limit_cycle', 'spend_cycle_start', 'current_spend', 'total_spend'])
    .where('merchant_id', '=', merchantId)
    .where('id', 'in', ids)
    .execute();
  return new Map(rows.map((r) => [r.id, { ...r, current_spend: BigInt(r.current_spend), total_spend: BigInt(r.total_spend) }]));
}

type Trx = Transaction<Database>;

/** Applies `set` to the rule if it is still at `revision`, bumping it; whether it was. */
export async function setAlertState(
  trx: Trx | Storage['db'],
  rule: Pick<AlertRow, 'id' | 'merchant_id' | 'revision'>,
  set: Partial<Pick<AlertRow, 'fired_at' | 'fired_period' | 'baseline_period' | 'baseline_spend'>>,
): Promise<boolean> {
  const result = await trx
    .updateTable('alerts')
    .set({ ...set, revision: Number(rule.revision) + 1 })
    .where('merchant_id', '=', rule.merchant_id)
    .where('id', '=', rule.id)
    .where('revision', '=', Number(rule.revision))
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}

export async function insertFiring(trx: Trx, firing: Omit<AlertFiringRow, 'id'>): Promise<void> {
  await trx.insertInto('alert_firings').values({ id: newId('alertFiring'), ...firing }).execute();
}
