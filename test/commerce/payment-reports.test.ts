import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { divRoundHalfUp, parseMoney } from '../../src/domain/money.ts';
import { monthlyRecurringRevenue } from '../../src/domain/recurring-revenue.ts';
import { listPayments, liveSubscriptionPrices, receivedByPurpose, refundedInRange } from '../../src/storage/payment-reports.ts';
import { insertRefund } from '../../src/storage/payments.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, saveTestCard, subscribe } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * The dashboard's payment reports read the same on both engines: received money summed exactly
 * per kind, failed payments listed but not counted, live subscriptions' prices per interval.
 */
describe.each(databasesUnderTest())('payment reports on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  it('sums succeeded payments by kind and succeeded refunds, lists every payment, and prices live subscriptions per interval', async () => {
    const monthly = await createPlan(t, { name: 'Pro', period_amount: '20.1234567891', billing_interval: 'month' });
    const yearly = await createPlan(t, { name: 'Annual', period_amount: '99999999', billing_interval: 'year' });
    const subscribed = async (planId: string, card: 'succeeds' | 'declined') => {
      const c = await createCustomer(t);
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, card);
      await subscribe(t, c.customerId, planId);
    };
    await subscribed(monthly.plan_id, 'succeeds');
    await subscribed(monthly.plan_id, 'succeeds');
    await subscribed(yearly.plan_id, 'succeeds');
    await subscribed(monthly.plan_id, 'declined');
    const merchantId = t.merchant.merchantId;

    const all = await listPayments(t.storage, merchantId, {}, { limit: 50 });
    expect(all.map((p) => p.status).sort()).toEqual(['failed', 'succeeded', 'succeeded', 'succeeded']);
    expect(all.map((p) => p.id)).toEqual([...all.map((p) => p.id)].sort().reverse());
    expect((await listPayments(t.storage, merchantId, { status: 'failed' }, { limit: 50 })).length).toBe(1);

    const received = await receivedByPurpose(t.storage, merchantId, {});
    const total = [...received.values()].reduce((sum, r) => sum + r.amount, 0n);
    expect(total).toBe(parseMoney('20.1234567891') * 2n + parseMoney('99999999'));
    expect([...received.values()].reduce((n, r) => n + r.count, 0)).toBe(3);
    expect(await receivedByPurpose(t.storage, merchantId, { from: '2999-01-01T00:00:00.000Z' })).toEqual(new Map());

    const paidOne = all.find((p) => p.status === 'succeeded')!;
    const at = new Date().toISOString();
    const refund = { merchant_id: merchantId, payment_id: paidOne.id, credit_amount: 0n, wallet_id: null, bucket: null, provider_ref: null, reason: null, failure_reason: null, created_at: at, updated_at: at };
    await insertRefund(t.storage.db, { ...refund, id: 'rfd_report_1', amount: parseMoney('1.0000000001'), status: 'succeeded' });
    await insertRefund(t.storage.db, { ...refund, id: 'rfd_report_2', amount: parseMoney('2'), status: 'succeeded' });
    await insertRefund(t.storage.db, { ...refund, id: 'rfd_report_3', amount: parseMoney('7'), status: 'failed' });
    expect(await refundedInRange(t.storage, merchantId, {})).toEqual({ count: 2, amount: parseMoney('3.0000000001') });
    expect(await refundedInRange(t.storage, 'mer_other', {})).toEqual({ count: 0, amount: 0n });

    const live = await liveSubscriptionPrices(t.storage, merchantId);
    expect(live.count).toBe(3);
    expect(live.sums).toEqual(new Map([['month', parseMoney('40.2469135782')], ['year', parseMoney('99999999')]]));
    expect(monthlyRecurringRevenue(live.sums)).toBe(parseMoney('40.2469135782') + divRoundHalfUp(parseMoney('99999999'), 12n));
  });
});

describe('monthly recurring revenue', () => {
  it('counts a month as it is, a year as a twelfth, a week as 52/12 and a day as 365/12, each rounded once', () => {
    const sum = fc.bigInt({ min: 0n, max: 10n ** 24n });
    fc.assert(
      fc.property(sum, sum, sum, sum, (day, week, month, year) => {
        const mrr = monthlyRecurringRevenue(new Map([['day', day], ['week', week], ['month', month], ['year', year]]));
        // Exact twelfths of the whole, within one unit for each converted interval.
        const exactTwelfths = day * 365n + week * 52n + month * 12n + year;
        const diff = mrr * 12n - exactTwelfths;
        expect(diff <= 18n && diff >= -18n).toBe(true);
        expect(monthlyRecurringRevenue(new Map([['month', month]]))).toBe(month);
      }),
    );
  });
});
