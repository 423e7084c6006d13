import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { systemClock } from '../../src/domain/clock.ts';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TestPaymentProvider } from '../../src/payments/test-provider.ts';
import { openStorage, type Storage } from '../../src/storage/db.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, saveTestCard, subscribe } from '../helpers/commerce.ts';

/** Two instances (own connection pools, own payment provider clients) renewing the same database at once. */
describe.runIf(process.env.TEST_DATABASE_URL)('renewal with two instances on PostgreSQL', () => {
  let t: TestApp;
  let second: Storage;
  beforeAll(async () => {
    t = await startTestApp('postgres');
    second = openStorage(t.database.url, { poolSize: 10 });
  });
  afterAll(async () => {
    await second?.close();
    await t?.close();
  });

  it('charges and renews each due subscription exactly once', async () => {
    const plan = await createPlan(t, { name: 'Shared', period_amount: '2', included_credit: '2', billing_interval: 'day' });
    const subs: { id: string; end: Date }[] = [];
    for (let i = 0; i < 12; i++) {
      const c = await createCustomer(t);
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId);
      const sub = (await subscribe(t, c.customerId, plan.plan_id)).json().subscription;
      subs.push({ id: sub.subscription_id, end: new Date(sub.cycle_end_at) });
    }
    const at = new Date(Math.max(...subs.map((s) => s.end.getTime())) + 1000);
    const one = new TestPaymentProvider();
    const two = new TestPaymentProvider();
    await Promise.all([
      renewDueSubscriptions({ storage: t.storage, payments: one, clock: systemClock }, at),
      renewDueSubscriptions({ storage: second, payments: two, clock: systemClock }, at),
      renewDueSubscriptions({ storage: second, payments: two, clock: systemClock }, at),
      renewDueSubscriptions({ storage: t.storage, payments: one, clock: systemClock }, at),
    ]);
    const charges = [...one.charges, ...two.charges];
    expect(charges).toHaveLength(subs.length);
    expect(new Set(charges.map((c) => c.idempotencyKey)).size).toBe(subs.length);
    const renewed = (await eventsOfType(t.storage, 'subscription.renewed')).map((e) => e.data.subscription_id);
    expect(renewed.sort()).toEqual(subs.map((s) => s.id).sort());
    const rows = await t.storage.db.selectFrom('subscriptions').select(['id', 'cycle_start_at']).where('id', 'in', subs.map((s) => s.id)).execute();
    for (const row of rows) expect(row.cycle_start_at).toBe(subs.find((s) => s.id === row.id)!.end.toISOString());
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
