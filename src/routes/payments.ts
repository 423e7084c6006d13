import { z } from 'zod';
import { presentPayment, presentRefund, refundPayment, type RefundResult } from '../commerce/refunds.ts';
import type { CommerceDeps } from '../commerce/subscriptions.ts';
import { parseMoney } from '../domain/money.ts';
import { principalOf } from '../http/auth.ts';
import { ApiError, notFound } from '../http/errors.ts';
import { assertCursor, pageQuery, pageResponse } from '../http/pagination.ts';
import { errorResponse, idParams, optionalBody, positiveDecimal, standardErrors } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import { merchantHasRow } from '../storage/pages.ts';
import { listPayments } from '../storage/payment-reports.ts';
import { findMerchantPayment, refundedAmounts, refundsOf } from '../storage/payments.ts';

const tags = ['payments'];
const PURPOSES = ['checkout', 'renewal', 'auto_top_up'] as const;
const STATUSES = ['pending', 'requires_action', 'succeeded', 'failed'] as const;

const paymentSchema = z.object({
  payment_id: z.string(),
  customer_id: z.string().nullable(),
  purpose: z.enum(PURPOSES),
  amount: z.string(),
  amount_refunded: z.string().describe('What its refunds that were not refused add up to (pending ones included)'),
  status: z.enum(STATUSES),
  failure_reason: z.string().nullable().describe('Why it failed; on a succeeded payment, `session_closed` or `cycle_closed`: paid but never credited (it is refunded)'),
  provider: z.string(),
  provider_ref: z.string().nullable(),
  created_at: z.string(),
  updated_at: z.string(),
});

const refundSchema = z.object({
  refund_id: z.string(),
  payment_id: z.string(),
  amount: z.string().describe('The money given back'),
  credit_amount: z.string().describe('The credit taken back from the wallet for it'),
  status: z.enum(['pending', 'succeeded', 'failed']).describe('`pending`: the payment provider has not answered yet; it is asked again'),
  reason: z.string().nullable(),
  failure_reason: z.string().nullable(),
  provider_ref: z.string().nullable(),
  created_at: z.string(),
  updated_at: z.string(),
});

const listQuery = pageQuery.extend({ purpose: z.enum(PURPOSES).optional(), status: z.enum(STATUSES).optional() });

const refundBody = optionalBody(
  z.object({
    amount: positiveDecimal.optional().describe('The money to give back; by default as much as can be (see the decision on refunds)'),
    reason: z.string().trim().min(1).max(500).optional(),
  }),
);

/**
 * The merchant's payments (checkout, renewals, auto top-ups) and their refunds. A refund goes
 * through the payment provider and takes back the credit the payment gave, at most what the
 * customer has not spent (decision 0038).
 */
export function registerPaymentRoutes(app: App, deps: CommerceDeps): void {
  const { storage } = deps;

  app.get('/payments', { schema: { tags, querystring: listQuery, response: { 200: pageResponse(paymentSchema), ...standardErrors } } }, async (request) => {
    const { merchantId } = principalOf(request);
    const { cursor, limit, purpose, status } = request.query;
    await assertCursor(cursor, (id) => merchantHasRow(storage, 'payments', merchantId, id));
    const rows = await listPayments(storage, merchantId, { ...(purpose ? { purpose } : {}), ...(status ? { status } : {}) }, { cursor, limit });
    const shown = rows.slice(0, limit);
    const ids = shown.map((r) => r.id);
    const [full, refunded] = await Promise.all([
      ids.length === 0 ? [] : storage.db.selectFrom('payments').selectAll().where('merchant_id', '=', merchantId).where('id', 'in', ids).orderBy('id', 'desc').execute(),
      refundedAmounts(storage.db, ids),
    ]);
    const hasMore = rows.length > limit;
    return {
      data: full.map((p) => presentPayment(p, refunded.get(p.id) ?? 0n)),
      has_more: hasMore,
      next_cursor: hasMore ? (ids[ids.length - 1] ?? null) : null,
    };
  });

  app.get(
    '/payments/:id',
    { schema: { tags, params: idParams, response: { 200: paymentSchema.extend({ refunds: z.array(refundSchema) }), ...standardErrors } } },
    async (request) => {
      const payment = await findMerchantPayment(storage.db, principalOf(request).merchantId, request.params.id);
      if (!payment) throw notFound('payment', request.params.id);
      const refunds = await refundsOf(storage.db, payment.id);
      const refunded = refunds.filter((r) => r.status !== 'failed').reduce((sum, r) => sum + BigInt(r.amount), 0n);
      return { ...presentPayment(payment, refunded), refunds: refunds.map(presentRefund) };
    },
  );

  app.post(
    '/payments/:id/refund',
    {
      schema: {
        tags,
        params: idParams,
        body: refundBody,
        response: {
          201: z.object({ refund: refundSchema, payment: paymentSchema }).describe('The provider accepted the refund'),
          202: z.object({ refund: refundSchema, payment: paymentSchema }).describe('Recorded; the provider has not answered yet and is asked again (the credit is already taken back)'),
          ...standardErrors,
          402: errorResponse('`refund_failed`: the payment provider refused the refund; the credit is put back'),
          409: errorResponse('`payment_not_refundable` (not succeeded, or a plan period paid before payments named their credit) or `refund_exceeds_unspent_credit`'),
        },
      },
    },
    async (request, reply) => {
      const { merchantId } = principalOf(request);
      const body = request.body ?? {};
      const result = await refundPayment(deps, {
        merchantId,
        paymentId: request.params.id,
        ...(body.amount ? { amount: parseMoney(body.amount) } : {}),
        reason: body.reason ?? null,
      });
      if (!result.ok) throw refusal(result, request.params.id);
      if (result.refund.status === 'failed') throw new ApiError('refund_failed', `The payment provider refused the refund: ${result.refund.failure_reason ?? 'no reason given'}.`);
      const refunded = (await refundedAmounts(storage.db, [result.payment.id])).get(result.payment.id) ?? 0n;
      return reply.status(result.refund.status === 'pending' ? 202 : 201).send({ refund: presentRefund(result.refund), payment: presentPayment(result.payment, refunded) });
    },
  );
}

function refusal(result: Extract<RefundResult, { ok: false }>, paymentId: string): ApiError {
  if (result.reason === 'not_found') return notFound('payment', paymentId);
  if (result.reason === 'not_refundable') return new ApiError('payment_not_refundable', result.message);
  return new ApiError('refund_exceeds_unspent_credit', result.message);
}
