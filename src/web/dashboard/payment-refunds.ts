import type { FastifyInstance } from 'fastify';
import { refundPayment } from '../../commerce/refunds.ts';
import type { AppDeps } from '../../app-deps.ts';
import { findMerchantPayment, refundedAmounts } from '../../storage/payments.ts';
import { formatsFor } from '../format.ts';
import { html } from '../html.ts';
import { assertCsrf, WebError } from '../session.ts';
import { confirmLink, sendConfirmPage } from './confirm.ts';
import { merchantOf, sendDashboardPage } from './shell.ts';

/**
 * The Refund step of a payment on the Payments page: a confirmation page, then the refund of as
 * much as the customer's unspent credit allows, through the payment provider (decision 0038). A
 * partial refund is the API's or the CLI's (`amount`).
 */
export function refundLink(payment: { id: string; status: string }) {
  if (payment.status !== 'succeeded') return '';
  return confirmLink(`/dashboard/payments/${encodeURIComponent(payment.id)}/refund`, 'Refund', `Refund payment ${payment.id}`, true);
}

export function registerPaymentRefundPages(app: FastifyInstance, deps: AppDeps): void {
  app.get<{ Params: { id: string } }>('/dashboard/payments/:id/refund', async (request, reply) => {
    const payment = await findMerchantPayment(deps.storage.db, merchantOf(request), request.params.id);
    if (!payment) throw new WebError(404, `No payment with id ${request.params.id}.`);
    const fmt = formatsFor(deps.config.currency);
    const refunded = (await refundedAmounts(deps.storage.db, [payment.id])).get(payment.id) ?? 0n;
    return sendConfirmPage(request, reply, '/dashboard/payments', {
      question: `Refund the ${fmt.money(BigInt(payment.amount))} payment of ${payment.created_at.slice(0, 10)}?`,
      consequence: html`Of its ${fmt.money(BigInt(payment.amount))}, ${fmt.money(BigInt(payment.amount) - refunded)} is not yet refunded. As much of that as the customer's unspent credit allows goes back to the customer through the payment provider, and that credit is taken out of their wallet. This cannot be undone.`,
      action: `/dashboard/payments/${encodeURIComponent(payment.id)}/refund`,
      confirmLabel: 'Refund the payment',
      back: '/dashboard/payments',
    });
  });

  app.post<{ Params: { id: string } }>('/dashboard/payments/:id/refund', async (request, reply) => {
    assertCsrf(request);
    const result = await refundPayment(deps, { merchantId: merchantOf(request), paymentId: request.params.id });
    if (!result.ok && result.reason === 'not_found') throw new WebError(404, `No payment with id ${request.params.id}.`);
    const fmt = formatsFor(deps.config.currency);
    const message = !result.ok
      ? result.message
      : result.refund.status === 'failed'
        ? `The payment provider refused the refund (${result.refund.failure_reason ?? 'no reason given'}); the credit was put back.`
        : `${fmt.money(BigInt(result.refund.amount))} ${result.refund.status === 'pending' ? 'will be refunded once the payment provider answers' : 'was refunded'}; ${fmt.money(BigInt(result.refund.credit_amount))} of credit was taken back.`;
    return sendDashboardPage(request, reply, '/dashboard/payments', {
      title: 'Refund',
      status: !result.ok ? 409 : result.refund.status === 'failed' ? 402 : 200,
      main: html`<h1>Refund</h1>
<p class="notice" role="status" id="refund-message">${message}</p>
<p><a class="button secondary" href="/dashboard/payments">Back to payments</a></p>`,
    });
  });
}
