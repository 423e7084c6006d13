import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { PayResult } from '../../src/commerce/checkout.ts';
import { topUpIfShort } from '../../src/commerce/auto-top-up.ts';
import { reconcilePayments, RECONCILE_AFTER_MS, STALE_ATTEMPT_MS } from '../../src/commerce/reconciliation.ts';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { CommerceState } from '../../src/commerce/state.ts';
import type { PurchaseDeps } from '../../src/commerce/subscriptions.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TEST_CARDS, type TestFaultPoint } from '../../src/payments/test-provider.ts';
import { ProviderUnavailableError } from '../../src/payments/types.ts';
import { presentCustomer } from '../../src/services/customers.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, openCheckoutSession, payCheckoutSession, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * Fault injection: each step of a checkout, a renewal and an auto top-up is made to fail — the
 * provider call before it reaches the provider, after it charged (a crash, or a timeout), and the
 * step that credits the payment (its transaction rolls back) — and the reconciliation is run once
 * the payment's own call is surely over. Afterwards every charge the provider made is credited or
 * refunded: money taken = money credited + money refunded.
 */
const crash = () => new Error('the process died here');
const timeout = () => new ProviderUnavailableError('test', new Error('timed out after charging'));
const FAULTS: [string, TestFaultPoint | 'credit', () => Error][] = [
  ['a crash before the charge reaches the provider', 'before_charge', crash],
  ['a crash after the provider charged', 'after_charge', crash],
  ['a timeout after the provider charged', 'after_charge', timeout],
  ['a failure of the step that credits the payment', 'credit', crash],
];

describe.each(databasesUnderTest())('no charge without a credit on %s', (dialect) => {
  let t: TestApp;
  let creditFault: Error | null = null;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    creditFault = null;
    t.payments.clearFaults();
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
    await expectEveryChargeCreditedOrRefunded();
  });

  const deps = (): PurchaseDeps => ({
    storage: t.storage,
    payments: t.payments,
    clock: t.clock,
    commerceState: new CommerceState(),
    faultAt: () => {
      const fault = creditFault;
      creditFault = null;
      if (fault) throw fault;
    },
  });
  const inject = (point: TestFaultPoint | 'credit', error: Error) => (point === 'credit' ? (creditFault = error) : t.payments.failOnce(point, error));
  /** Runs the reconciliation once the payments' own calls are surely over (at `after`, else on the app's clock). */
  const reconcileLater = async (after?: Date) => {
    t.clock.advance(RECONCILE_AFTER_MS + 1);
    const at = after ? new Date(after.getTime() + RECONCILE_AFTER_MS + 1) : dateOf(t.clock);
    return reconcilePayments(deps(), (row) => presentCustomer(row, dateOf(t.clock)), at);
  };

  /** Every charge the provider made is a succeeded payment, credited or refunded; the sums agree. */
  async function expectEveryChargeCreditedOrRefunded() {
    const { taken, refunded } = t.payments.netTaken();
    let credited = 0n;
    let refundedInRows = 0n;
    for (const charge of t.payments.charges.filter((c) => c.status === 'succeeded')) {
      const payment = await t.storage.db.selectFrom('payments').selectAll().where('id', '=', charge.idempotencyKey).executeTakeFirstOrThrow();
      expect(payment.status, `payment ${payment.id}`).toBe('succeeded');
      if (payment.failure_reason === null) credited += BigInt(payment.amount);
      const refunds = await t.storage.db.selectFrom('refunds').selectAll().where('payment_id', '=', payment.id).where('status', '=', 'succeeded').execute();
      refundedInRows += refunds.reduce((sum, r) => sum + BigInt(r.amount), 0n);
    }
    expect(refundedInRows).toBe(refunded);
    expect(taken).toBe(credited + refunded);
  }

  const openTopUpSession = (customerId: string) => openCheckoutSession(t, customerId);
  const pay = (sessionId: string): Promise<PayResult | Error> => payCheckoutSession(t, deps(), sessionId).catch((e: Error) => e);

  describe('checkout', () => {
    it.each(FAULTS)('%s ends with the top-up credited once', async (_name, point, error) => {
      const { customerId, walletId } = await createCustomer(t);
      const session = await openTopUpSession(customerId);
      inject(point, error());
      const first = await pay(session.id);
      expect(first).not.toMatchObject({ status: 'completed' });
      await reconcileLater();
      // Paid then, or never charged and paid again now: either way the session is paid once.
      if ((await walletBuckets(t.storage, walletId)).prepaid === 0n) expect(await pay(session.id)).toMatchObject({ status: 'completed' });
      expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('20'));
    });

    it('a charge the customer paid again after a timeout is refunded once the session was paid by the second', async () => {
      const { customerId, walletId } = await createCustomer(t);
      const session = await openTopUpSession(customerId);
      inject('after_charge', timeout());
      expect(await pay(session.id)).toMatchObject({ status: 'unavailable' });
      expect(await pay(session.id)).toMatchObject({ status: 'completed' });
      const report = await reconcileLater();
      expect(report.refunded).toBe(1);
      expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('20'));
    });

    it('a payment whose crediting failed and whose session expired meanwhile is refunded, never credited', async () => {
      const { customerId, walletId } = await createCustomer(t);
      const session = await openTopUpSession(customerId);
      inject('credit', crash());
      expect(await pay(session.id)).toBeInstanceOf(Error);
      t.clock.advance(60 * 60_000);
      const report = await reconcileLater();
      expect(report.refunded).toBe(1);
      expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(0n);
    });
  });

  describe('a checkout paid again after its request died', () => {
    const CRASHES = FAULTS.filter(([, , error]) => error === crash);
    const payOnPage = (token: string) =>
      t.app.inject({
        method: 'POST',
        url: '/checkout/pay',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        payload: new URLSearchParams({ token, amount: '20', card_number: TEST_CARDS.succeeds }).toString(),
      });

    it.each(CRASHES)('%s: seconds later, not minutes, the retry settles it with the provider and the customer is credited once', async (_name, point, error) => {
      const { customerId, walletId } = await createCustomer(t);
      const created = await t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload: { checkout_mode: 'topup', origin_url: 'https://shop.example.com/', customer_id: customerId } });
      const { checkout_session_id: sessionId, checkout_session_token: token } = created.json();
      inject(point, error());
      expect(await pay(sessionId)).toBeInstanceOf(Error);
      // At once, the earlier request may still be paying: the retry waits for it.
      const early = await payOnPage(token);
      expect(early.statusCode).toBe(402);
      expect(early.body).toContain('already in progress');

      t.clock.advance(STALE_ATTEMPT_MS + 1);
      const retried = await payOnPage(token);
      expect(retried.statusCode, retried.body).toBe(200);
      expect(retried.body).toContain('Payment received');
      expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('20'));
      const payments = await t.storage.db.selectFrom('payments').selectAll().where('reference', 'like', `${sessionId}%`).execute();
      // Charged by the first attempt: settled, no second charge; never charged: failed not_charged, paid by the retry.
      const charged = t.payments.charges.filter((c) => payments.some((p) => p.id === c.idempotencyKey) && c.status === 'succeeded');
      expect(charged).toHaveLength(1);
      expect(payments.map((p) => [p.status, p.failure_reason]).sort()).toEqual(point === 'before_charge' ? [['failed', 'not_charged'], ['succeeded', null]] : [['succeeded', null]]);
    });
  });

  describe('renewal', () => {
    async function dueSubscription() {
      const plan = await createPlan(t, { name: 'Monthly', period_amount: '10', included_credit: '10', billing_interval: 'month' });
      const c = await createCustomer(t);
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId);
      const res = await subscribe(t, c.customerId, plan.plan_id);
      expect(res.statusCode, res.body).toBe(201);
      const sub = res.json().subscription;
      const cycleEnd = new Date(sub.cycle_end_at);
      return { ...c, subscriptionId: sub.subscription_id as string, cycleEnd };
    }
    const renewalsOf = (subscriptionId: string) => t.storage.db.selectFrom('payments').selectAll().where('purpose', '=', 'renewal').where('reference', 'like', `${subscriptionId}:%`).execute();

    it.each(FAULTS)('%s ends with the period renewed once', async (_name, point, error) => {
      const { subscriptionId, cycleEnd } = await dueSubscription();
      inject(point, error());
      const at = new Date(cycleEnd.getTime() + 1000);
      await renewDueSubscriptions(deps(), at);
      // The claim or the provider retry lapses; the engine and the reconciliation both run.
      const later = new Date(at.getTime() + RECONCILE_AFTER_MS + 1);
      await renewDueSubscriptions(deps(), later);
      await reconcileLater(later);
      const sub = await t.storage.db.selectFrom('subscriptions').selectAll().where('id', '=', subscriptionId).executeTakeFirstOrThrow();
      expect(sub.status).toBe('active');
      expect(new Date(sub.cycle_start_at).getTime()).toBe(cycleEnd.getTime());
      const succeeded = (await renewalsOf(subscriptionId)).filter((p) => p.status === 'succeeded');
      expect(succeeded).toHaveLength(2); // the first period and this renewal
    });

    it('a renewal charged while its subscription was cancelled is refunded, not credited', async () => {
      const { subscriptionId, cycleEnd } = await dueSubscription();
      inject('after_charge', crash());
      await renewDueSubscriptions(deps(), new Date(cycleEnd.getTime() + 1000));
      // The merchant cancels; the engine applies it once the claim lapses, before any retry.
      expect((await t.app.inject({ method: 'DELETE', url: `/v1/subscriptions/${subscriptionId}`, headers: t.auth() })).statusCode).toBe(200);
      await renewDueSubscriptions(deps(), new Date(cycleEnd.getTime() + RECONCILE_AFTER_MS));
      const report = await reconcileLater(new Date(cycleEnd.getTime() + RECONCILE_AFTER_MS));
      expect(report.refunded).toBe(1);
      expect((await renewalsOf(subscriptionId)).filter((p) => p.failure_reason === 'cycle_closed')).toEqual([expect.objectContaining({ status: 'succeeded' })]);
    });
  });

  describe('auto top-up', () => {
    async function subscribedWithBundle() {
      const plan = await createPlan(t, { name: 'Zero credit', period_amount: '0', included_credit: '0', billing_interval: 'month', credit_bundles: [{ name: 'Refill', cost: '4', credit_amount: '5' }], default_auto_top_up_bundle_index: 0 });
      const c = await createCustomer(t);
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId);
      expect((await subscribe(t, c.customerId, plan.plan_id)).statusCode).toBe(201);
      return c;
    }

    it.each(FAULTS)('%s ends with the bundle credited once, or bought anew', async (_name, point, error) => {
      const { walletId } = await subscribedWithBundle();
      inject(point, error());
      const first = await topUpIfShort(deps(), walletId, parseMoney('1'), dateOf(t.clock)).catch((e: Error) => e);
      expect(first).not.toBe('bought');
      await reconcileLater();
      if ((await walletBuckets(t.storage, walletId)).bundle === 0n) expect(await topUpIfShort(deps(), walletId, parseMoney('1'), dateOf(t.clock))).toBe('bought');
      expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('5'));
    });
  });
});
