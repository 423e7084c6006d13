import { describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { evaluateAlerts } from '../../src/services/alert-round.ts';
import { seriousAccessibilityViolations, VIEWPORTS } from '../helpers/browser.ts';
import { otherMerchantPage, useSignedInDashboard } from '../helpers/dashboard.ts';

/**
 * The Alerts page in real Chromium: rules are created, changed and deleted through the same
 * schemas and service as /v1/alerts, a refused field says why beside itself, and a firing of the
 * alert round is listed; the pages pass axe at 1280 and 375 px.
 */
describe('dashboard alerts (Chromium)', () => {
  const d = useSignedInDashboard('alerts@shop.example');
  const post = async (button: string) => {
    const [response] = await Promise.all([d.page.waitForResponse((r) => r.request().method() === 'POST'), d.page.getByRole('button', { name: button }).click()]);
    return response.status();
  };
  /** axe at both widths, on the page as it is now. */
  const axeBothWidths = async () => {
    for (const size of [VIEWPORTS.wide, VIEWPORTS.narrow]) {
      await d.page.setViewportSize(size);
      expect(await seriousAccessibilityViolations(d.page), `${size.width} px`).toEqual([]);
    }
    await d.page.setViewportSize(VIEWPORTS.wide);
  };

  it('refuses a low-balance alert without a customer beside the customer field, creating nothing', async () => {
    await d.visit('/dashboard/alerts', 'alerts-empty');
    await axeBothWidths();
    await d.page.getByLabel('Threshold').fill('5');
    expect(await post('Create alert')).toBe(400);
    expect(await d.page.textContent('#new-alert-customer-id-error')).toContain('Customer');
    expect(await d.page.getAttribute('#new-alert-customer-id', 'aria-invalid')).toBe('true');
    expect(await d.page.getByLabel('Threshold').inputValue()).toBe('5');
    await axeBothWidths();
    expect((await d.api('GET', '/v1/alerts')).body.data).toEqual([]);
  });

  it('creates an alert from the form, lists its firing after a round, edits and deletes it', async () => {
    const customer = (await d.api('POST', '/v1/customers', { name: 'Ada Lovelace' })).body;
    await d.page.goto(`${d.base}/dashboard/alerts`);
    await d.page.getByLabel('Alert when').selectOption('low_balance');
    await d.page.getByLabel('Customer').fill(customer.customer_id);
    await d.page.getByLabel('Threshold').fill('5');
    expect(await post('Create alert')).toBe(303);
    await d.page.waitForSelector('#alert-notice');
    const [alert] = (await d.api('GET', '/v1/alerts')).body.data;
    expect(alert).toMatchObject({ kind: 'low_balance', customer_id: customer.customer_id, threshold: '5.0000000000', enabled: true, state: 'armed' });
    expect(d.page.url()).toBe(`${d.base}/dashboard/alerts/${alert.alert_id}?created=1`);

    // The customer's balance is 0, below 5: the round fires once.
    await evaluateAlerts({ storage: d.t.storage, clock: d.t.clock }, dateOf(d.t.clock));
    await d.visit('/dashboard/alerts', 'alerts-fired');
    await axeBothWidths();
    expect(await d.page.textContent('#alerts')).toContain('Ada Lovelace');
    expect(await d.page.textContent('#alerts')).toContain('Triggered');
    const firingRows = await d.page.locator('#firings tbody tr').allTextContents();
    expect(firingRows).toHaveLength(1);
    expect(firingRows[0]).toContain(alert.alert_id);
    const [firing] = (await d.api('GET', `/v1/alerts/${alert.alert_id}/firings`)).body.data;
    expect(firingRows[0]).toContain(firing.event_id);
    // At 1280 px both tables fit their boxes and every action is in view.
    const offScreen = await d.page.evaluate(() => [
      ...[...document.querySelectorAll('.table-wrap')].filter((w) => w.scrollWidth > w.clientWidth).map((w) => `box ${w.getAttribute('aria-labelledby')} scrolls`),
      ...[...document.querySelectorAll('table a')].filter((a) => a.getBoundingClientRect().right > window.innerWidth).map((a) => `${a.textContent} is off-screen`),
    ]);
    expect(offScreen).toEqual([]);

    await d.visit(`/dashboard/alerts/${alert.alert_id}`, 'alert-detail');
    await axeBothWidths();
    expect(await d.page.textContent('#alert-state')).toContain('Triggered');
    await d.page.getByLabel('Threshold').fill('-1');
    expect(await post('Save alert')).toBe(400);
    expect(await d.page.textContent('#alert-threshold-error')).toContain('Threshold');
    await d.page.getByLabel('Threshold').fill('2.5');
    expect(await post('Save alert')).toBe(303);
    await d.page.waitForSelector('#alert-notice');
    expect((await d.api('GET', `/v1/alerts/${alert.alert_id}`)).body).toMatchObject({ threshold: '2.5000000000', state: 'armed' });

    await d.page.getByRole('link', { name: `Delete alert ${alert.alert_id}` }).click();
    await d.page.waitForSelector('#confirm-form');
    await axeBothWidths();
    expect(await post('Delete the alert')).toBe(303);
    await d.page.waitForSelector('#alert-notice');
    expect((await d.api('GET', `/v1/alerts/${alert.alert_id}`)).status).toBe(404);
  });

  it("shows another merchant's alert to no one else: its pages answer 404 and its forms change nothing", async () => {
    const customer = (await d.api('POST', '/v1/customers', {})).body;
    const alert = (await d.api('POST', '/v1/alerts', { kind: 'low_balance', customer_id: customer.customer_id, threshold: '1' })).body;
    const other = await otherMerchantPage(d, 'other-alerts@shop.example');
    try {
      for (const path of [`/dashboard/alerts/${alert.alert_id}`, `/dashboard/alerts/${alert.alert_id}/delete`]) {
        expect((await other.page.goto(`${d.base}${path}`))?.status(), path).toBe(404);
      }
      await other.page.goto(`${d.base}/dashboard/alerts`);
      expect(await other.page.textContent('main')).not.toContain(alert.alert_id);
      const csrf = await other.page.getAttribute('input[name="_csrf"]', 'value');
      for (const [path, form] of [[`/dashboard/alerts/${alert.alert_id}`, { threshold: '9' }], [`/dashboard/alerts/${alert.alert_id}/delete`, {}]] as const) {
        const res = await other.page.request.post(`${d.base}${path}`, { form: { ...form, _csrf: csrf ?? '' }, maxRedirects: 0 });
        expect(res.status(), path).toBe(404);
      }
    } finally {
      await other.close();
    }
    expect((await d.api('GET', `/v1/alerts/${alert.alert_id}`)).body).toMatchObject({ threshold: '1.0000000000' });
  });

  it('refuses the forms without their CSRF token', async () => {
    const res = await d.page.request.post(`${d.base}/dashboard/alerts`, { form: { kind: 'low_balance', threshold: '1' }, maxRedirects: 0 });
    expect(res.status()).toBe(403);
  });
});
