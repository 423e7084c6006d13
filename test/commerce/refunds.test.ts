import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { reconcilePayments, REFUND_RETRY_MS } from '../../src/commerce/reconciliation.ts';
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

  it("refuses a plan period's payment, another merchant's payment and a bad amount", async () => {
    const plan = await createPlan(t, { name: 'Paid', period_amount: '10', billing_interval: 'month' });
    const { customerId } = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, customerId);
    expect((await subscribe(t, customerId, plan.plan_id)).statusCode).toBe(201);
    const period = await t.storage.db.selectFrom('payments').selectAll().where('connection_id', '=', customerId).executeTakeFirstOrThrow();
    const planRefund = await refund(period.id);
    expect(planRefund.statusCode).toBe(409);
    expect(planRefund.json().error.code).toBe('payment_not_refundable');

    const { paymentId } = await paidTopUp();
    const other = await t.newMerchant();
    expect((await refund(paymentId, {}, other.secretKey)).statusCode).toBe(404);
    expect((await t.app.inject({ method: 'GET', url: `/v1/payments/${paymentId}`, headers: t.auth(other.secretKey) })).statusCode).toBe(404);
    const bad = await refund(paymentId, { amount: '-1' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error.issues[0].path).toEqual(['amount']);
  });
});
