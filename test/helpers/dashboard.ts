import type { Browser, BrowserContext, Page } from 'playwright-core';
import { afterAll, beforeAll, expect } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp } from './app.ts';
import { startGatewayOnMock } from './gateway.ts';
import type { MockUpstream } from './mock-upstream.ts';
import { live } from './live.ts';
import { launchChromium, loadWithWeight, overflowAtPhoneWidth, screenshotBothWidths, seriousAccessibilityViolations } from './browser.ts';

export const PAGE_BUDGET_BYTES = 150 * 1024;
const PASSWORD = 'a long enough password';

export type DashboardSession = {
  t: TestApp;
  browser: Browser;
  context: BrowserContext;
  page: Page;
  base: string;
  /** The signed-in merchant's secret key, for checking the pages against the API. */
  secretKey: string;
  merchantId: string;
  /** The merchant's own wallet (what a spend key without a customer spends). */
  walletId: string;
  /** The mock provider, when the session was started with `gateway`. */
  upstream: MockUpstream | undefined;
  /**
   * Opens a page and checks what every dashboard page must satisfy: no request to another
   * origin, under the weight budget, no serious axe violation; then photographs it at 375 and
   * 1280 px (test-artifacts/screenshots).
   */
  visit(path: string, shot: string): Promise<void>;
  /** GET/POST/… on the API as the signed-in merchant; the JSON answer. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  api(method: string, url: string, payload?: unknown): Promise<{ status: number; body: any }>;
  close(): Promise<void>;
};

/**
 * A merchant with a password, signed in to the dashboard in a real Chromium; with `gateway`, the
 * app forwards those provider hosts to a mock upstream (so spend keys can be used for real).
 */
export async function signedInDashboard(
  email: string,
  opts: { env?: Record<string, string>; gateway?: { providerHosts: string[]; providerKeys: Record<string, string> } } = {},
): Promise<DashboardSession> {
  let upstream: MockUpstream | undefined;
  let t: TestApp;
  let base: string;
  if (opts.gateway) {
    ({ t, upstream, base } = await startGatewayOnMock('sqlite', { ...opts.gateway, ...(opts.env ? { env: opts.env } : {}) }));
  } else {
    t = await startTestApp('sqlite', opts.env ? { env: opts.env } : {});
    base = await t.listen();
  }
  const { merchant, secretKey } = await createMerchant(t.storage, { name: 'Dash Shop', email, password: PASSWORD }, new Date().toISOString());
  const browser = await launchChromium();
  const context = await browser.newContext();
  const page = await context.newPage();
  await signIn(page, base, email);

  return {
    t,
    browser,
    context,
    page,
    base,
    secretKey,
    merchantId: merchant.id,
    walletId: merchant.wallet_id,
    upstream,
    async visit(path, shot) {
      const { bytes, foreign } = await loadWithWeight(page, `${base}${path}`);
      expect(foreign, `${path} requested another origin`).toEqual([]);
      expect(bytes, `${path} weighs ${bytes} bytes`).toBeLessThan(PAGE_BUDGET_BYTES);
      expect(await seriousAccessibilityViolations(page), path).toEqual([]);
      expect(await overflowAtPhoneWidth(page), `${path} is wider than a 375 px screen`).toBe(0);
      // The strict policy is sent, and the served HTML needs nothing it forbids: no inline script, style or handler.
      const served = await page.request.get(`${base}${path}`);
      const csp = served.headers()['content-security-policy'] ?? '';
      expect(csp, path).toContain("default-src 'none'");
      expect(csp, path).toContain("script-src 'self'");
      const markup = await served.text();
      const inline = [
        ...(markup.match(/<script(?![^>]*\bsrc=)(?![^>]*application\/json)[^>]*>/g) ?? []),
        ...(markup.match(/<[a-z][^>]*\sstyle=/gi) ?? []),
        ...(markup.match(/<[a-z][^>]*\son[a-z]+=/gi) ?? []),
      ];
      expect(inline, path).toEqual([]);
      await screenshotBothWidths(page, shot);
    },
    async api(method, url, payload) {
      const res = await t.app.inject({
        method: method as 'GET',
        url,
        headers: t.auth(secretKey),
        ...(payload === undefined ? {} : { payload: payload as Record<string, unknown> }),
      });
      return { status: res.statusCode, body: res.body ? res.json() : null };
    },
    async close() {
      await browser.close();
      await t.close();
      await upstream?.close();
    },
  };
}

/**
 * The signed-in dashboard of a describe block: started before its tests (beforeAll) and closed
 * after them (afterAll), as useTestApp does for the app. What it returns reads through to the
 * started session (see `live`).
 */
export function useSignedInDashboard(email: string, opts: Parameters<typeof signedInDashboard>[1] = {}): DashboardSession {
  let started: DashboardSession | undefined;
  beforeAll(async () => {
    started = await signedInDashboard(email, opts);
  });
  afterAll(async () => {
    await started?.close();
  });
  return live('the dashboard session', () => started);
}

async function signIn(page: Page, base: string, email: string): Promise<void> {
  await page.goto(`${base}/dashboard/sign-in`);
  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Password').fill(PASSWORD);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((u) => u.pathname === '/dashboard');
}

/** Another merchant, signed in in its own browser context (for proving one merchant cannot reach another's things). */
export async function otherMerchantPage(d: DashboardSession, email: string): Promise<{ page: Page; close(): Promise<void> }> {
  await createMerchant(d.t.storage, { name: 'Other Shop', email, password: PASSWORD }, new Date().toISOString());
  const context = await d.browser.newContext();
  const page = await context.newPage();
  await signIn(page, d.base, email);
  return { page, close: () => context.close() };
}

/** The text of every cell of a table's body rows (header cells included), row by row. */
export async function tableRows(page: Page, selector: string): Promise<string[][]> {
  return page.$$eval(`${selector} tbody tr`, (rows) =>
    rows.map((r) => Array.from(r.querySelectorAll('th,td')).map((c) => (c.textContent ?? '').trim())),
  );
}

/**
 * The text of an element as the API would write it: each formatted amount ("$1,234.5678") is
 * replaced by the exact value it carries (`<data value="1234.5678123456">`), so a page's figures
 * can be compared with the API's to the last unit.
 */
export async function exactText(page: Page, selector: string): Promise<string> {
  return page.$eval(selector, (el) => {
    const copy = el.cloneNode(true) as Element;
    copy.querySelectorAll('data[value]').forEach((d) => d.replaceWith(d.getAttribute('value') ?? ''));
    return (copy.textContent ?? '').trim();
  });
}

/** Like tableRows, with every formatted amount replaced by its exact value (see exactText). */
export async function tableValues(page: Page, selector: string): Promise<string[][]> {
  return page.$$eval(`${selector} tbody tr`, (rows) =>
    rows.map((r) =>
      Array.from(r.querySelectorAll('th,td')).map((c) => {
        const copy = c.cloneNode(true) as Element;
        copy.querySelectorAll('data[value]').forEach((d) => d.replaceWith(d.getAttribute('value') ?? ''));
        return (copy.textContent ?? '').trim();
      }),
    ),
  );
}
