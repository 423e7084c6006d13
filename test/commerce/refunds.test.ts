import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { reconcilePayments, REFUND_RETRY_MS } from '../../src/commerce/reconciliation.ts';
import { renewDueSubscriptions } from '../../src/commerce/renewals.ts';
import { refundPayment } from '../../src/commerce/refunds.ts';
import { CommerceState } from '../../src/commerce/state.ts';
import type { PurchaseDeps } from '../../src/commerce/subscriptions.ts';
import { dateOf } from '../../src/domain/clock.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { ProviderUnavailableError, type PaymentProvider } from '../../src/payments/types.ts';
import { presentCustomer } from '../../src/services/customers.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, eventsOfType, openCheckoutSession, payCheckoutSession, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('refunds on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());
  afterEach(async () => {
    t.payments.clearFaults();
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const deps = (payments: PaymentProvider = t.payments): PurchaseDeps => ({ storage: t.storage, payments, clock: t.clock, commerceState: new CommerceState() });
  const refund = (paymentId: string, payload?: Record<string, unknown>, key?: string) =>
    t.app.inject({ method: 'POST', url: `/v1/payments/${paymentId}/refund`, headers: t.auth(key), ...(payload ? { payload } : {}) });

  /** A customer with a meter at 0.25 a request whose wallet a paid top-up of 20 funded; the payment's id. */
  async function paidTopUp() {
    const c = await t.customerWithMeter({});
    const session = await openCheckoutSession(t, c.customerId);
    expect(await payCheckoutSession(t, deps(), session.id, '20')).toMatchObject({ status: 'completed' });
    const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', '=', session.id).executeTakeFirstOrThrow();
    return { ...c, paymentId: payment.id };
  }
  const spend = async (customerId: string, meterSlug: string, times: number) => {
    for (let i = 0; i < times; i++) {
      const res = await t.app.inject({ method: 'POST', url: '/v1/requests', headers: t.auth(), payload: { request_id: `r-${customerId}-${i}`, customer_id: customerId, meter_slug: meterSlug } });
      expect(res.statusCode, res.body).toBe(201);
    }
  };

  it('lists the payment, refunds part of it through the provider, takes the credit back and announces it', async () => {
    const { walletId, paymentId } = await paidTopUp();
    const list = await t.app.inject({ method: 'GET', url: '/v1/payments?purpose=checkout&limit=100', headers: t.auth() });
    expect(list.statusCode).toBe(200);
    expect(list.json().data).toContainEqual(expect.objectContaining({ payment_id: paymentId, amount: '20.0000000000', amount_refunded: '0.0000000000', status: 'succeeded' }));

    const res = await refund(paymentId, { amount: '5', reason: 'Customer asked' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({
      refund: { payment_id: paymentId, amount: '5.0000000000', credit_amount: '5.0000000000', status: 'succeeded', reason: 'Customer asked' },
      payment: { payment_id: paymentId, amount_refunded: '5.0000000000' },
    });
    expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('15'));
    expect(t.payments.refunds.at(-1)).toMatchObject({ amount: parseMoney('5'), idempotencyKey: res.json().refund.refund_id });
    const events = (await eventsOfType(t.storage, 'payment.refunded')).filter((e) => (e.data as { payment_id: string }).payment_id === paymentId);
    expect(events).toEqual([expect.objectContaining({ data: expect.objectContaining({ refund_id: res.json().refund.refund_id, amount: '5.0000000000' }) })]);

    const one = await t.app.inject({ method: 'GET', url: `/v1/payments/${paymentId}`, headers: t.auth() });
    expect(one.json()).toMatchObject({ payment_id: paymentId, amount_refunded: '5.0000000000', refunds: [expect.objectContaining({ status: 'succeeded' })] });
  });

  it('takes back at most the credit the customer has not spent: the default amount is what is left, and more is refused', async () => {
    const { customerId, walletId, meterSlug, paymentId } = await paidTopUp();
    await spend(customerId, meterSlug, 20); // 5 of the 20 spent
    const tooMuch = await refund(paymentId, { amount: '16' });
    expect(tooMuch.statusCode).toBe(409);
    expect(tooMuch.json().error).toMatchObject({ code: 'refund_exceeds_unspent_credit' });
    expect(tooMuch.json().error.message).toContain('15.0000000000');
    const rest = await refund(paymentId);
    expect(rest.statusCode, rest.body).toBe(201);
    expect(rest.json().refund).toMatchObject({ amount: '15.0000000000', credit_amount: '15.0000000000' });
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
    const again = await refund(paymentId);
    expect(again.statusCode).toBe(409);
  });

  it('a bundle refund takes back bundle credit in proportion to the money returned', async () => {
    const plan = await createPlan(t, { name: 'Bundles', period_amount: '0', billing_interval: 'month', credit_bundles: [{ name: 'Pack', cost: '4', credit_amount: '5' }] });
    const { customerId, walletId } = await createCustomer(t);
    expect((await subscribe(t, customerId, plan.plan_id)).statusCode).toBe(201);
    const session = await openCheckoutSession(t, customerId, plan.credit_bundles[0].credit_bundle_id);
    expect(await payCheckoutSession(t, deps(), session.id)).toMatchObject({ status: 'completed' });
    const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', '=', session.id).executeTakeFirstOrThrow();
    const res = await refund(payment.id, { amount: '2' });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().refund).toMatchObject({ amount: '2.0000000000', credit_amount: '2.5000000000' });
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(parseMoney('2.5'));
    expect((await refund(payment.id)).json().refund).toMatchObject({ amount: '2.0000000000', credit_amount: '2.5000000000' });
    expect((await walletBuckets(t.storage, walletId)).bundle).toBe(0n);
  });

  it('a refund the provider did not answer is 202, keeps its credit taken back, and the reconciliation completes it under the same key', async () => {
    const { walletId, paymentId } = await paidTopUp();
    t.payments.failOnce('before_refund', new ProviderUnavailableError('test', new Error('no answer')));
    const res = await refund(paymentId, { amount: '3' });
    expect(res.statusCode, res.body).toBe(202);
    expect(res.json().refund.status).toBe('pending');
    expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('17'));
    t.clock.advance(REFUND_RETRY_MS + 1);
    const report = await reconcilePayments(deps(), (row) => presentCustomer(row, dateOf(t.clock)), dateOf(t.clock));
    expect(report.refundsRetried).toBe(1);
    const one = (await t.app.inject({ method: 'GET', url: `/v1/payments/${paymentId}`, headers: t.auth() })).json();
    expect(one.refunds).toEqual([expect.objectContaining({ status: 'succeeded', amount: '3.0000000000' })]);
    expect(t.payments.refunds.filter((r) => r.idempotencyKey === res.json().refund.refund_id)).toHaveLength(1);
  });

  it('a refund the provider refuses is recorded failed and its credit put back', async () => {
    const { walletId, paymentId } = await paidTopUp();
    const refusing: PaymentProvider = Object.assign(Object.create(t.payments) as PaymentProvider, {
      refund: async () => ({ status: 'failed' as const, providerRef: null, reason: 'The card account is closed.' }),
    });
    const result = await refundPayment(deps(refusing), { merchantId: t.merchant.merchantId, paymentId, amount: parseMoney('4') });
    expect(result).toMatchObject({ ok: true, refund: { status: 'failed', failure_reason: 'The card account is closed.' } });
    expect((await walletBuckets(t.storage, walletId)).prepaid).toBe(parseMoney('20'));
    const one = (await t.app.inject({ method: 'GET', url: `/v1/payments/${paymentId}`, headers: t.auth() })).json();
    expect(one.amount_refunded).toBe('0.0000000000');
  });

  it("refuses another merchant's payment, a bad amount, and a plan period paid before payments named their credit", async () => {
    const plan = await createPlan(t, { name: 'Paid', period_amount: '10', billing_interval: 'month' });
    const { customerId } = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, customerId);
    expect((await subscribe(t, customerId, plan.plan_id)).statusCode).toBe(201);
    const period = await t.storage.db.selectFrom('payments').selectAll().where('connection_id', '=', customerId).executeTakeFirstOrThrow();
    await t.storage.db.updateTable('payments').set({ credit_reference: null }).where('id', '=', period.id).execute();
    const unlinked = await refund(period.id);
    expect(unlinked.statusCode).toBe(409);
    expect(unlinked.json().error.code).toBe('payment_not_refundable');

    const { paymentId } = await paidTopUp();
    const other = await t.newMerchant();
    expect((await refund(paymentId, {}, other.secretKey)).statusCode).toBe(404);
    expect((await t.app.inject({ method: 'GET', url: `/v1/payments/${paymentId}`, headers: t.auth(other.secretKey) })).statusCode).toBe(404);
    const bad = await refund(paymentId, { amount: '-1' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.issues[0].path).toEqual(['amount']);
  });

  describe("a plan period's payment", () => {
    /** A customer with a meter at 0.25 a request, subscribed by POST to a plan of 10 a month granting `credit` of cycle credit (linked to the meter). */
    async function subscribedByApi(credit: string) {
      const c = await t.customerWithMeter({});
      const plan = await createPlan(t, { name: `Plan ${credit}`, period_amount: '10', included_credit: credit, billing_interval: 'month', meter_ids: [c.meterId] });
      await saveTestCard(t.storage, t.merchant.merchantId, c.customerId);
      const res = await subscribe(t, c.customerId, plan.plan_id);
      expect(res.statusCode, res.body).toBe(201);
      const sub = res.json().subscription;
      const periodPayment = () => t.storage.db.selectFrom('payments').selectAll().where('connection_id', '=', c.customerId).where('purpose', '=', 'renewal').orderBy('created_at').orderBy('id').execute();
      return { ...c, plan, sub, periodPayment };
    }
    const subscriptionOf = async (subscriptionId: string) => t.storage.db.selectFrom('subscriptions').selectAll().where('id', '=', subscriptionId).executeTakeFirstOrThrow();
    const cancelledEvents = async (subscriptionId: string) => (await eventsOfType(t.storage, 'subscription.cancelled')).filter((e) => e.data.subscription_id === subscriptionId);

    it('a partial refund takes back cycle credit in proportion (10 paid for 20 of credit: 2 per unit) and leaves the subscription running', async () => {
      const { walletId, sub, periodPayment } = await subscribedByApi('20');
      const [payment] = await periodPayment();
      expect(payment).toMatchObject({ status: 'succeeded', credit_reference: `${sub.subscription_id}:${sub.cycle_start_at}` });
      const res = await refund(payment!.id, { amount: '4', reason: 'Partly unhappy' });
      expect(res.statusCode, res.body).toBe(201);
      expect(res.json().refund).toMatchObject({ amount: '4.0000000000', credit_amount: '8.0000000000', status: 'succeeded' });
      expect(await walletBuckets(t.storage, walletId)).toMatchObject({ cycle: parseMoney('12'), prepaid: 0n });
      expect(t.payments.refunds.at(-1)).toMatchObject({ amount: parseMoney('4'), paymentRef: payment!.provider_ref });
      expect((await subscriptionOf(sub.subscription_id)).status).toBe('active');
      const events = (await eventsOfType(t.storage, 'payment.refunded')).filter((e) => e.data.payment_id === payment!.id);
      expect(events).toEqual([expect.objectContaining({ data: expect.objectContaining({ amount: '4.0000000000', credit_amount: '8.0000000000', payment: expect.objectContaining({ purpose: 'renewal', amount_refunded: '4.0000000000' }) }) })]);
      expect(await cancelledEvents(sub.subscription_id)).toEqual([]);
    });

    it('refunds at most what the unspent cycle credit pays back; the rest of it, in full, ends the subscription it paid for at once', async () => {
      const { customerId, meterSlug, walletId, sub, periodPayment } = await subscribedByApi('10');
      const [payment] = await periodPayment();
      await spend(customerId, meterSlug, 8); // 2 of the 10 of cycle credit spent
      const tooMuch = await refund(payment!.id, { amount: '8.01' });
      expect(tooMuch.statusCode).toBe(409);
      expect(tooMuch.json().error).toMatchObject({ code: 'refund_exceeds_unspent_credit' });
      expect(tooMuch.json().error.message).toContain('8.0000000000');
      expect((await subscriptionOf(sub.subscription_id)).status).toBe('active');

      const rest = await refund(payment!.id);
      expect(rest.statusCode, rest.body).toBe(201);
      expect(rest.json().refund).toMatchObject({ amount: '8.0000000000', credit_amount: '8.0000000000' });
      // Not all of the payment went back (2 of it paid for credit spent): the subscription runs on.
      expect((await subscriptionOf(sub.subscription_id)).status).toBe('active');
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(0n);
      expect((await refund(payment!.id)).statusCode).toBe(409);
    });

    it("a full refund of the current cycle's payment ends the subscription (subscription.cancelled, reason payment_refunded) and nothing renews it", async () => {
      const { walletId, sub, periodPayment } = await subscribedByApi('10');
      const [payment] = await periodPayment();
      const res = await refund(payment!.id);
      expect(res.statusCode, res.body).toBe(201);
      expect(res.json().refund).toMatchObject({ amount: '10.0000000000', credit_amount: '10.0000000000' });
      expect(await subscriptionOf(sub.subscription_id)).toMatchObject({ status: 'cancelled', cancelled_at: expect.any(String) });
      expect((await cancelledEvents(sub.subscription_id)).map((e) => e.data.reason)).toEqual(['payment_refunded']);
      expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
      const results = await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, new Date(new Date(sub.cycle_end_at).getTime() + 1000));
      expect(results.filter((r) => r.subscriptionId === sub.subscription_id)).toEqual([]);
      expect(await periodPayment()).toHaveLength(1);
    });

    it("a full refund of an earlier cycle's payment takes its share of the cycle credit and leaves the renewed subscription running", async () => {
      const { walletId, sub, periodPayment } = await subscribedByApi('10');
      // Renewed a month later (plan rollover: the first cycle's credit stays in the bucket).
      const renewedAt = new Date(new Date(sub.cycle_end_at).getTime() + 1000);
      await renewDueSubscriptions({ storage: t.storage, payments: t.payments, clock: t.clock }, renewedAt);
      const [first, renewal] = await periodPayment();
      expect(renewal).toMatchObject({ status: 'succeeded', credit_reference: `${sub.subscription_id}:${sub.cycle_end_at}` });
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(parseMoney('20'));
      const res = await refund(first!.id);
      expect(res.statusCode, res.body).toBe(201);
      expect(res.json().refund).toMatchObject({ amount: '10.0000000000', credit_amount: '10.0000000000' });
      expect((await subscriptionOf(sub.subscription_id)).status).toBe('active');
      expect(await cancelledEvents(sub.subscription_id)).toEqual([]);
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(parseMoney('10'));
    });

    it("an upgrade's payment by checkout is refunded against the new plan's credit it granted", async () => {
      const free = await createPlan(t, { name: 'Free tier', period_amount: '0', included_credit: '1', billing_interval: 'month' });
      const pro = await createPlan(t, { name: 'Pro tier', period_amount: '20', included_credit: '25', billing_interval: 'month' });
      const { customerId, walletId } = await createCustomer(t);
      expect((await subscribe(t, customerId, free.plan_id)).statusCode).toBe(201);
      const created = await t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload: { checkout_mode: 'subscription', origin_url: 'https://shop.example.com/', customer_id: customerId, plan_id: pro.plan_id } });
      expect(created.statusCode, created.body).toBe(201);
      expect(await payCheckoutSession(t, deps(), created.json().checkout_session_id)).toMatchObject({ status: 'completed' });
      const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', '=', created.json().checkout_session_id).executeTakeFirstOrThrow();
      expect(payment.credit_reference).toMatch(/:upgrade:/);
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(parseMoney('26'));
      const res = await refund(payment.id, { amount: '4' });
      expect(res.statusCode, res.body).toBe(201);
      expect(res.json().refund).toMatchObject({ amount: '4.0000000000', credit_amount: '5.0000000000' });
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(parseMoney('21'));
    });

    it('a refund the provider refuses puts the cycle credit back and leaves the subscription as it was', async () => {
      const { walletId, sub, periodPayment } = await subscribedByApi('10');
      const [payment] = await periodPayment();
      const refusing: PaymentProvider = Object.assign(Object.create(t.payments) as PaymentProvider, {
        refund: async () => ({ status: 'failed' as const, providerRef: null, reason: 'The card account is closed.' }),
      });
      const result = await refundPayment(deps(refusing), { merchantId: t.merchant.merchantId, paymentId: payment!.id });
      expect(result).toMatchObject({ ok: true, refund: { status: 'failed', bucket: 'cycle' } });
      expect((await walletBuckets(t.storage, walletId)).cycle).toBe(parseMoney('10'));
      expect((await subscriptionOf(sub.subscription_id)).status).toBe('active');
    });
  });
});
