/**
 * Usage reports: spend per day over a range of local days (GET /v1/usage and the dashboard's
 * overview show the same report), and the top customers and models over the same days.
 */
import { z } from 'zod';
import { formatMoney } from '../domain/money.ts';
import {
  isRangeProblem,
  parseUsageTime,
  usageRange,
  type UsageRange,
  type UsageTime,
} from '../domain/usage-window.ts';
import { validationError, type Issue } from '../http/errors.ts';
import { reportsOf, type Storage } from '../storage/db.ts';
import { addSums, emptySums, usageByDay, type UsageSums } from '../storage/usage.ts';
import { topCustomers, topModels } from '../storage/usage-leaders.ts';
import { requestFilterQuery, requestFiltersOf } from './requests.ts';

export const usageQuery = z.object({
  start: z
    .string({ error: 'start is required: a date (YYYY-MM-DD, UTC) or a date-time with an offset' })
    .max(64)
    .describe('First day, inclusive: a date (UTC) or a date-time whose offset sets the timezone of the days'),
  end: z.string().max(64).optional().describe('Last day, inclusive: a date or a date-time; defaults to now'),
  ...requestFilterQuery,
});

const money = z.string().describe('Decimal string with 10 fractional digits');

/** Both vocabularies: total_cost = total_usage_cost and total_charge = total_fee_amount. */
const usageTotalsSchema = z.object({
  total_requests: z.number().int(),
  total_usage_tokens: z.number().int(),
  total_usage_cost: money,
  total_fee_amount: money,
  total_service_charge_amount: money,
  total_request_cost: money,
  total_wallet_cost: money,
  total_merchant_cost: money,
  total_cost: money.describe('Base usage cost (newer name of total_usage_cost)'),
  total_charge: money.describe('Fee (newer name of total_fee_amount)'),
});

const usageItemSchema = usageTotalsSchema.extend({
  date: z.string().describe('Local calendar date, YYYY-MM-DD'),
  start: z.string().describe('First instant of the local day (UTC, Z)'),
  end: z.string().describe("The next day's start (UTC, Z): the day is [start, end)"),
});

export const usageResponseSchema = z.object({ items: z.array(usageItemSchema), totals: usageTotalsSchema });
type UsageTotals = z.infer<typeof usageTotalsSchema>;
type UsageItem = z.infer<typeof usageItemSchema>;

/** Counts are JSON numbers (the clients' types say so); money is a 10-place decimal string. */
function presentSums(s: UsageSums): UsageTotals {
  return {
    total_requests: Number(s.requests),
    total_usage_tokens: Number(s.tokens),
    total_usage_cost: formatMoney(s.usage_cost),
    total_fee_amount: formatMoney(s.fee),
    total_service_charge_amount: formatMoney(s.service_charge),
    total_request_cost: formatMoney(s.request_cost),
    total_wallet_cost: formatMoney(s.wallet_cost),
    total_merchant_cost: formatMoney(s.merchant_cost),
    total_cost: formatMoney(s.usage_cost),
    total_charge: formatMoney(s.fee),
  };
}

function presentUsage(range: UsageRange, days: UsageSums[]): { items: UsageItem[]; totals: UsageTotals } {
  const totals = emptySums();
  const items = range.days.map((day, i) => {
    const sums = days[i] ?? emptySums();
    addSums(totals, sums);
    return {
      date: day.date,
      start: new Date(day.startMs).toISOString(),
      end: new Date(day.endMs).toISOString(),
      ...presentSums(sums),
    };
  });
  return { items, totals: presentSums(totals) };
}

/** Reads start and end and turns them into the report's days, or a 400 naming what is wrong. */
function rangeOf(query: { start: string; end?: string | undefined }, now: Date): UsageRange {
  const issues: Issue[] = [];
  const read = (name: 'start' | 'end', text: string): UsageTime | undefined => {
    const parsed = parseUsageTime(text);
    if (parsed.ok) return parsed.value;
    issues.push({ path: [name], message: parsed.message });
    return undefined;
  };
  const start = read('start', query.start);
  const end = query.end === undefined ? undefined : read('end', query.end);
  if (!start || issues.length > 0) throw validationError(issues);
  const range = usageRange(start, end, now);
  if (isRangeProblem(range)) throw validationError([{ path: [range.path], message: range.message }]);
  return range;
}

export type UsageReport = { items: UsageItem[]; totals: UsageTotals };

/** The GET /usage answer; the dashboard's overview shows exactly this. Read from the replica, if any. */
export async function usageReport(
  primary: Storage,
  merchantId: string,
  query: z.infer<typeof usageQuery>,
  now: Date,
): Promise<UsageReport> {
  const storage = reportsOf(primary);
  const range = rangeOf(query, now);
  const days = await usageByDay(storage, merchantId, range, await requestFiltersOf(storage.db, merchantId, query));
  return presentUsage(range, days);
}

export type UsageLeaderRow = UsageTotals & { key: string };
export type UsageLeaders = { customers: UsageLeaderRow[]; models: UsageLeaderRow[] };

/**
 * The dashboard's top customers and models over the days GET /usage would report for the same
 * start and end: a customer's row is what GET /usage?customer_id=… totals.
 */
export async function usageLeaders(
  primary: Storage,
  merchantId: string,
  query: { start: string; end?: string | undefined },
  now: Date,
  limit: number,
): Promise<UsageLeaders> {
  const storage = reportsOf(primary);
  const range = rangeOf(query, now);
  const [customers, models] = await Promise.all([
    topCustomers(storage.db, merchantId, range, limit),
    topModels(storage.db, merchantId, range, limit),
  ]);
  const present = (rows: typeof customers) => rows.map((r) => ({ key: r.key, ...presentSums(r.sums) }));
  return { customers: present(customers), models: present(models) };
}
