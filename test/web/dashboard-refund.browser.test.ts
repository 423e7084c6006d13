import { describe, expect, it } from 'vitest';
import { CommerceState } from '../../src/commerce/state.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { payCheckoutSession, walletBuckets } from '../helpers/commerce.ts';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

/** A refund from the Payments page in real Chromium: a confirmation first, then the provider's refund and the credit taken back. */
describe('dashboard refund (Chromium)', () => {
  const d = useSignedInDashboard('refunds@shop.example');

  it('refunds a paid top-up after a confirmation page, as far as the unspent credit allows', async () => {
    const customer = (await d.api('POST', '/v1/customers', { email: 'payer@example.com' })).body;
    const session = await d.api('POST', '/v1/checkout_sessions', { checkout_mode: 'topup', origin_url: 'https://shop.example.com/', customer_id: customer.customer_id });
    expect(session.status).toBe(201);
    const deps = { storage: d.t.storage, payments: d.t.payments, clock: d.t.clock, commerceState: new CommerceState() };
    expect(await payCheckoutSession(d.t, deps, session.body.checkout_session_id, '8')).toMatchObject({ status: 'completed' });
    const payment = (await d.api('GET', '/v1/payments')).body.data[0];

    await d.visit('/dashboard/payments', 'payments-refundable');
    await d.page.getByRole('link', { name: `Refund payment ${payment.payment_id}` }).click();
    await d.page.waitForURL((u) => u.pathname === `/dashboard/payments/${payment.payment_id}/refund`);
    expect((await d.api('GET', `/v1/payments/${payment.payment_id}`)).body.refunds).toEqual([]);
    await d.visit(`/dashboard/payments/${payment.payment_id}/refund`, 'payment-refund-confirm');
    await d.page.getByRole('button', { name: 'Refund the payment' }).click();
    await d.page.waitForSelector('#refund-message');
    expect(await d.page.textContent('#refund-message')).toContain('was refunded');
    const after = (await d.api('GET', `/v1/payments/${payment.payment_id}`)).body;
    expect(after).toMatchObject({ amount_refunded: '8.0000000000', refunds: [{ status: 'succeeded', credit_amount: '8.0000000000' }] });
    expect((await walletBuckets(d.t.storage, customer.wallet.wallet_id)).balance).toBe(0n);
    expect(d.t.payments.refunds.at(-1)?.amount).toBe(parseMoney('8'));
  });
});
