import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { insertRefund } from '../../src/storage/payments.ts';
import { createPlan, saveTestCard, subscribe } from '../helpers/commerce.ts';
import { exactText, signedInDashboard, tableValues, type DashboardSession } from '../helpers/dashboard.ts';

/**
 * The payments page in real Chromium against what the database holds: every payment listed with
 * its customer, kind, status and exact amount; revenue as received payments plus the usage fees
 * GET /v1/usage reports for the same days; monthly recurring revenue from a monthly and a yearly
 * plan; the merchant's own wallet.
 */
describe('dashboard payments and revenue (Chromium)', () => {
  let d: DashboardSession;
  const customers: Record<string, string> = {};

  beforeAll(async () => {
    d = await signedInDashboard('payments@shop.example');
    const monthly = await createPlan(d.t, { name: 'Pro', period_amount: '20', billing_interval: 'month' }, d.secretKey);
    const yearly = await createPlan(d.t, { name: 'Annual', period_amount: '120', billing_interval: 'year' }, d.secretKey);
    for (const [key, email, card, plan] of [
      ['ada', 'ada@example.com', 'succeeds', monthly.plan_id],
      ['bob', 'bob@example.com', 'succeeds', yearly.plan_id],
      ['cy', 'cy@example.com', 'declined', monthly.plan_id],
    ] as const) {
      const customer = (await d.api('POST', '/v1/customers', { email })).body;
      customers[key] = customer.customer_id;
      await saveTestCard(d.t.storage, d.merchantId, customer.customer_id, card);
      await subscribe(d.t, customer.customer_id, plan, d.secretKey);
    }
    const usage = await d.t.customerWithMeter({ credit: '50', secretKey: d.secretKey });
    const recorded = await d.api('POST', '/v1/requests', { request_id: 'paid-1', customer_id: usage.customerId, meter_slug: usage.meterSlug, input_tokens: 10, output_tokens: 5 });
    expect(recorded.status, JSON.stringify(recorded.body)).toBe(201);
    await d.t.settledRecord('paid-1', d.t.auth(d.secretKey));
    await creditWallet(d.t.storage, d.walletId, parseMoney('20'), new Date(d.t.clock.now()).toISOString());
    // A refund of 5 on Ada's payment, as the refund flow records it once the provider agreed.
    const adaPayment = await d.t.storage.db.selectFrom('payments').selectAll().where('connection_id', '=', customers.ada!).executeTakeFirstOrThrow();
    const at = new Date(d.t.clock.now()).toISOString();
    await insertRefund(d.t.storage.db, {
      id: 'rfd_dashboard_test', merchant_id: d.merchantId, payment_id: adaPayment.id, amount: parseMoney('5'), credit_amount: 0n, wallet_id: null, bucket: null,
      provider_ref: 're_test', status: 'succeeded', reason: null, failure_reason: null, created_at: at, updated_at: at,
    });
  });
  afterAll(async () => {
    await d?.close();
  });

  it('lists every payment with its customer by name, kind, status and exact amount', async () => {
    await d.visit('/dashboard/payments', 'payments');
    const stored = await d.t.storage.db.selectFrom('payments').selectAll().where('merchant_id', '=', d.merchantId).orderBy('id', 'desc').execute();
    expect(stored.length).toBeGreaterThanOrEqual(3);
    const rows = await tableValues(d.page, '#payments');
    expect(rows.map((r) => [r[4], r[3]!.split(' ')[0]])).toEqual(stored.map((p) => [formatUnits(BigInt(p.amount)), p.status]));
    const byCustomer = new Map(stored.map((p) => [p.connection_id, p]));
    expect(byCustomer.get(customers.cy!)?.status).toBe('failed');
    const link = d.page.locator(`#payment-${byCustomer.get(customers.ada!)!.id} td:nth-child(2) a`);
    expect(await exactText(d.page, `#payment-${byCustomer.get(customers.ada!)!.id} td:nth-child(6)`)).toBe('5.0000000000');
    expect(await link.textContent()).toBe('ada@example.com');
    expect(await link.getAttribute('title')).toBe(customers.ada);

    await d.visit('/dashboard/payments?status=failed', 'payments-failed');
    const failed = await tableValues(d.page, '#payments');
    expect(failed.map((r) => r[1])).toEqual(['cy@example.com']);
  });

  it('shows revenue as received payments less refunds plus usage fees, MRR, active subscriptions and the merchant wallet', async () => {
    await d.page.goto(`${d.base}/dashboard/payments`);
    const today = new Date(d.t.clock.now()).toISOString().slice(0, 10);
    const stored = await d.t.storage.db.selectFrom('payments').selectAll().where('merchant_id', '=', d.merchantId).where('status', '=', 'succeeded').execute();
    const paid = stored.reduce((sum, p) => sum + BigInt(p.amount), 0n);
    expect(paid).toBe(parseMoney('140'));
    const usage = (await d.api('GET', `/v1/usage?start=${today}&end=${today}`)).body.totals;
    expect(parseMoney(usage.total_fee_amount)).toBeGreaterThan(0n);
    expect(await exactText(d.page, '#revenue-payments')).toBe(formatUnits(paid));
    expect(await exactText(d.page, '#revenue-fees')).toBe(usage.total_fee_amount);
    expect(await exactText(d.page, '#revenue-refunds')).toContain('5.0000000000');
    expect(await exactText(d.page, '#revenue-total')).toContain(formatUnits(paid - parseMoney('5') + parseMoney(usage.total_fee_amount)));
    // 20 a month, and 120 a year is 10 a month; the declined subscription does not count.
    expect(await exactText(d.page, '#mrr')).toBe('30.0000000000');
    expect(await d.page.textContent('#mrr')).toBe('$30.00');
    expect(await d.page.textContent('#active-subscriptions')).toBe('2');
    expect(await exactText(d.page, '#merchant-wallet')).toBe('20.0000000000');
    const received = await tableValues(d.page, '#received');
    expect(received.slice(0, 3).reduce((n, r) => n + Number(r[1]), 0)).toBe(2);
    expect(received[3]).toEqual(['Refunds', '1', '-5.0000000000']);
  });
});

function formatUnits(units: bigint): string {
  const whole = units / 10_000_000_000n;
  const frac = (units % 10_000_000_000n).toString().padStart(10, '0');
  return `${whole}.${frac}`;
}
