import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { until } from './until.ts';

/**
 * Stands in for the desktop's `xdg-open`: a script, first on PATH, that writes the URL a login
 * command wanted to open into a file, which the test's Chromium then opens.
 */
export function fakeBrowserOpener(dir: string): { path: string; opened(): Promise<string> } {
  const urlFile = join(dir, 'opened-url');
  const opener = join(dir, 'xdg-open');
  writeFileSync(opener, `#!/bin/sh\nprintf '%s' "$1" > '${urlFile}'\n`);
  chmodSync(opener, 0o755);
  return { path: `${dir}:${process.env.PATH}`, opened: () => writtenFile(urlFile) };
}

/** The file's text once something was written to it (a CLI starting up can take seconds). */
function writtenFile(path: string, timeoutMs = 15_000): Promise<string> {
  return until(() => (existsSync(path) && readFileSync(path, 'utf8')) || undefined, `${path} to be written`, { timeoutMs, intervalMs: 20 });
}

/** A child process whose stdout is collected; resolves when it exits 0, rejects with its stderr otherwise. */
export function runCollecting(args: string[], env: NodeJS.ProcessEnv): { child: ChildProcess; output: Promise<string> } {
  const child = spawn(process.execPath, args, { cwd: process.cwd(), env, stdio: ['ignore', 'pipe', 'pipe'] });
  const output = new Promise<string>((resolve, reject) => {
    let out = '';
    let err = '';
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${args.join(' ')} exited ${code}: ${err}`))));
  });
  return { child, output };
}

/**
 * Opens an authorization URL in `context`, signs in on the page a visitor is sent to first, and
 * returns the consent page it comes back to, and whether the sign-in page came first.
 */
export async function signInToConsent(context: BrowserContext, authUrl: string, email: string, password: string): Promise<{ page: Page; signInFirst: boolean }> {
  const page = await context.newPage();
  await page.goto(authUrl);
  const signInFirst = new URL(page.url()).pathname === '/dashboard/sign-in';
  await page.getByLabel('Email').fill(email);
  await page.getByLabel('Password').fill(password);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((u) => u.pathname === '/auth/connect');
  return { page, signInFirst };
}

/**
 * Opens an authorization URL in a fresh browser context, signs in (the page sends a visitor there
 * first), approves, and returns the text the login command's listener answered with.
 */
export async function signInAndApprove(browser: Browser, authUrl: string, email: string, password: string): Promise<{ signInFirst: boolean; shownMerchant: string; callbackText: string }> {
  const context = await browser.newContext();
  try {
    const { page, signInFirst } = await signInToConsent(context, authUrl, email, password);
    const shownMerchant = (await page.textContent('main')) ?? '';
    await page.getByRole('button', { name: 'Approve' }).click();
    await page.waitForURL((u) => u.pathname === '/callback');
    return { signInFirst, shownMerchant, callbackText: (await page.textContent('body')) ?? '' };
  } finally {
    await context.close();
  }
}
