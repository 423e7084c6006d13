import type { FastifyInstance } from 'fastify';
import type { AppDeps } from '../../app-deps.ts';
import { loadSession } from '../session.ts';
import { registerAccountPages } from './account.ts';
import { registerAlertPages } from './alerts.ts';
import { registerCheckoutLinkPages } from './checkout-links.ts';
import { registerCustomerPages } from './customers.ts';
import { registerMeterPages } from './meters.ts';
import { registerOverviewPage } from './overview.ts';
import { registerPaymentPages } from './payments.ts';
import { registerUsagePages } from './usage.ts';
import { registerPaymentRefundPages } from './payment-refunds.ts';
import { registerRequestPages } from './requests.ts';
import { registerPlanPages } from './plans.ts';
import { registerSecretKeyPages } from './secret-keys.ts';
import { registerSpendKeyPages } from './spend-keys.ts';
import { registerSubscriptionPages } from './subscriptions.ts';
import { registerWebhookPages } from './webhooks.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The signed-in merchant of a dashboard page. */
    merchantId?: string;
  }
}

/** Pages under /dashboard that need a signed-in merchant; others go to sign-in and come back. */
export function registerDashboardRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.register(async (pages) => {
    pages.addHook('preHandler', async (request, reply) => {
      const session = await loadSession(deps, request);
      if (!session) {
        const next = request.method === 'GET' ? request.url : '/dashboard';
        return reply.redirect(`/dashboard/sign-in?next=${encodeURIComponent(next)}`, 303);
      }
      request.merchantId = session.merchantId;
    });
    registerOverviewPage(pages, deps);
    registerSecretKeyPages(pages, deps);
    registerRequestPages(pages, deps);
    registerMeterPages(pages, deps);
    registerCustomerPages(pages, deps);
    registerSpendKeyPages(pages, deps);
    registerWebhookPages(pages, deps);
    registerPlanPages(pages, deps);
    registerSubscriptionPages(pages, deps);
    registerCheckoutLinkPages(pages, deps);
    registerPaymentPages(pages, deps);
    registerUsagePages(pages, deps);
    registerPaymentRefundPages(pages, deps);
    registerAlertPages(pages, deps);
    registerAccountPages(pages, deps);
  });
}
