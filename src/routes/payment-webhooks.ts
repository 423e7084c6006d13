import { z } from 'zod';
import { processProviderEvent } from '../commerce/provider-events.ts';
import type { PurchaseDeps } from '../commerce/subscriptions.ts';
import { ApiError } from '../http/errors.ts';
import { errorResponse } from '../http/schemas.ts';
import type { App } from '../http/types.ts';
import { presentCustomer } from './customers.ts';

const MAX_EVENT_BYTES = 1024 * 1024;

const receivedSchema = z.object({
  received: z.literal(true),
  result: z.enum(['duplicate', 'ignored', 'credited', 'failed', 'unchanged']).describe('What the event changed: `duplicate` when its id was processed before'),
});

/**
 * `POST /v1/payments/stripe/webhook`: Stripe's events about our PaymentIntents, registered only
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

  app.post(
    '/payments/stripe/webhook',
    {
      config: { public: true },
      schema: {
        tags: ['payments'],
        security: [],
        summary: "Stripe's webhook events (configure this URL in Stripe with the events payment_intent.*)",
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
      const result = await processProviderEvent(deps, event, (row) => presentCustomer(row));
      return { received: true as const, result };
    },
  );
}
