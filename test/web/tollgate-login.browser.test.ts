import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { launchChromium } from '../helpers/browser.ts';
import { tollgate } from '../helpers/cli.ts';
import { fakeBrowserOpener, runCollecting, signInAndApprove, signInToConsent } from '../helpers/cli-login.ts';

const EMAIL = 'ops@terminal.example';
const PASSWORD = 'terminal password 1';

describe('tollgate login, whoami, logout (Chromium)', () => {
  let t: TestApp;
  let browser: Browser;
  let baseUrl: string;
  let dir: string;
  let merchantId: string;

  beforeAll(async () => {
    t = await startTestApp('sqlite');
    merchantId = (await createMerchant(t.storage, { name: 'Terminal Co', email: EMAIL, password: PASSWORD }, new Date().toISOString())).merchant.id;
    baseUrl = await t.listen();
    browser = await launchChromium();
    dir = mkdtempSync(join(tmpdir(), 'tollgate-login-'));
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('exits at once with a clear message when the merchant presses Cancel, and creates no key', async () => {
    const cancelDir = mkdtempSync(join(dir, 'cancel-'));
    const env = { XDG_CONFIG_HOME: join(cancelDir, 'config'), TOLLGATE_API_URL: '', TOLLGATE_SECRET_KEY: '' };
    const opener = fakeBrowserOpener(cancelDir);
    const login = runCollecting(['bin/tollgate.js', 'login', '--server', baseUrl], { ...process.env, ...env, PATH: opener.path, LOG_LEVEL: 'silent' });
    const ended = login.output.then(
      () => 'exited 0',
      (e: Error) => e.message,
    );
    const keysBefore = await t.storage.db.selectFrom('secret_keys').select('id').where('merchant_id', '=', merchantId).execute();
    const context = await browser.newContext();
    try {
      const { page } = await signInToConsent(context, await opener.opened(), EMAIL, PASSWORD);
      const cancelledAt = Date.now();
      await page.getByRole('button', { name: 'Cancel' }).click();
      await page.waitForURL((u) => u.pathname === '/callback' && u.searchParams.get('error') === 'access_denied');
      expect(await page.textContent('body')).toContain('login cancelled');
      const outcome = await ended;
      // Well before the 120-second wait for an approval would have ended.
      expect(Date.now() - cancelledAt).toBeLessThan(10_000);
      expect(outcome).toMatch(/exited 1: .*Login cancelled in the browser; no key was created/s);
    } finally {
      login.child.kill();
      await context.close();
    }
    const keysAfter = await t.storage.db.selectFrom('secret_keys').select('id').where('merchant_id', '=', merchantId).execute();
    expect(keysAfter).toEqual(keysBefore);
    expect(existsSync(join(cancelDir, 'config', 'tollgate', 'credentials.json'))).toBe(false);
  });

  it('logs in through the browser, keeps the key in a 0600 file that other commands use, and logs out', async () => {
    const configHome = join(dir, 'config');
    const env = { XDG_CONFIG_HOME: configHome, TOLLGATE_API_URL: '', TOLLGATE_SECRET_KEY: '' };
    const opener = fakeBrowserOpener(dir);
    const login = runCollecting(['bin/tollgate.js', 'login', '--server', baseUrl], { ...process.env, ...env, PATH: opener.path, LOG_LEVEL: 'silent' });
    try {
      const authUrl = await opener.opened();
      expect(authUrl.startsWith(`${baseUrl}/auth/connect?state=`)).toBe(true);
      await signInAndApprove(browser, authUrl, EMAIL, PASSWORD);
      const answer = JSON.parse(await login.output);
      expect(answer).toMatchObject({ logged_in: true, merchant_id: merchantId, server: baseUrl });
    } finally {
      login.child.kill();
    }

    const file = join(configHome, 'tollgate', 'credentials.json');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const stored = JSON.parse(readFileSync(file, 'utf8'));
    expect(stored.secret_key).toMatch(/^sk_live_/);

    const whoami = await tollgate(['whoami'], env);
    expect(whoami.code).toBe(0);
    expect(JSON.parse(whoami.stdout)).toMatchObject({ merchant_id: merchantId, server: baseUrl });

    // No --secret-key, no TOLLGATE_SECRET_KEY, no --api-url: the stored login is used.
    const list = await tollgate(['webhooks', 'list'], env);
    expect(list.code, list.stderr).toBe(0);
    expect(JSON.parse(list.stdout).data).toEqual([]);

    const logout = await tollgate(['logout'], env);
    expect(JSON.parse(logout.stdout)).toEqual({ logged_out: true, key_revoked: true });
    expect(existsSync(file)).toBe(false);
    const revoked = await fetch(`${baseUrl}/v1/meters`, { headers: { authorization: `Bearer ${stored.secret_key}` } });
    expect(revoked.status).toBe(401);
    const after = await tollgate(['whoami'], env);
    expect(after.code).toBe(1);
    expect(after.stderr).toContain('Not logged in');
  });
});
