/**
 * Subscription cycles. A cycle's end is its anchor (when the subscription started) plus a whole
 * number of intervals, so monthly cycles keep their day of the month: one that started on the
 * 31st ends on the 30th in April and the 31st again in May, never drifting to the 28th.
 */
export type BillingInterval = 'day' | 'week' | 'month' | 'year';

const DAY_MS = 86_400_000;

/** The anchor plus `n` intervals, clamped to the last day of a month that is shorter. */
export function addIntervals(anchor: Date, interval: BillingInterval, n: number): Date {
  if (interval === 'day') return new Date(anchor.getTime() + n * DAY_MS);
  if (interval === 'week') return new Date(anchor.getTime() + n * 7 * DAY_MS);
  const months = interval === 'month' ? n : n * 12;
  const year = anchor.getUTCFullYear();
  const month = anchor.getUTCMonth() + months;
  const lastDay = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
  const day = Math.min(anchor.getUTCDate(), lastDay);
  const timeOfDay = anchor.getTime() - Date.UTC(year, anchor.getUTCMonth(), anchor.getUTCDate());
  return new Date(Date.UTC(year, month, day) + timeOfDay);
}

/** The first cycle boundary of this anchor and interval strictly after `after`. */
export function nextCycleEnd(anchor: Date, interval: BillingInterval, after: Date): Date {
  // Estimate the count from the average interval length, then step to the exact boundary.
  const approx: Record<BillingInterval, number> = { day: DAY_MS, week: 7 * DAY_MS, month: 28 * DAY_MS, year: 365 * DAY_MS };
  let n = Math.max(1, Math.floor((after.getTime() - anchor.getTime()) / approx[interval]) - 1);
  while (n > 1 && addIntervals(anchor, interval, n - 1).getTime() > after.getTime()) n--;
  while (addIntervals(anchor, interval, n).getTime() <= after.getTime()) n++;
  return addIntervals(anchor, interval, n);
}
