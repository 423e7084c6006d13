import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { tollgate } from '../helpers/cli.ts';
import { CommerceState } from '../../src/commerce/state.ts';
import { createCustomer, openCheckoutSession, payCheckoutSession } from '../helpers/commerce.ts';

describe('tollgate plans, subscriptions and checkout (CLI over the API)', () => {
  let t: TestApp;
  let env: Record<string, string>;
  beforeAll(async () => {
    t = await startTestApp('sqlite');
    env = { TOLLGATE_API_URL: await t.listen(), TOLLGATE_SECRET_KEY: t.merchant.secretKey };
  });
  afterAll(async () => t?.close());

  it('creates and lists plans, lists and cancels subscriptions and creates a checkout, printing the API JSON with --json', async () => {
    const created = await tollgate(
      ['plans', 'create', '--name', 'CLI plan', '--period-amount', '0', '--billing-interval', 'month', '--included-credit', '2', '--bundle', 'Boost:5:6', '--json'],
      env,
    );
    expect(created.code, created.stderr).toBe(0);
    const plan = JSON.parse(created.stdout);
    const api = (await t.app.inject({ method: 'GET', url: `/v1/plans/${plan.plan_id}`, headers: t.auth() })).json();
    expect(plan).toEqual(api);
    expect(plan).toMatchObject({ included_credit: '2.0000000000', credit_bundles: [{ name: 'Boost', cost: '5.0000000000', credit_amount: '6.0000000000' }] });

    const listed = await tollgate(['plans', 'list'], env);
    expect(listed.stdout).toContain(`${plan.plan_id}  CLI plan  0.0000000000/month`);

    const { customerId } = await createCustomer(t);
    const sub = (await t.app.inject({ method: 'POST', url: '/v1/subscriptions', headers: t.auth(), payload: { customer_id: customerId, plan_id: plan.plan_id } })).json().subscription;
    const subs = JSON.parse((await tollgate(['subscriptions', 'list', '--customer', customerId, '--json'], env)).stdout);
    expect(subs.data.map((s: { subscription_id: string }) => s.subscription_id)).toEqual([sub.subscription_id]);
    const cancelled = await tollgate(['subscriptions', 'cancel', sub.subscription_id, '--json'], env);
    expect(JSON.parse(cancelled.stdout)).toEqual({ success: true });

    const checkout = await tollgate(['checkout', 'create', '--mode', 'topup', '--origin-url', 'https://shop.example.com', '--customer', customerId, '--json'], env);
    expect(checkout.code, checkout.stderr).toBe(0);
    expect(JSON.parse(checkout.stdout)).toMatchObject({ checkout_mode: 'topup', customer_id: customerId, checkout_session_token: expect.any(String) });

    const refused = await tollgate(['checkout', 'create', '--mode', 'topup', '--origin-url', 'https://shop.example.com'], env);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/connection_id.*\(validation_error\)/);
  });

  it('lists payments and refunds one, by an amount and then the rest', async () => {
    const { customerId } = await createCustomer(t);
    const session = await openCheckoutSession(t, customerId);
    await payCheckoutSession(t, { storage: t.storage, payments: t.payments, clock: t.clock, commerceState: new CommerceState() }, session.id, '12');
    const payments = JSON.parse((await tollgate(['payments', 'list', '--purpose', 'checkout', '--json'], env)).stdout);
    const payment = payments.data.find((p: { customer_id: string }) => p.customer_id === customerId);
    expect(payment).toMatchObject({ amount: '12.0000000000', status: 'succeeded' });
    const part = await tollgate(['payments', 'refund', payment.payment_id, '--amount', '2', '--reason', 'goodwill'], env);
    expect(part.code, part.stderr).toBe(0);
    expect(part.stdout).toMatch(/^Refund rfd_\S+ of 2\.0000000000 accepted \(credit taken back: 2\.0000000000\)\./);
    const rest = JSON.parse((await tollgate(['payments', 'refund', payment.payment_id, '--json'], env)).stdout);
    expect(rest.refund).toMatchObject({ amount: '10.0000000000', status: 'succeeded' });
    const listed = await tollgate(['payments', 'list', '--status', 'succeeded'], env);
    expect(listed.stdout).toContain(`${payment.payment_id}  ${customerId}  checkout  succeeded  12.0000000000  refunded 12.0000000000`);
    const none = await tollgate(['payments', 'refund', payment.payment_id], env);
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(/refund_exceeds_unspent_credit/);
  });
});
