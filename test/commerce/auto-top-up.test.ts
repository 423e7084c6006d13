import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../src/domain/clock.ts';
import { topUpIfShort } from '../../src/commerce/auto-top-up.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('auto top-up on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  async function subscribedWithBundle(card: 'succeeds' | 'declinesLater') {
    const plan = await createPlan(t, { name: 'Zero credit', period_amount: '0', included_credit: '0', billing_interval: 'month', credit_bundles: [{ name: 'Refill', cost: '4', credit_amount: '5' }], default_auto_top_up_bundle_index: 0 });
    const c = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, c.customerId, card);
    expect((await subscribe(t, c.customerId, plan.plan_id)).statusCode).toBe(201);
    return c;
  }
  const deps = () => ({ storage: t.storage, payments: t.payments, clock: systemClock });

  it('buys the bundle once for 20 concurrent requests short of money, then covers them from it', async () => {
    const { walletId } = await subscribedWithBundle('succeeds');
    const before = t.payments.charges.length;
    const results = await Promise.all(Array.from({ length: 20 }, () => topUpIfShort(deps(), walletId, parseMoney('1'), new Date())));
    expect(results.filter((r) => r === 'bought')).toHaveLength(1);
    expect(results.every((r) => r === 'bought' || r === 'bought_by_another' || r === 'covered')).toBe(true);
    expect(t.payments.charges.slice(before)).toEqual([expect.objectContaining({ amount: parseMoney('4'), status: 'succeeded' })]);
    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ bundle: parseMoney('5'), balance: parseMoney('5') });
    expect(await topUpIfShort(deps(), walletId, parseMoney('5'), new Date())).toBe('covered');
    expect(await topUpIfShort(deps(), walletId, parseMoney('6'), new Date())).toBe('bought');
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('10'));
  });

  it('a declined card buys nothing, and a customer without an auto top-up bundle is left alone', async () => {
    const { walletId } = await subscribedWithBundle('declinesLater');
    expect(await topUpIfShort(deps(), walletId, parseMoney('1'), new Date())).toBe('payment_failed');
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
    const plain = await createCustomer(t);
    expect(await topUpIfShort(deps(), plain.walletId, parseMoney('1'), new Date())).toBe('no_auto_top_up');
  });
});
