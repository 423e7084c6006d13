import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMerchant } from '../../src/storage/merchants.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { launchChromium } from '../helpers/browser.ts';

const EMAIL = 'Owner@CLI.example';
const PASSWORD = 'correct horse battery';

/**
 * Runs the published client's `Lava.login()` in its own process. Instead of a desktop browser its
 * `xdg-open` is a script that writes the authorization URL to a file, which the test's Chromium opens.
 */
function runLavaLogin(baseUrl: string, dir: string): { child: ChildProcess; output: Promise<string>; urlFile: string } {
  const urlFile = join(dir, 'opened-url');
  const opener = join(dir, 'xdg-open');
  writeFileSync(opener, `#!/bin/sh\nprintf '%s' "$1" > '${urlFile}'\n`);
  chmodSync(opener, 0o755);
  const script = `import { Lava } from '@lavapayments/nodejs';
const credentials = await Lava.login({ baseUrl: ${JSON.stringify(baseUrl)} });
process.stdout.write(JSON.stringify(credentials));`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
    cwd: process.cwd(),
    env: { ...process.env, PATH: `${dir}:${process.env.PATH}` },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output = new Promise<string>((resolve, reject) => {
    let out = '';
    let err = '';
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`Lava.login exited ${code}: ${err}`))));
  });
  return { child, output, urlFile };
}

async function waitForFile(path: string, timeoutMs = 10_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(path) || readFileSync(path, 'utf8') === '') {
    if (Date.now() > deadline) throw new Error(`${path} was not written within ${timeoutMs} ms`);
    await sleep(20);
  }
  return readFileSync(path, 'utf8');
}

describe('CLI login with the published client (Chromium)', () => {
  let t: TestApp;
  let browser: Browser;
  let baseUrl: string;
  let dir: string;

  beforeAll(async () => {
    t = await startTestApp('sqlite');
    await createMerchant(t.storage, { name: 'CLI Owner', email: EMAIL, password: PASSWORD });
    baseUrl = await t.listen();
    browser = await launchChromium();
    dir = mkdtempSync(join(tmpdir(), 'tollgate-cli-login-'));
  });
  afterAll(async () => {
    await browser?.close();
    await t?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('signs in first, approves, and hands Lava.login() credentials that work', async () => {
    const login = runLavaLogin(baseUrl, dir);
    try {
      const authUrl = await waitForFile(login.urlFile);
      expect(authUrl).toMatch(new RegExp(`^${baseUrl}/auth/connect\\?state=[0-9a-f]{32}&port=\\d+$`));

      const page = await browser.newPage();
      await page.goto(authUrl);
      // Not signed in: the sign-in page, which comes back to the authorization afterwards.
      expect(new URL(page.url()).pathname).toBe('/dashboard/sign-in');
      await page.getByLabel('Email').fill(EMAIL.toLowerCase());
      await page.getByLabel('Password').fill(PASSWORD);
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.waitForURL((u) => u.pathname === '/auth/connect');
      expect(await page.textContent('main')).toContain('CLI Owner');
      await page.getByRole('button', { name: 'Approve' }).click();
      await page.waitForURL((u) => u.pathname === '/callback');
      expect(await page.textContent('body')).toContain('logged in');

      const credentials = JSON.parse(await login.output);
      expect(credentials.secret_key).toMatch(/^sk_live_/);
      expect(credentials.account_id).toBe(credentials.merchant_id);
      const meters = await fetch(`${baseUrl}/v1/meters`, { headers: { authorization: `Bearer ${credentials.secret_key}` } });
      expect(meters.status).toBe(200);
      await page.close();
    } finally {
      login.child.kill();
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
});
