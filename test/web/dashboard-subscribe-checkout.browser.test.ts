import { describe, expect, it } from 'vitest';
import { seriousAccessibilityViolations } from '../helpers/browser.ts';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * Subscribing a customer and making checkout links from the dashboard in real Chromium, through
 * the schemas and services of POST /v1/subscriptions and POST /v1/checkout_sessions: refusals
 * beside their fields in plain words, and what the forms made is what the API lists.
 */
describe('dashboard subscriptions and checkout links (Chromium)', () => {
  const d = useSignedInDashboard('subscribe@shop.example');
  let free: { plan_id: string };
  let paid: { plan_id: string; credit_bundles: { credit_bundle_id: string }[] };
  let customerId: string;
  const post = async (button: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: button }).click()]);
    return response.status();
  };

  it('refuses a subscription without a customer, for an unknown one, and a paid plan without a card, each at its field', async () => {
    free = (await d.api('POST', '/v1/plans', { name: 'Free', period_amount: '0', included_credit: '1', billing_interval: 'month' })).body;
    paid = (await d.api('POST', '/v1/plans', { name: 'Pro', period_amount: '20', billing_interval: 'month', credit_bundles: [{ name: 'Boost', cost: '5', credit_amount: '6' }] })).body;
    customerId = (await d.api('POST', '/v1/customers', { name: 'Ada Lovelace', reference_id: 'ada' })).body.customer_id;
    await d.visit('/dashboard/subscriptions', 'subscribe-form');
    await d.page.getByLabel('Plan', { exact: true }).selectOption(free.plan_id);
    expect(await post('Subscribe')).toBe(400);
    expect(await d.page.textContent('#subscribe-customer-error')).toBe('Customer is required.');
    await d.page.getByLabel('Customer', { exact: true }).fill('nobody');
    expect(await post('Subscribe')).toBe(400);
    expect(await d.page.textContent('#subscribe-customer-error')).toBe('Customer: no customer with id nobody');
    await d.page.getByLabel('Customer', { exact: true }).fill('ada');
    await d.page.getByLabel('Plan', { exact: true }).selectOption(paid.plan_id);
    expect(await post('Subscribe')).toBe(402);
    expect(await d.page.textContent('#subscribe-plan-error')).toContain('no saved payment method');
    expect(await seriousAccessibilityViolations(d.page)).toEqual([]);
    expect((await d.api('GET', '/v1/subscriptions?status=all')).body.data).toEqual([]);
  });

  it('subscribes a customer (named by its reference) to a free plan; the API lists the subscription', async () => {
    await d.page.goto(`${d.base}/dashboard/subscriptions`);
    await d.page.getByLabel('Customer', { exact: true }).fill('ada');
    await d.page.getByLabel('Plan', { exact: true }).selectOption(free.plan_id);
    expect(await post('Subscribe')).toBe(303);
    await d.page.waitForSelector('#subscription-message');
    const [sub] = (await d.api('GET', `/v1/subscriptions?customer_id=${customerId}`)).body.data;
    expect(sub).toMatchObject({ plan_id: free.plan_id, status: 'active', customer_id: customerId });
    expect(await d.page.textContent(`#sub-${sub.subscription_id}`)).toContain('Free');
  });

  it('refuses a checkout link whose mode lacks what it needs, or with a bad page address, at the fields', async () => {
    await d.visit('/dashboard/checkout-links', 'checkout-links-empty');
    await d.page.getByLabel('What the customer does').selectOption('topup');
    await d.page.getByLabel('Page the customer comes from').fill('ftp://shop.example');
    expect(await post('Create checkout link')).toBe(400);
    expect(await d.page.textContent('#checkout-origin-error')).toContain('Page the customer comes from');
    await d.page.getByLabel('Page the customer comes from').fill('https://shop.example/account');
    expect(await post('Create checkout link')).toBe(400);
    expect(await d.page.textContent('#checkout-customer-error')).toContain('Customer: is required in topup mode');
    expect(await d.page.textContent('main')).not.toMatch(/Too small|Invalid input|expected string/);
    expect(await seriousAccessibilityViolations(d.page)).toEqual([]);
    expect((await d.api('GET', '/v1/checkout_sessions')).body.data).toEqual([]);
  });

  it('makes a checkout link in each mode, shows its URL once with a Copy button, and the API lists each', async () => {
    await d.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: d.base });
    const make = async (mode: string, fields: Record<string, string>) => {
      await d.page.goto(`${d.base}/dashboard/checkout-links`);
      await d.page.getByLabel('What the customer does').selectOption(mode);
      await d.page.getByLabel('Page the customer comes from').fill('https://shop.example/account');
      if (fields.customer) await d.page.getByLabel('Customer', { exact: true }).fill(fields.customer);
      if (fields.reference) await d.page.getByLabel('Reference id for a new customer').fill(fields.reference);
      if (fields.plan) await d.page.getByLabel('Plan', { exact: true }).selectOption(fields.plan);
      if (fields.bundle) await d.page.getByLabel('Credit bundle').selectOption(fields.bundle);
      expect(await post('Create checkout link')).toBe(201);
      return d.page.getByLabel('Checkout URL').inputValue();
    };
    const onboarding = await make('onboarding', { reference: 'grace' });
    await make('topup', { customer: 'ada' });
    // Ada is on the free plan: a Pro subscription checkout is her plan change.
    await make('subscription', { customer: customerId, plan: paid.plan_id });
    // The API's rule: a bundle is sold to customers on its plan only (Ada is still on the free plan).
    await d.page.goto(`${d.base}/dashboard/checkout-links`);
    await d.page.getByLabel('What the customer does').selectOption('credit_bundle');
    await d.page.getByLabel('Page the customer comes from').fill('https://shop.example/account');
    await d.page.getByLabel('Customer', { exact: true }).fill('ada');
    await d.page.getByLabel('Credit bundle').selectOption(paid.credit_bundles[0]!.credit_bundle_id);
    expect(await post('Create checkout link')).toBe(400);
    expect(await d.page.textContent('#checkout-bundle-error')).toContain("not on this bundle's plan");

    const sessions = (await d.api('GET', '/v1/checkout_sessions')).body.data;
    expect(sessions.map((s: { checkout_mode: string }) => s.checkout_mode).sort()).toEqual(['onboarding', 'subscription', 'topup']);
    expect(sessions.find((s: { checkout_mode: string }) => s.checkout_mode === 'onboarding')).toMatchObject({ reference_id: 'grace', customer_id: null });
    expect(sessions.find((s: { checkout_mode: string }) => s.checkout_mode === 'subscription')).toMatchObject({ customer_id: customerId, plan_id: paid.plan_id });

    // A URL is shown once: the refused form above shows none. The next one copies with one click.
    expect(await d.page.getByLabel('Checkout URL').count()).toBe(0);
    await make('onboarding', {});
    expect(await seriousAccessibilityViolations(d.page)).toEqual([]);
    const shown = await d.page.getByLabel('Checkout URL').inputValue();
    await d.page.getByRole('button', { name: 'Copy' }).click();
    await d.page.waitForFunction(() => document.getElementById('checkout-url-copied')?.textContent === 'Copied.');
    expect(await d.page.evaluate(() => navigator.clipboard.readText())).toBe(shown);
    // The link opens the hosted checkout.
    const opened = await d.page.request.get(onboarding);
    expect(opened.status()).toBe(200);
    await d.visit('/dashboard/checkout-links', 'checkout-links');
    expect(await d.page.locator('#checkout-links tbody tr').count()).toBe(4);
  });
});
