import { describe, expect, it } from 'vitest';
import { useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * A dashboard page for something that does not exist, in real Chromium: answered 404 under the
 * title "Not found", with the dashboard's navigation (its section marked) for a signed-in merchant,
 * accessible and light like every other page.
 */
describe('dashboard not-found pages (Chromium)', () => {
  const d = useSignedInDashboard('missing@shop.example');

  it('titles a missing customer "Not found", keeps the navigation and marks its section', async () => {
    const response = await d.page.request.get(`${d.base}/dashboard/customers/con_nope`);
    expect(response.status()).toBe(404);
    await d.visit('/dashboard/customers/con_nope', 'not-found');
    expect(await d.page.title()).toBe('Not found · Tollgate');
    expect(await d.page.textContent('h1')).toBe('Not found');
    expect(await d.page.textContent('main')).toContain('No customer with id con_nope.');
    const nav = d.page.getByRole('navigation', { name: 'Dashboard' });
    expect(await nav.getByRole('link').count()).toBeGreaterThan(5);
    expect(await nav.locator('[aria-current="page"]').textContent()).toBe('Customers');
    expect(await d.page.getByRole('button', { name: 'Sign out' }).count()).toBe(1);
  });

  it('answers an address the dashboard does not have with the same page, not a JSON error', async () => {
    const response = await d.page.request.get(`${d.base}/dashboard/no-such-page`);
    expect(response.status()).toBe(404);
    expect(response.headers()['content-type']).toContain('text/html');
    await d.visit('/dashboard/no-such-page', 'not-found-address');
    expect(await d.page.title()).toBe('Not found · Tollgate');
    expect(await d.page.textContent('main')).toContain('There is no such page in the dashboard.');
    expect(await d.page.getByRole('navigation', { name: 'Dashboard' }).getByRole('link').count()).toBeGreaterThan(5);
  });

  it('keeps "Request refused" for other refusals, and shows no navigation to a visitor who is not signed in', async () => {
    const context = await d.browser.newContext();
    try {
      const page = await context.newPage();
      const refused = await page.request.post(`${d.base}/dashboard/sign-in`, { form: { email: 'x@y.example', password: 'whatever' } });
      expect(refused.status()).toBe(403);
      expect(await refused.text()).toContain('<title>Request refused · Tollgate</title>');
      expect(await refused.text()).not.toContain('aria-label="Dashboard"');
    } finally {
      await context.close();
    }
  });
});
