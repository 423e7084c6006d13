/**
 * Alert rules (decision 0043): a customer's balance falling below a threshold, or a customer's or
 * spend key's spend in a day, a month or in total reaching one. The API and the dashboard create,
 * change and show them through these operations; the background round that fires them is
 * services/alert-round.ts.
 */
import { z } from 'zod';
import type { Clock } from '../domain/clock.ts';
import { formatMoney, parseMoney } from '../domain/money.ts';
import { cycleStart } from '../domain/spend-limits.ts';
import { ApiError, notFound, validationError } from '../http/errors.ts';
import { assertCursor } from '../http/pagination.ts';
import { customerRef, optionalBody, positiveDecimal } from '../http/schemas.ts';
import {
  deleteAlert,
  findAlert,
  insertAlert,
  listAlerts,
  listFirings,
  MAX_ALERTS_PER_MERCHANT,
  updateAlert,
  type AlertFiringRow,
  type AlertRow,
} from '../storage/alerts.ts';
import { findConnection } from '../storage/connections.ts';
import type { Storage } from '../storage/db.ts';
import { merchantHasRow } from '../storage/pages.ts';
import type { AlertKind, AlertPeriod } from '../storage/schema.ts';
import { findSpendKey } from '../storage/spend-keys.ts';

export const ALERT_KINDS = ['low_balance', 'spend_threshold'] as const satisfies readonly AlertKind[];
export const ALERT_PERIODS = ['day', 'month', 'total'] as const satisfies readonly AlertPeriod[];

const kind = z.enum(ALERT_KINDS, { error: `must be one of ${ALERT_KINDS.join(', ')}` });
const period = z.enum(ALERT_PERIODS, { error: `must be one of ${ALERT_PERIODS.join(', ')}` });
const threshold = positiveDecimal.describe('The amount, as a decimal string: low_balance fires below it, spend_threshold once spend reaches it');
const enabled = z.boolean({ error: 'must be true or false' });

// Strict: a misspelt field must not create a rule that watches something else than meant.
export const alertCreateBody = z
  .strictObject({
    kind,
    customer_id: customerRef.optional().describe('The customer watched (its id or reference_id)'),
    spend_key_id: z.string().min(1).max(100).optional().describe('The spend key watched (spend_threshold only)'),
    threshold,
    period: period.optional().describe('spend_threshold: the UTC day, the UTC month, or all time'),
    enabled: enabled.optional(),
  })
  .superRefine((body, ctx) => {
    for (const issue of subjectIssues(body)) ctx.addIssue({ code: 'custom', ...issue });
  });

export const alertUpdateBody = optionalBody(z.strictObject({ threshold: threshold.optional(), period: period.optional(), enabled: enabled.optional() }));

/** Which subject and period each kind takes: a low balance is a customer's; a spend has a period. */
function subjectIssues(body: { kind: AlertKind; customer_id?: string | undefined; spend_key_id?: string | undefined; period?: AlertPeriod | undefined }) {
  const issues: { path: string[]; message: string }[] = [];
  if (body.kind === 'low_balance') {
    if (body.customer_id === undefined) issues.push({ path: ['customer_id'], message: 'is required for a low_balance alert' });
    if (body.spend_key_id !== undefined) issues.push({ path: ['spend_key_id'], message: 'is not allowed for a low_balance alert (a spend key has no balance of its own)' });
    if (body.period !== undefined) issues.push({ path: ['period'], message: 'is not allowed for a low_balance alert' });
    return issues;
  }
  if ((body.customer_id === undefined) === (body.spend_key_id === undefined)) {
    issues.push({ path: ['customer_id'], message: 'give either customer_id or spend_key_id for a spend_threshold alert' });
  }
  if (body.period === undefined) issues.push({ path: ['period'], message: 'is required for a spend_threshold alert' });
  return issues;
}

export const alertSchema = z.object({
  alert_id: z.string(),
  kind,
  customer_id: z.string().nullable(),
  spend_key_id: z.string().nullable(),
  threshold: z.string(),
  period: period.nullable(),
  enabled: z.boolean(),
  state: z.enum(['armed', 'triggered']).describe('triggered: it fired and waits for the balance to recover or the period to end'),
  triggered_at: z.string().nullable().describe('When the crossing it waits on fired; null while armed'),
  created_at: z.string(),
  updated_at: z.string(),
});
export type Alert = z.infer<typeof alertSchema>;

export const alertFiringSchema = z.object({
  firing_id: z.string(),
  alert_id: z.string(),
  event_id: z.string().describe('The alert.triggered event that reported it'),
  value: z.string().describe('The balance, or the period’s spend, the round read'),
  threshold: z.string(),
  period_start: z.string().nullable(),
  fired_at: z.string(),
});

/** The start of a spend rule's current period (ISO); the epoch for `total`. */
export function periodStartOf(period: AlertPeriod, now: Date): string {
  return cycleStart(period === 'day' ? 'daily' : period === 'month' ? 'monthly' : 'total', now);
}

/** Whether the rule's last crossing still stands: a spend crossing lasts until its period ends. */
export function isTriggered(row: AlertRow, now: Date): boolean {
  if (row.fired_at === null) return false;
  return row.period === null || row.fired_period === periodStartOf(row.period, now);
}

/** What a rule watches, as the API and the `alert.triggered` event both name it. */
export function ruleFields(row: AlertRow) {
  return {
    alert_id: row.id,
    kind: row.kind,
    customer_id: row.connection_id,
    spend_key_id: row.spend_key_id,
    threshold: formatMoney(BigInt(row.threshold)),
    period: row.period,
  };
}

export function presentAlert(row: AlertRow, now: Date): Alert {
  const triggered = isTriggered(row, now);
  return {
    ...ruleFields(row),
    enabled: Number(row.enabled) === 1,
    state: triggered ? 'triggered' : 'armed',
    triggered_at: triggered ? row.fired_at : null,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}

export function presentFiring(row: AlertFiringRow): z.infer<typeof alertFiringSchema> {
  return {
    firing_id: row.id,
    alert_id: row.alert_id,
    event_id: row.event_id,
    value: formatMoney(BigInt(row.value)),
    threshold: formatMoney(BigInt(row.threshold)),
    period_start: row.period_start,
    fired_at: row.fired_at,
  };
}

export type AlertDeps = { storage: Storage; clock: Clock };

const nowIso = (deps: { clock: Clock }) => new Date(deps.clock.now()).toISOString();

export async function getAlert(storage: Storage, merchantId: string, id: string): Promise<AlertRow> {
  const row = await findAlert(storage, merchantId, id);
  if (!row) throw notFound('alert', id);
  return row;
}

/** The subject's ids, checked to be the merchant's: a customer by id or reference_id, a spend key by id. */
async function resolveSubject(storage: Storage, merchantId: string, body: z.infer<typeof alertCreateBody>) {
  if (body.customer_id !== undefined) {
    const customer = await findConnection(storage, merchantId, body.customer_id);
    if (!customer) throw validationError([{ path: ['customer_id'], message: 'names no customer of this merchant' }]);
    return { connectionId: customer.id, spendKeyId: null };
  }
  const key = await findSpendKey(storage, { merchantId, walletId: null }, body.spend_key_id!);
  if (!key) throw validationError([{ path: ['spend_key_id'], message: 'names no spend key of this merchant' }]);
  return { connectionId: null, spendKeyId: key.id };
}

export async function createAlert(deps: AlertDeps, merchantId: string, body: z.infer<typeof alertCreateBody>): Promise<AlertRow> {
  const subject = await resolveSubject(deps.storage, merchantId, body);
  const input = { kind: body.kind, ...subject, threshold: parseMoney(body.threshold), period: body.period ?? null, enabled: body.enabled ?? true };
  const row = await insertAlert(deps.storage, merchantId, input, nowIso(deps));
  if (row === 'limit_reached') {
    throw new ApiError('alert_limit_reached', `A merchant may have at most ${MAX_ALERTS_PER_MERCHANT} alerts; delete one first.`);
  }
  return row;
}

export async function listAlertPage(storage: Storage, merchantId: string, cursor: string | undefined, limit: number): Promise<AlertRow[]> {
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'alerts', merchantId, id));
  return listAlerts(storage, merchantId, { cursor, limit });
}

/** Changes threshold, period or enabled; a new threshold or period re-arms the rule. */
export async function changeAlert(deps: AlertDeps, merchantId: string, id: string, body: z.infer<typeof alertUpdateBody>): Promise<AlertRow> {
  const current = await getAlert(deps.storage, merchantId, id);
  if (body.period !== undefined && current.kind === 'low_balance') {
    throw validationError([{ path: ['period'], message: 'is not allowed for a low_balance alert' }]);
  }
  const changes = {
    ...(body.threshold !== undefined ? { threshold: parseMoney(body.threshold) } : {}),
    ...(body.period !== undefined ? { period: body.period } : {}),
    ...(body.enabled !== undefined ? { enabled: body.enabled } : {}),
  };
  const row = await updateAlert(deps.storage, merchantId, id, changes, nowIso(deps));
  if (!row) throw notFound('alert', id);
  return row;
}

export async function removeAlert(storage: Storage, merchantId: string, id: string): Promise<void> {
  if (!(await deleteAlert(storage, merchantId, id))) throw notFound('alert', id);
}

/** A page of one rule's firings, newest first. */
export async function listFiringPage(storage: Storage, merchantId: string, alertId: string, cursor: string | undefined, limit: number): Promise<AlertFiringRow[]> {
  const alert = await getAlert(storage, merchantId, alertId);
  await assertCursor(cursor, (id) => merchantHasRow(storage, 'alert_firings', merchantId, id));
  return listFirings(storage, merchantId, { alertId: alert.id, cursor, limit });
}

/** The merchant's latest firings of any rule, for the dashboard. */
export async function recentFirings(storage: Storage, merchantId: string, limit: number): Promise<AlertFiringRow[]> {
  return (await listFirings(storage, merchantId, { cursor: undefined, limit })).slice(0, limit);
}
