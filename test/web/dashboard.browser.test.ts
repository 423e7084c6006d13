import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { launchChromium, loadWithWeight, overflowAtPhoneWidth, screenshotBothWidths, seriousAccessibilityViolations } from '../helpers/browser.ts';

const PAGE_BUDGET_BYTES = 150 * 1024;
const EMAIL = 'founder@shop.example';
const PASSWORD = 'a long enough password';

/**
 * The dashboard end to end in real Chromium: sign-up and sign-in, a secret key shown once, tier
 * editing, a request recorded through the API in the log, its detail and the overview (with the
 * numbers of GET /v1/usage), and the refusals (wrong password, missing CSRF token, another
 * merchant's session). Every page is checked with axe-core, weighed, and photographed at 375 and
 * 1280 px (test-artifacts/screenshots, not committed).
 */
describe('merchant dashboard (Chromium)', () => {
  let t: TestApp;
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  let base: string;
  let secretKey: string;
  let requestId: string;
  let meterId: string;
  const visited: string[] = [];

  /** Opens a dashboard page and checks what every page must satisfy. */
  async function visit(path: string, shot: string): Promise<void> {
    const { bytes, foreign } = await loadWithWeight(page, `${base}${path}`);
    expect(foreign, `${path} requested another origin`).toEqual([]);
    expect(bytes, `${path} weighs ${bytes} bytes`).toBeLessThan(PAGE_BUDGET_BYTES);
    expect(await seriousAccessibilityViolations(page), path).toEqual([]);
    expect(await overflowAtPhoneWidth(page), `${path} is wider than a 375 px screen`).toBe(0);
    await screenshotBothWidths(page, shot);
    visited.push(path);
  }

  beforeAll(async () => {
    t = await startTestApp('sqlite', { env: { DASHBOARD_SIGNUP: 'true' } });
    base = await t.listen();
    browser = await launchChromium();
    context = await browser.newContext();
    page = await context.newPage();
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
  });

  it('sends a visitor to sign-in, and signs up a new merchant', async () => {
    await page.goto(`${base}/`);
    expect(new URL(page.url()).pathname).toBe('/dashboard/sign-in');
    await visit('/dashboard/sign-in', 'sign-in');
    await visit('/dashboard/sign-up', 'sign-up');
    await page.getByLabel('Business name').fill('Founder Shop');
    await page.getByLabel('Email').fill(EMAIL);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Create account' }).click();
    await page.waitForURL((u) => u.pathname === '/dashboard');
    expect(await page.textContent('main')).toContain('No requests in this range yet');
    await visit('/dashboard', 'overview-empty');
  });

  it('shows a new secret key once, and the key works', async () => {
    await visit('/dashboard/secret-keys', 'secret-keys');
    await page.getByLabel('Name').fill('Backend');
    await page.getByRole('button', { name: 'Create secret key' }).click();
    secretKey = (await page.textContent('#new-secret-key'))!.trim();
    expect(secretKey).toMatch(/^sk_live_/);
    await page.goto(`${base}/dashboard/secret-keys`);
    expect(await page.content()).not.toContain(secretKey);
    expect(await page.locator('#new-secret-key').count()).toBe(0);
    const meters = await t.app.inject({ method: 'GET', url: '/v1/meters', headers: t.auth(secretKey) });
    expect(meters.statusCode).toBe(200);
  });

  it("edits a meter's tiers, previews a price, and the API sees the new tiers", async () => {
    await visit('/dashboard/meters', 'meters-empty');
    const setup = await t.customerWithMeter({
      credit: '100',
      secretKey,
      meter: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '2.00' }] },
    });
    meterId = setup.meterId;
    await visit(`/dashboard/meters/${meterId}`, 'meter');
    await page.getByLabel(/^Tiers/).fill('0 3.00\n1000000 1.50');
    await page.getByRole('button', { name: 'Save meter' }).click();
    await page.waitForSelector('text=Meter saved.');
    const meter = (await t.app.inject({ method: 'GET', url: `/v1/meters/${meterId}`, headers: t.auth(secretKey) })).json();
    expect(meter.tiers.map((x: { start: number; rate: string }) => [x.start, x.rate])).toEqual([[0, '3.0000000000'], [1000000, '1.5000000000']]);
    // 2M tokens from a fresh period: 1M at 3.00 and 1M at 1.50.
    await page.getByLabel(/Usage of one request/).fill('2000000');
    await page.getByRole('button', { name: 'Preview' }).click();
    expect(await page.textContent('#preview-fee')).toBe('$4.50');
    expect(await page.getAttribute('#preview-fee data', 'value')).toBe('4.5000000000');
    await page.getByLabel(/^Tiers/).fill('5 1.00');
    await page.getByRole('button', { name: 'Save meter' }).click();
    expect(await page.textContent('#tiers-error')).toContain('the first tier must start at 0');

    requestId = `dash-${Date.now()}`;
    const recorded = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(secretKey),
      payload: { request_id: requestId, customer_id: setup.customerId, meter_slug: setup.meterSlug, input_tokens: 1200, output_tokens: 800, metadata: { team: 'search' } },
    });
    expect(recorded.statusCode).toBe(201);
  });

  it('shows the recorded request in the log, its detail and the overview, with the numbers of GET /v1/usage', async () => {
    const record = await t.settledRecord(requestId, t.auth(secretKey));
    await visit('/dashboard/requests', 'requests');
    expect(await page.textContent('main')).toContain(requestId);
    await visit('/dashboard/requests?metadata=team%3Dother', 'requests-filtered-empty');
    expect(await page.textContent('main')).toContain('No requests match');
    const csv = await page.request.get(`${base}/dashboard/requests.csv?metadata=team%3Dsearch`);
    expect(csv.headers()['content-type']).toContain('text/csv');
    expect((await csv.text()).split('\r\n')[1]).toContain(requestId);

    await visit(`/dashboard/requests/${requestId}`, 'request-detail');
    expect(await page.getAttribute('#detail-total data', 'value')).toBe(record.total_request_cost);
    expect(await page.getAttribute('#detail-fee data', 'value')).toBe(record.fee.amount);

    const today = new Date().toISOString().slice(0, 10);
    await visit(`/dashboard?start=${today}&end=${today}&tz=%2B00:00`, 'overview');
    const usage = (await t.app.inject({ method: 'GET', url: `/v1/usage?start=${today}T00:00:00%2B00:00&end=${today}T00:00:00%2B00:00`, headers: t.auth(secretKey) })).json();
    expect(await page.textContent('#total-requests')).toBe(usage.totals.total_requests.toLocaleString('en-US'));
    expect(await page.getAttribute('#total-fee data', 'value')).toBe(usage.totals.total_fee_amount);
    expect(await page.getAttribute('#total-cost data', 'value')).toBe(usage.totals.total_request_cost);
    expect(usage.totals.total_request_cost).toBe(record.total_request_cost);
    // The charts were drawn by the locally served chart library.
    await page.waitForSelector('#revenue-chart .uplot');
    expect(await page.locator('#requests-chart canvas').count()).toBe(1);
  });

  it("refuses a form posted without its CSRF token, and another merchant's session on this merchant's things", async () => {
    const noToken = await page.request.post(`${base}/dashboard/secret-keys`, { form: { name: 'sneaky' }, maxRedirects: 0 });
    expect(noToken.status()).toBe(403);
    const keys = (await t.app.inject({ method: 'GET', url: '/v1/secret_keys?limit=100', headers: t.auth(secretKey) })).json();
    expect(keys.data.map((k: { name: string }) => k.name)).not.toContain('sneaky');

    await createMerchant(t.storage, { name: 'Other', email: 'other@elsewhere.example', password: PASSWORD }, new Date().toISOString());
    const other = await browser.newContext();
    const otherPage = await other.newPage();
    await otherPage.goto(`${base}/dashboard/sign-in`);
    await otherPage.getByLabel('Email').fill('OTHER@elsewhere.example');
    await otherPage.getByLabel('Password').fill(PASSWORD);
    await otherPage.getByRole('button', { name: 'Sign in' }).click();
    await otherPage.waitForURL((u) => u.pathname === '/dashboard');
    const detail = await otherPage.goto(`${base}/dashboard/requests/${requestId}`);
    expect(detail!.status()).toBe(404);
    const meter = await otherPage.goto(`${base}/dashboard/meters/${meterId}`);
    expect(meter!.status()).toBe(404);
    await otherPage.goto(`${base}/dashboard/requests`);
    expect(await otherPage.textContent('main')).not.toContain(requestId);
    await other.close();

    // A session cookie that was not signed by this server is no session at all.
    const forged = await browser.newContext();
    await forged.addCookies([{ name: 'tollgate_session', value: 'sess_forged.signature', url: base }]);
    const forgedPage = await forged.newPage();
    await forgedPage.goto(`${base}/dashboard/requests`);
    expect(new URL(forgedPage.url()).pathname).toBe('/dashboard/sign-in');
    await forged.close();
  });

  it('refuses a wrong password, then after five refuses this account from this address and says so', async () => {
    const fresh = await browser.newContext();
    const p = await fresh.newPage();
    const attempt = async (password: string) => {
      await p.goto(`${base}/dashboard/sign-in`);
      await p.getByLabel('Email').fill(EMAIL);
      await p.getByLabel('Password').fill(password);
      const [response] = await Promise.all([p.waitForResponse((r) => r.request().method() === 'POST'), p.getByRole('button', { name: 'Sign in' }).click()]);
      return { status: response.status(), text: (await p.textContent('main')) ?? '' };
    };
    const wrong = await attempt('not the password');
    expect(wrong.status).toBe(401);
    expect(wrong.text).toContain('Wrong email or password');
    expect(await seriousAccessibilityViolations(p)).toEqual([]);
    for (let i = 0; i < 4; i++) await attempt('still wrong');
    const locked = await attempt(PASSWORD);
    expect(locked.status).toBe(429);
    expect(locked.text).toContain('Too many wrong passwords for this account from your network');
    await fresh.close();
  });

  it('signs out: the old session cookie no longer opens the dashboard', async () => {
    const cookies = await context.cookies();
    await page.goto(`${base}/dashboard`);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.waitForURL((u) => u.pathname === '/dashboard/sign-in');
    const replay = await browser.newContext();
    await replay.addCookies(cookies);
    const p = await replay.newPage();
    await p.goto(`${base}/dashboard`);
    expect(new URL(p.url()).pathname).toBe('/dashboard/sign-in');
    await replay.close();
    expect(visited.length).toBeGreaterThanOrEqual(10);
  });
});
