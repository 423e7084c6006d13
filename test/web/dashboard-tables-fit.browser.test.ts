import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SCREENSHOT_DIR, seriousAccessibilityViolations } from '../helpers/browser.ts';
import { signedInDashboard, type DashboardSession } from '../helpers/dashboard.ts';
import { loopbackDispatcher, startReceiver, type Receiver } from '../helpers/webhook-receiver.ts';

const WIDTHS = [1280, 1440] as const;

/** What does not fit: each table box that scrolls sideways, each table button or link that ends past the window's right edge. */
async function offScreen(page: Page): Promise<string[]> {
  return page.evaluate(() => {
    const problems: string[] = [];
    const name = (el: Element) => el.getAttribute('aria-label') ?? el.id ?? el.textContent?.trim().slice(0, 40) ?? el.tagName;
    document.querySelectorAll('.table-wrap').forEach((wrap) => {
      if (wrap.scrollWidth > wrap.clientWidth) problems.push(`table box ${name(wrap)} scrolls: ${wrap.scrollWidth} > ${wrap.clientWidth}`);
    });
    document.querySelectorAll('table button, table a').forEach((el) => {
      const r = el.getBoundingClientRect();
      if (r.right > window.innerWidth) problems.push(`${name(el)} ends at ${Math.round(r.right)} px`);
    });
    if (document.documentElement.scrollWidth > document.documentElement.clientWidth) problems.push('the page scrolls sideways');
    return problems;
  });
}

/**
 * Every dashboard table, filled with realistic, long values (a customer with limits on every
 * axis, a subscription with a pending cancellation, failed webhook deliveries), fits a 1280 and a
 * 1440 px window with its action buttons in view; at 375 px, where tables do scroll inside their
 * box, each box can be reached by keyboard and axe finds nothing serious.
 */
describe('dashboard tables fit the window (Chromium)', () => {
  let d: DashboardSession;
  let receiver: Receiver;
  const pages: string[] = [];

  beforeAll(async () => {
    d = await signedInDashboard('tables@shop.example', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
    const c = await d.t.customerWithMeter({ credit: '1234567.891', secretKey: d.secretKey });
    await d.api('PATCH', `/v1/customers/${c.customerId}`, { first_name: 'Maximiliana', last_name: 'Featherstonehaugh-Worthington', email: 'maximiliana.featherstonehaugh@enterprise-customer.example' });
    await d.api('POST', '/v1/spend_keys', {
      name: 'Production backend of the search team',
      customer_id: c.customerId,
      spend_limit: { amount: '12345.6789', cycle: 'monthly' },
      request_limit: { count: 1_000_000, cycle: 'monthly' },
      rate_limit: { rpm: 12000 },
      allowed_models: ['gpt-4o-mini', 'claude-3-5-sonnet-latest'],
    });
    await d.api('POST', '/v1/spend_keys', { name: 'Own wallet key' });
    const plan = (
      await d.api('POST', '/v1/plans', {
        name: 'Professional annual with rollover',
        // Free, so a subscription starts without a payment method; its credit is what the columns show.
        period_amount: '0',
        included_credit: '1999.99',
        billing_interval: 'month',
        credit_bundles: [{ name: 'Large top-up', cost: '500', credit_amount: '550.123456' }],
      })
    ).body;
    const started = await d.api('POST', '/v1/subscriptions', { customer_id: c.customerId, plan_id: plan.plan_id });
    expect(started.status, JSON.stringify(started.body)).toBe(201);
    const sub = started.body.subscription;
    await d.api('DELETE', `/v1/subscriptions/${sub.subscription_id}`);
    const other = (await d.api('POST', '/v1/customers', { email: 'second@example.com' })).body;
    await d.api('POST', '/v1/subscriptions', { customer_id: other.customer_id, plan_id: plan.plan_id });
    for (let i = 0; i < 3; i++) {
      const res = await d.api('POST', '/v1/requests', {
        request_id: `a-rather-long-request-identifier-${i}-0123456789`,
        customer_id: c.customerId,
        meter_slug: c.meterSlug,
        provider: 'openai',
        model: 'gpt-4o-mini-2024-07-18',
        input_tokens: 1_234_567,
        output_tokens: 765_432,
        metadata: { team: 'search' },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(201);
    }
    receiver = await startReceiver(() => 500);
    const hook = (await d.api('POST', '/v1/webhooks', { name: 'Backend', url: `${receiver.url}/a/long/path/for/the/webhook/endpoint` })).body;
    const dispatcher = loopbackDispatcher(d.t);
    await d.api('POST', '/v1/customers', { email: 'third@example.com' });
    await dispatcher.tick();
    await dispatcher.drain();
    await dispatcher.stop();
    const keys = (await d.api('GET', '/v1/spend_keys')).body.data as { spend_key_id: string }[];
    const secretKeys = (await d.api('GET', '/v1/secret_keys')).body.data as unknown[];
    expect(secretKeys.length).toBeGreaterThan(0);
    pages.push(
      '/dashboard',
      '/dashboard/requests',
      '/dashboard/requests/a-rather-long-request-identifier-0-0123456789',
      '/dashboard/customers',
      `/dashboard/customers/${c.customerId}`,
      '/dashboard/meters',
      '/dashboard/plans',
      '/dashboard/subscriptions',
      '/dashboard/payments',
      '/dashboard/usage?by=customer',
      '/dashboard/spend-keys',
      `/dashboard/spend-keys/${keys[0]!.spend_key_id}`,
      '/dashboard/webhooks',
      `/dashboard/webhooks/${hook.webhook_id}`,
      '/dashboard/secret-keys',
    );
  });
  afterAll(async () => {
    await receiver?.close();
    await d?.close();
  });

  for (const width of WIDTHS) {
    it(`shows every column and action of every table at ${width} px`, async () => {
      await d.page.setViewportSize({ width, height: 900 });
      const problems: string[] = [];
      for (const path of pages) {
        const response = await d.page.goto(`${d.base}${path}`);
        // An error page or a page without its table would "fit" trivially: each must answer 200 and
        // show a table (the spend key detail is the one page without one).
        if (response?.status() !== 200) problems.push(`${path}: answered ${response?.status()}`);
        if ((await d.page.locator('table').count()) === 0 && !path.startsWith('/dashboard/spend-keys/')) problems.push(`${path}: no table to check`);
        problems.push(...(await offScreen(d.page)).map((p) => `${path}: ${p}`));
        mkdirSync(SCREENSHOT_DIR, { recursive: true });
        await d.page.screenshot({ path: join(SCREENSHOT_DIR, `fit-${path.split('/').slice(2, 3).join('') || 'overview'}-${width}.png`), fullPage: true });
      }
      expect(problems, `at ${width} px`).toEqual([]);
    });
  }

  it('at 375 px lets the keyboard reach every table box and passes axe', async () => {
    await d.page.setViewportSize({ width: 375, height: 800 });
    const problems: string[] = [];
    for (const path of pages) {
      const response = await d.page.goto(`${d.base}${path}`);
      if (response?.status() !== 200) problems.push(`${path}: answered ${response?.status()}`);
      problems.push(...(await seriousAccessibilityViolations(d.page)).map((p) => `${path}: ${p}`));
    }
    expect(problems).toEqual([]);
    // One axe run per page, each some seconds on a loaded shared host: the default 30 s is too tight.
  }, 120_000);
});
