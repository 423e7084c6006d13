/**
 * The alert round (decision 0043): every interval, each enabled alert rule's balance or spend is
 * read and compared with its threshold, away from the request path. A crossing fires once: the
 * rule is marked fired, a firing row and an `alert.triggered` event are written in one
 * transaction, and nothing more fires until a low balance recovers to the threshold or a spend
 * period ends (or the rule is changed).
 */
import { dateOf, type Clock } from '../domain/clock.ts';
import { formatMoney } from '../domain/money.ts';
import { currentValue } from '../domain/spend-limits.ts';
import { runEveryInterval } from '../commerce/rounds.ts';
import {
  customerBalances,
  customerSpendSince,
  enabledAlertsAfter,
  insertFiring,
  setAlertState,
  spendKeyCounters,
  type AlertRow,
  type SpendKeyCounters,
} from '../storage/alerts.ts';
import type { Storage } from '../storage/db.ts';
import type { AlertPeriod } from '../storage/schema.ts';
import { enqueueEvent } from '../webhooks/outbox.ts';
import { periodStartOf, ruleFields } from './alerts.ts';

/** Rules read per query of a round. */
const PAGE = 200;

export type AlertRoundDeps = { storage: Storage; clock: Clock };
export type AlertRoundResult = { fired: number; rearmed: number };

/** What a rule's subject measures now: a balance or a period's spend; absent when the subject is gone. */
type Readings = {
  balances: Map<string, bigint>;
  customerSpend: Map<AlertPeriod, Map<string, bigint>>;
  keys: Map<string, SpendKeyCounters>;
};

/** What the round does with one rule. */
type Step =
  | { do: 'fire'; value: bigint; periodStart: string | null }
  | { do: 'rearm' }
  | { do: 'baseline'; periodStart: string; spend: bigint }
  | { do: 'nothing' };

/** One round over every enabled rule, page by page in id order; `stopping` ends it between pages. */
export async function evaluateAlerts(deps: AlertRoundDeps, now: Date, stopping: () => boolean = () => false): Promise<AlertRoundResult> {
  const result = { fired: 0, rearmed: 0 };
  let after: string | null = null;
  for (;;) {
    const page = await enabledAlertsAfter(deps.storage, after, PAGE);
    for (const rules of byMerchant(page).values()) {
      const readings = await readingsFor(deps.storage, rules, now);
      for (const rule of rules) {
        const applied = await apply(deps.storage, rule, stepFor(rule, readings, now), now);
        if (applied === 'fire') result.fired++;
        if (applied === 'rearm') result.rearmed++;
      }
    }
    if (page.length < PAGE || stopping()) return result;
    after = page[page.length - 1]!.id;
  }
}

/** Runs the round every `intervalMs` until stopped (commerce/rounds.ts: never two at once). */
export function startAlertRound(deps: AlertRoundDeps, opts: { intervalMs: number; onError: (err: unknown) => void }): { stop(): Promise<void> } {
  return runEveryInterval(opts.intervalMs, (stopping) => evaluateAlerts(deps, dateOf(deps.clock), stopping), opts.onError);
}

function byMerchant(rules: AlertRow[]): Map<string, AlertRow[]> {
  const groups = new Map<string, AlertRow[]>();
  for (const rule of rules) groups.set(rule.merchant_id, [...(groups.get(rule.merchant_id) ?? []), rule]);
  return groups;
}

/** A merchant's readings for its rules in a page: one query per kind of reading, not one per rule. */
async function readingsFor(storage: Storage, rules: AlertRow[], now: Date): Promise<Readings> {
  const merchantId = rules[0]!.merchant_id;
  const customersOf = (match: (rule: AlertRow) => boolean) => [...new Set(rules.filter((r) => r.connection_id !== null && match(r)).map((r) => r.connection_id!))];
  const customerSpend = new Map<AlertPeriod, Map<string, bigint>>();
  for (const period of ['day', 'month', 'total'] as const) {
    const ids = customersOf((r) => r.kind === 'spend_threshold' && r.period === period);
    if (ids.length > 0) customerSpend.set(period, await customerSpendSince(storage, merchantId, ids, period === 'total' ? null : periodStartOf(period, now)));
  }
  const keyIds = [...new Set(rules.filter((r) => r.spend_key_id !== null).map((r) => r.spend_key_id!))];
  return {
    balances: await customerBalances(storage, merchantId, customersOf((r) => r.kind === 'low_balance')),
    customerSpend,
    keys: await spendKeyCounters(storage, merchantId, keyIds),
  };
}

/** The decision for one rule, pure: compare the reading with the threshold and the rule's state. */
export function stepFor(rule: AlertRow, readings: Readings, now: Date): Step {
  const threshold = BigInt(rule.threshold);
  if (rule.kind === 'low_balance') {
    const balance = readings.balances.get(rule.connection_id!);
    if (balance === undefined) return { do: 'nothing' };
    if (balance < threshold) return rule.fired_at === null ? { do: 'fire', value: balance, periodStart: null } : { do: 'nothing' };
    return rule.fired_at === null ? { do: 'nothing' } : { do: 'rearm' };
  }
  const period = rule.period!;
  const periodStart = periodStartOf(period, now);
  let spend: bigint | undefined;
  if (rule.connection_id !== null) {
    spend = readings.customerSpend.get(period)?.get(rule.connection_id);
  } else {
    const key = readings.keys.get(rule.spend_key_id!);
    if (key === undefined) return { do: 'nothing' };
    const measured = keySpend(rule, key, period, periodStart, now);
    if ('baseline' in measured) return { do: 'baseline', periodStart, spend: measured.baseline };
    spend = measured.spend;
  }
  if (spend === undefined || spend < threshold || rule.fired_period === periodStart) return { do: 'nothing' };
  return { do: 'fire', value: spend, periodStart };
}

/**
 * A spend key's spend in the period. Its lifetime spend answers `total`, and its own limit's
 * counter answers the period that counter runs over. For another period the key keeps no
 * history: the rule counts from a baseline, the lifetime spend when a round first saw the period
 * (so spend before that first round, at most one interval's, is not counted).
 */
function keySpend(rule: AlertRow, key: SpendKeyCounters, period: AlertPeriod, periodStart: string, now: Date): { spend: bigint } | { baseline: bigint } {
  if (period === 'total') return { spend: key.total_spend };
  const cycle = period === 'day' ? 'daily' : 'monthly';
  if (key.spend_limit_cycle === cycle) return { spend: currentValue(key.current_spend, key.spend_cycle_start, cycle, now) };
  if (rule.baseline_period !== periodStart || rule.baseline_spend === null) return { baseline: key.total_spend };
  return { spend: key.total_spend - BigInt(rule.baseline_spend) };
}

/** Writes a step, if the rule is still as read; returns what was written. */
async function apply(storage: Storage, rule: AlertRow, step: Step, now: Date): Promise<Step['do']> {
  const at = now.toISOString();
  switch (step.do) {
    case 'nothing':
      return 'nothing';
    case 'rearm':
      return (await setAlertState(storage.db, rule, { fired_at: null, fired_period: null })) ? 'rearm' : 'nothing';
    case 'baseline':
      await setAlertState(storage.db, rule, { baseline_period: step.periodStart, baseline_spend: step.spend });
      return 'nothing';
    case 'fire':
      return (await fire(storage, rule, step, at)) ? 'fire' : 'nothing';
  }
}

/** Marks the rule fired and writes its firing and its event together; false if the rule changed meanwhile. */
async function fire(storage: Storage, rule: AlertRow, step: { value: bigint; periodStart: string | null }, at: string): Promise<boolean> {
  return storage.db.transaction().execute(async (trx) => {
    if (!(await setAlertState(trx, rule, { fired_at: at, fired_period: step.periodStart }))) return false;
    const eventId = await enqueueEvent(trx, { merchantId: rule.merchant_id, type: 'alert.triggered', at, data: alertEventData(rule, step) });
    await insertFiring(trx, {
      merchant_id: rule.merchant_id,
      alert_id: rule.id,
      value: step.value,
      threshold: BigInt(rule.threshold),
      period_start: step.periodStart,
      event_id: eventId,
      fired_at: at,
    });
    return true;
  });
}

/** The `alert.triggered` event's data, as docs/webhooks.md documents it. */
export function alertEventData(rule: AlertRow, step: { value: bigint; periodStart: string | null }): Record<string, unknown> {
  return {
    ...ruleFields(rule),
    period_start: step.periodStart,
    ...(rule.kind === 'low_balance' ? { balance: formatMoney(step.value) } : { spend: formatMoney(step.value) }),
  };
}
