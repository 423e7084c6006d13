import { newId } from '../../src/domain/ids.ts';
import { describe, expect, it } from 'vitest';
import { exactText, useSignedInDashboard, tableRows, tableValues } from '../helpers/dashboard.ts';

/**
 * Plans and subscriptions from the dashboard in real Chromium: a plan (with a credit bundle)
 * created from the form and read back over the API, bad input refused field by field, the
 * subscriptions list with the API's credits, and a cancellation at cycle end from the page.
 */
describe('dashboard plans and subscriptions (Chromium)', () => {
  const d = useSignedInDashboard('plans@shop.example');
  let planId: string;
  let subscriptionId: string;
  const submit = async (name: string) => {
    const [response] = await Promise.all([
      d.page.waitForResponse((r) => r.request().method() === 'POST'),
      d.page.getByRole('button', { name }).click(),
    ]);
    return response.status();
  };

  it('says what to do next when there are no plans and no subscriptions', async () => {
    await d.visit('/dashboard/subscriptions', 'subscriptions-empty');
    expect(await d.page.textContent('main')).toContain('POST $TOLLGATE/v1/subscriptions');
    // The example names ids as the API makes them (pln_…, not plan_…).
    const example = await d.page.textContent('main');
    expect(example).toContain(`"plan_id":"${newId('plan').slice(0, 4)}…"`);
    expect(example).toContain('"plan_id":"pln_…"');
    expect(example).toContain('"customer_id":"con_…"');
    await d.visit('/dashboard/plans', 'plans-empty');
    expect(await d.page.textContent('main')).toContain('No plans yet');
  });

  it('refuses a plan form with bad amounts, naming the fields, and creates nothing', async () => {
    // Blanks pass the browser's own `required` check; the server names each field in plain words.
    await d.page.getByLabel('Name', { exact: true }).fill('   ');
    await d.page.getByLabel('Price per period').fill('12,50');
    await d.page.getByLabel('Bundle name').fill('Half a bundle');
    expect(await submit('Create plan')).toBe(400);
    const error = (await d.page.textContent('#plan-error')) ?? '';
    expect(error).toContain('Name is required.');
    expect(error).toContain('Price per period');
    expect(error).toContain('Bundle price');
    expect(error).not.toMatch(/Too small|Invalid input|expected string|>=/);
    await d.page.getByLabel('Name', { exact: true }).fill('Broken');
    expect(await submit('Create plan')).toBe(400);
    expect(await d.page.getByLabel('Name', { exact: true }).inputValue()).toBe('Broken');
    expect((await d.api('GET', '/v1/plans')).body.data).toEqual([]);
    const noToken = await d.page.request.post(`${d.base}/dashboard/plans`, { form: { name: 'x', period_amount: '1', billing_interval: 'month' }, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
    expect((await d.api('GET', '/v1/plans')).body.data).toEqual([]);
  });

  it('creates a plan with a credit bundle from the form, as POST /v1/plans would', async () => {
    await d.page.goto(`${d.base}/dashboard/plans`);
    await d.page.getByLabel('Name', { exact: true }).fill('Starter');
    await d.page.getByLabel('Price per period').fill('0');
    await d.page.getByLabel('Credit included each period (blank: the price)').fill('5.5');
    await d.page.getByLabel('Billing interval').selectOption('month');
    await d.page.getByLabel('Unused credit').selectOption('none');
    await d.page.getByLabel('Bundle name').fill('Top-up');
    await d.page.getByLabel('Bundle price').fill('10');
    await d.page.getByLabel('Bundle credit').fill('12.0000000001');
    expect(await submit('Create plan')).toBe(201);
    expect(await d.page.textContent('#plan-message')).toContain('Starter');
    const [plan] = (await d.api('GET', '/v1/plans')).body.data;
    expect(plan).toMatchObject({
      name: 'Starter',
      period_amount: '0.0000000000',
      included_credit: '5.5000000000',
      billing_interval: 'month',
      rollover_type: 'none',
      credit_bundles: [{ name: 'Top-up', cost: '10.0000000000', credit_amount: '12.0000000001' }],
    });
    planId = plan.plan_id;
    await d.visit('/dashboard/plans', 'plans');
    expect(await tableValues(d.page, `#plan-${planId} table`)).toEqual([['Top-up', '10.0000000000', '12.0000000001']]);
    expect(await tableRows(d.page, `#plan-${planId} table`)).toEqual([['Top-up', '$10.00', '$12.00']]);
  });

  it('lists subscriptions with their credits, and cancels one at cycle end from the page', async () => {
    const customer = (await d.api('POST', '/v1/customers', { email: 'sub@example.com' })).body;
    const started = await d.api('POST', '/v1/subscriptions', { customer_id: customer.customer_id, plan_id: planId });
    expect(started.status).toBe(201);
    subscriptionId = started.body.subscription.subscription_id;
    await d.visit('/dashboard/subscriptions', 'subscriptions');
    const [row] = await tableValues(d.page, '#subscriptions');
    const api = (await d.api('GET', `/v1/subscriptions/${subscriptionId}`)).body;
    expect(row!.slice(0, 3)).toEqual(['sub@example.com', 'Starter', 'active']);
    expect(await d.page.getAttribute(`#sub-${subscriptionId} th a`, 'title')).toBe(customer.customer_id);
    expect(row!.slice(4, 7)).toEqual([api.credits.total_remaining, api.credits.cycle_remaining, api.credits.bundle_remaining]);
    expect(api.credits.cycle_remaining).toBe('5.5000000000');

    // Cancel leads to a confirmation page first; opening it changes nothing.
    await d.page.getByRole('link', { name: 'Cancel the subscription of sub@example.com' }).click();
    await d.page.waitForURL((u) => u.pathname === `/dashboard/subscriptions/${subscriptionId}/cancel`);
    expect((await d.api('GET', `/v1/subscriptions/${subscriptionId}`)).body.pending_change).toBeNull();
    await d.visit(`/dashboard/subscriptions/${subscriptionId}/cancel`, 'subscription-cancel-confirm');
    expect(await d.page.textContent('h1')).toBe('Cancel the Starter subscription of sub@example.com?');
    await d.page.getByRole('button', { name: 'Cancel at cycle end' }).click();
    await d.page.waitForSelector('#subscription-message');
    const after = (await d.api('GET', `/v1/subscriptions/${subscriptionId}`)).body;
    expect(after.status).toBe('active');
    expect(after.pending_change).toMatchObject({ type: 'cancellation', effective_at: api.cycle_end_at });
    expect(await d.page.textContent(`#sub-${subscriptionId} .pending`)).toContain('cancellation');
    expect(await d.page.getByRole('link', { name: /Cancel the subscription/ }).count()).toBe(0);

    // The customer's page shows the plan's cycle credit in its bucket.
    await d.visit(`/dashboard/customers/${customer.customer_id}`, 'customer-subscribed');
    expect(await exactText(d.page, '#wallet-cycle')).toBe('5.5000000000');
  });
});
