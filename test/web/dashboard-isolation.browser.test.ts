import { describe, expect, it } from 'vitest';
import { fanOutEvents } from '../../src/storage/webhook-deliveries.ts';
import { deliveredName } from '../../src/webhooks/events.ts';
import { otherMerchantPage, useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * One merchant's session cannot see or change another merchant's customers, spend keys, webhook
 * deliveries or subscriptions through the dashboard: every page is a 404 and every form post
 * (with the intruder's own valid CSRF token) is refused before it changes anything.
 */
describe('dashboard tenant isolation (Chromium)', () => {
  const d = useSignedInDashboard('owner@isolated.example', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });

  it("answers 404 to another merchant's pages and forms, and nothing changes", async () => {
    const hook = (await d.api('POST', '/v1/webhooks', { name: 'Owned', url: 'http://127.0.0.1:9/hook' })).body;
    const customer = (await d.api('POST', '/v1/customers', {})).body;
    const key = (await d.api('POST', '/v1/spend_keys', { name: 'Owned', spend_limit: { amount: '3', cycle: 'daily' } })).body;
    await fanOutEvents(d.t.storage, new Date(d.t.clock.now() + 1_000).toISOString(), deliveredName);
    const [delivery] = (await d.api('GET', `/v1/webhooks/${hook.webhook_id}/deliveries`)).body.data;
    expect(delivery).toBeDefined();
    const plan = (await d.api('POST', '/v1/plans', { name: 'Free', period_amount: '0', included_credit: '1', billing_interval: 'month' })).body;
    const sub = (await d.api('POST', '/v1/subscriptions', { customer_id: customer.customer_id, plan_id: plan.plan_id })).body.subscription;
    const snapshot = async () => [
      (await d.api('GET', `/v1/customers/${customer.customer_id}`)).body.wallet.balance,
      (await d.api('GET', `/v1/spend_keys/${key.spend_key_id}`)).body,
      (await d.api('GET', `/v1/webhooks/${hook.webhook_id}/deliveries`)).body.data[0],
      (await d.api('GET', `/v1/subscriptions/${sub.subscription_id}`)).body.pending_change,
    ];
    const before = await snapshot();

    const other = await otherMerchantPage(d, 'intruder@elsewhere.example');
    const token = (await other.page.getAttribute('input[name=_csrf]', 'value'))!;
    for (const path of [`/dashboard/customers/${customer.customer_id}`, `/dashboard/spend-keys/${key.spend_key_id}`, `/dashboard/webhooks/${hook.webhook_id}`]) {
      expect((await other.page.goto(`${d.base}${path}`))!.status(), path).toBe(404);
    }
    for (const path of ['/dashboard/spend-keys', '/dashboard/webhooks', '/dashboard/subscriptions', '/dashboard/plans', '/dashboard/customers']) {
      await other.page.goto(`${d.base}${path}`);
      const text = (await other.page.textContent('main')) ?? '';
      for (const id of [customer.customer_id, key.key_preview, hook.url, plan.plan_id, sub.subscription_id]) expect(text, path).not.toContain(id);
    }
    const posts: [string, Record<string, string>][] = [
      [`/dashboard/customers/${customer.customer_id}/credits`, { amount: '5' }],
      [`/dashboard/spend-keys/${key.spend_key_id}`, { spend_amount: '100', spend_cycle: 'daily' }],
      [`/dashboard/spend-keys/${key.spend_key_id}/status`, { status: 'paused' }],
      [`/dashboard/spend-keys/${key.spend_key_id}/rotate`, {}],
      [`/dashboard/spend-keys/${key.spend_key_id}/revoke`, {}],
      [`/dashboard/webhooks/${hook.webhook_id}/deliveries/${delivery.delivery_id}/redeliver`, {}],
      [`/dashboard/subscriptions/${sub.subscription_id}/cancel`, {}],
    ];
    for (const [path, form] of posts) {
      const res = await other.page.request.post(`${d.base}${path}`, { form: { _csrf: token, ...form }, maxRedirects: 0 });
      expect(res.status(), path).toBe(404);
    }
    await other.close();
    expect(await snapshot()).toEqual(before);
  });
});
