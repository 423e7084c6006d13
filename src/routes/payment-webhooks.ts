import { dateOf } from '../domain/clock.ts';
import { z } from 'zod';
import { processProviderEvent } from '../commerce/provider-events.ts';
import type { PurchaseDeps } from '../commerce/subscriptions.ts';
import { ApiError } from '../http/errors.ts';
import { stripeSignatureHeaderProblem } from '../payments/stripe.ts';
import { errorResponse } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import { presentCustomer } from '../services/customers.ts';

/**
 * The largest delivery read. Stripe documents no byte limit for an event; a PaymentIntent or
 * Checkout Session event, the kinds this route acts on, is a few KB (a Checkout Session of one line
 * item, metadata at most 50 pairs of 500 characters, about 40 KB), so 512 KiB leaves ample room and keeps what an unauthenticated caller can make the
 * process hold small.
 */
export const MAX_EVENT_BYTES = 512 * 1024;

const receivedSchema = z.object({
  received: z.literal(true),
  result: z.enum(['duplicate', 'ignored', 'credited', 'failed', 'unchanged']).describe('What the event changed: `duplicate` when its id was processed before'),
});

/**
 * `POST /v1/payments/stripe/webhook`: Stripe's events about our PaymentIntents and Checkout Sessions, registered only
 * when Stripe is the payment provider. No API key: the `Stripe-Signature` header, checked by the
 * `stripe` package against STRIPE_WEBHOOK_SECRET over the raw body, is the credential. Registered
 * in its own scope because the signature covers the bytes as sent, so the body is not parsed.
 */
export function registerPaymentWebhookRoutes(app: App, deps: PurchaseDeps): void {
  const { payments } = deps;
  if (payments.id !== 'stripe' || !payments.verifyEvent) return;
  const verify = payments.verifyEvent.bind(payments);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: MAX_EVENT_BYTES }, (_request, body, done) => done(null, body));
  // Before the body is read (onRequest runs before parsing): a delivery without a well-formed,
  // current signature header cannot be Stripe's, so its upload is never taken.
  app.addHook('onRequest', async (request) => {
    const signature = request.headers['stripe-signature'];
    const problem = stripeSignatureHeaderProblem(typeof signature === 'string' ? signature : undefined, deps.clock.now());
    if (problem) throw new ApiError('webhook_signature_invalid', problem);
  });

  app.post(
    '/payments/stripe/webhook',
    {
      config: { public: true },
      bodyLimit: MAX_EVENT_BYTES,
      schema: {
        tags: ['payments'],
        security: [],
        summary: "Stripe's webhook events (configure this URL in Stripe with the events payment_intent.*, checkout.session.completed and checkout.session.expired)",
        description:
          'The Stripe-Signature header is checked before the body is read: its timestamp must be within 5 minutes of now, either way. Bodies over 512 KiB are refused (413 payload_too_large).',
        headers: z.object({ 'stripe-signature': z.string().optional() }),
        response: {
          200: receivedSchema,
          400: errorResponse('`webhook_signature_invalid`: the Stripe-Signature header is missing or does not match the body'),
        },
      },
    },
    async (request) => {
      const raw = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
      const signature = request.headers['stripe-signature'];
      let event;
      try {
        event = verify(raw, typeof signature === 'string' ? signature : undefined, deps.clock.now());
      } catch (e) {
        throw new ApiError('webhook_signature_invalid', e instanceof Error ? e.message : undefined);
      }
      const result = await processProviderEvent(deps, event, (row) => presentCustomer(row, dateOf(deps.clock)));
      return { received: true as const, result };
    },
  );
}
