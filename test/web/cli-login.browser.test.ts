import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { launchChromium, loadWithWeight, overflowAtPhoneWidth, screenshotBothWidths, seriousAccessibilityViolations } from '../helpers/browser.ts';
import { fakeBrowserOpener, runCollecting, signInAndApprove, signInToConsent } from '../helpers/cli-login.ts';

const EMAIL = 'Owner@CLI.example';
const PASSWORD = 'correct horse battery';

describe('CLI login with the published client (Chromium)', () => {
  let t: TestApp;
  let browser: Browser;
  let baseUrl: string;
  let dir: string;

  beforeAll(async () => {
    t = await startTestApp('sqlite');
    await createMerchant(t.storage, { name: 'CLI Owner', email: EMAIL, password: PASSWORD }, new Date().toISOString());
    baseUrl = await t.listen();
    browser = await launchChromium();
    dir = mkdtempSync(join(tmpdir(), 'tollgate-cli-login-'));
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('signs in first, approves, and hands Lava.login() (in its own process) credentials that work', async () => {
    const opener = fakeBrowserOpener(dir);
    const script = `import { Lava } from '@lavapayments/nodejs';
const credentials = await Lava.login({ baseUrl: ${JSON.stringify(baseUrl)} });
process.stdout.write(JSON.stringify(credentials));`;
    const login = runCollecting(['--input-type=module', '-e', script], { ...process.env, PATH: opener.path });
    try {
      const authUrl = await opener.opened();
      expect(authUrl).toMatch(new RegExp(`^${baseUrl}/auth/connect\\?state=[0-9a-f]{32}&port=\\d+$`));
      const approval = await signInAndApprove(browser, authUrl, EMAIL.toLowerCase(), PASSWORD);
      expect(approval.signInFirst).toBe(true);
      expect(approval.shownMerchant).toContain('CLI Owner');
      expect(approval.callbackText).toContain('logged in');

      const credentials = JSON.parse(await login.output);
      expect(credentials.secret_key).toMatch(/^sk_live_/);
      expect(credentials.account_id).toBe(credentials.merchant_id);
      const meters = await fetch(`${baseUrl}/v1/meters`, { headers: { authorization: `Bearer ${credentials.secret_key}` } });
      expect(meters.status).toBe(200);
    } finally {
      login.child.kill();
    }
  });

  it('lets Lava.login() learn at once that the merchant pressed Cancel', async () => {
    const cancelDir = mkdtempSync(join(dir, 'cancel-'));
    const opener = fakeBrowserOpener(cancelDir);
    const script = `import { Lava } from '@lavapayments/nodejs';
await Lava.login({ baseUrl: ${JSON.stringify(baseUrl)} });`;
    const login = runCollecting(['--input-type=module', '-e', script], { ...process.env, PATH: opener.path });
    const ended = login.output.then(
      () => 'exited 0',
      (e: Error) => e.message,
    );
    const context = await browser.newContext();
    try {
      const { page } = await signInToConsent(context, await opener.opened(), EMAIL, PASSWORD);
      const cancelledAt = Date.now();
      await page.getByRole('button', { name: 'Cancel' }).click();
      const outcome = await ended;
      // The client rejects a callback without a code; its 120-second wait is not what ends it.
      expect(Date.now() - cancelledAt).toBeLessThan(10_000);
      expect(outcome).toMatch(/exited 1: .*code/s);
    } finally {
      login.child.kill();
      await context.close();
    }
  });

  it('refuses an approval posted without its CSRF token, so no code reaches the listener', async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`${baseUrl}/dashboard/sign-in`);
    await page.getByLabel('Email').fill(EMAIL);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForURL((u) => u.pathname === '/dashboard');
    const res = await page.request.post(`${baseUrl}/auth/connect`, {
      form: { state: 'a'.repeat(32), port: '45678' },
      maxRedirects: 0,
    });
    expect(res.status()).toBe(403);
    expect(res.headers().location).toBeUndefined();
    await context.close();
  });

  it('shows the authorization page accessibly, light, with only the loopback listener as an extra form target', async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(`${baseUrl}/dashboard/sign-in`);
    await page.getByLabel('Email').fill(EMAIL);
    await page.getByLabel('Password').fill(PASSWORD);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForURL((u) => u.pathname === '/dashboard');
    const url = `${baseUrl}/auth/connect?state=${'b'.repeat(32)}&port=45678`;
    const { bytes, foreign } = await loadWithWeight(page, url);
    expect(foreign).toEqual([]);
    expect(bytes).toBeLessThan(150 * 1024);
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    expect(await overflowAtPhoneWidth(page)).toBe(0);
    await screenshotBothWidths(page, 'cli-authorize');
    const csp = (await page.request.get(url)).headers()['content-security-policy'];
    expect(csp).toContain("form-action 'self' http://127.0.0.1:45678");
    expect(csp).toContain("script-src 'self'");
    // Reachable by keyboard: the first Tab is the skip link, and Approve is a focusable button.
    await page.keyboard.press('Tab');
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe('Skip to content');
    const focused: string[] = [];
    for (let i = 0; i < 10 && focused.at(-1) !== 'Approve'; i++) {
      await page.keyboard.press('Tab');
      focused.push((await page.evaluate(() => document.activeElement?.textContent)) ?? '');
    }
    expect(focused.at(-1)).toBe('Approve');
    await context.close();
  });
});
