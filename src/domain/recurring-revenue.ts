import { divRoundHalfUp } from './money.ts';

export type BillingInterval = 'day' | 'week' | 'month' | 'year';

/**
 * A month's share of one interval's price, as a fraction: a year is 12 months, a week 52/12 of
 * a month's worth (52 weeks a year), a day 365/12. Calendar months differ in length; a monthly
 * figure is a convention, and this is the common one.
 */
const PER_MONTH: Record<BillingInterval, { times: bigint; over: bigint }> = {
  day: { times: 365n, over: 12n },
  week: { times: 52n, over: 12n },
  month: { times: 1n, over: 1n },
  year: { times: 1n, over: 12n },
};

/**
 * Monthly recurring revenue from the summed period prices of live subscriptions, per billing
 * interval: each interval's sum converted once (rounded half-up), then added, so the total is
 * exact for monthly plans and off by at most one unit per interval otherwise.
 */
export function monthlyRecurringRevenue(sums: ReadonlyMap<BillingInterval, bigint>): bigint {
  let total = 0n;
  for (const [interval, sum] of sums) {
    const { times, over } = PER_MONTH[interval];
    total += divRoundHalfUp(sum * times, over);
  }
  return total;
}
