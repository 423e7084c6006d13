/**
 * Dashboard pages in real Chromium against a real server process over loopback: for every page in
 * the dashboard's navigation, the time until the document is interactive (`domInteractive` of the
 * navigation timing) and until `load`, over several visits after one warm-up, and the bytes it
 * transferred. The targets: interactive in under 1 s, under 150 KB transferred.
 *
 * The merchant has a meter, customers and a few hundred recorded requests, so the overview's
 * charts, the requests log and the customer list draw real rows.
 */
import { existsSync } from 'node:fs';
import { chromium, type Page } from 'playwright-core';
import { parseMoney } from '../src/domain/money.ts';
import { creditWallet } from '../src/ledger/wallets.ts';
import type { Storage } from '../src/storage/db.ts';
import { createMerchant } from '../src/storage/merchants.ts';
import { NAV } from '../src/web/dashboard/shell.ts';

type Row = { scenario: string; engine: string; result: string; target: string };

const CHROMIUM = '/usr/bin/chromium';
const EMAIL = 'pages-bench@example.com';
const PASSWORD = 'a bench password that is long';
const INTERACTIVE_TARGET_MS = 1000;
const WEIGHT_TARGET_BYTES = 150 * 1024;

export async function benchPages(opts: { engine: string; storage: Storage; serverUrl: string; visits: number; requests: number }): Promise<Row[]> {
  if (!existsSync(CHROMIUM)) {
    console.warn(`No ${CHROMIUM}: the dashboard pages scenario is skipped (apt-get install chromium).`);
    return [];
  }
  await seedMerchant(opts.storage, opts.serverUrl, opts.requests);
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    await signIn(page, opts.serverUrl);
    const rows: Row[] = [];
    for (const [path, title] of NAV) {
      const visits: Visit[] = [];
      await visit(page, `${opts.serverUrl}${path}`); // warm-up: caches and JIT, not measured
      for (let i = 0; i < opts.visits; i++) visits.push(await visit(page, `${opts.serverUrl}${path}`));
      const interactive = visits.map((v) => v.interactiveMs).sort((a, b) => a - b);
      const load = visits.map((v) => v.loadMs).sort((a, b) => a - b);
      const bytes = Math.max(...visits.map((v) => v.bytes));
      const line = `interactive p50 ${median(interactive).toFixed(0)} ms, max ${interactive.at(-1)!.toFixed(0)} ms; load p50 ${median(load).toFixed(0)} ms; ${(bytes / 1024).toFixed(1)} KB`;
      console.log(`${title} (${path}): ${line}`);
      rows.push({
        scenario: `Dashboard page ${title} (${path}), ${opts.visits} visits`,
        engine: opts.engine,
        result: line,
        target: `interactive < ${INTERACTIVE_TARGET_MS} ms (${interactive.at(-1)! < INTERACTIVE_TARGET_MS ? 'met' : 'MISSED'}), < 150 KB (${bytes < WEIGHT_TARGET_BYTES ? 'met' : 'MISSED'})`,
      });
    }
    return rows;
  } finally {
    await browser.close();
  }
}

type Visit = { interactiveMs: number; loadMs: number; bytes: number };

/** A cold navigation (no HTTP cache between visits), timed by the browser's own navigation timing. */
async function visit(page: Page, url: string): Promise<Visit> {
  await page.goto('about:blank');
  const response = await page.goto(url, { waitUntil: 'load' });
  if (!response?.ok()) throw new Error(`pages bench: ${url} answered ${response?.status()}`);
  return page.evaluate(() => {
    const nav = performance.getEntriesByType('navigation')[0] as PerformanceNavigationTiming;
    const resources = performance.getEntriesByType('resource') as PerformanceResourceTiming[];
    const bytes = nav.transferSize + resources.reduce((sum, r) => sum + r.transferSize, 0);
    return { interactiveMs: nav.domInteractive - nav.startTime, loadMs: nav.loadEventEnd - nav.startTime, bytes };
  });
}

async function signIn(page: Page, base: string): Promise<void> {
  await page.goto(`${base}/dashboard/sign-in`);
  await page.getByLabel('Email').fill(EMAIL);
  await page.getByLabel('Password').fill(PASSWORD);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.waitForURL((u) => u.pathname === '/dashboard');
  // Every visit is a cold load: nothing comes from the browser's cache.
  const cdp = await page.context().newCDPSession(page);
  await cdp.send('Network.setCacheDisabled', { cacheDisabled: true });
}

/** A merchant with a meter, ten funded customers and `requests` recorded requests spread over them. */
async function seedMerchant(storage: Storage, url: string, requests: number): Promise<void> {
  const { secretKey } = await createMerchant(storage, { name: 'Pages bench', email: EMAIL, password: PASSWORD }, new Date().toISOString());
  const headers = { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' };
  const post = async (path: string, body: object): Promise<Record<string, unknown>> => {
    const res = await fetch(`${url}/v1${path}`, { method: 'POST', headers, body: JSON.stringify(body) });
    if (!res.ok) throw new Error(`pages bench: POST ${path} answered ${res.status}: ${await res.text()}`);
    return (await res.json()) as Record<string, unknown>;
  };
  const meter = await post('/meters', { name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '2.5' }] });
  const customers: string[] = [];
  for (let i = 0; i < 10; i++) {
    const customer = (await post('/customers', { reference_id: `pages-${i}` })) as { customer_id: string; wallet: { wallet_id: string } };
    await creditWallet(storage, customer.wallet.wallet_id, parseMoney('1000'), new Date().toISOString());
    customers.push(customer.customer_id);
  }
  for (let i = 0; i < requests; i++) {
    await post('/requests', {
      request_id: `pages-${i}`,
      customer_id: customers[i % customers.length],
      meter_slug: meter.meter_slug,
      input_tokens: 500 + i,
      output_tokens: 100 + (i % 50),
      metadata: { feature: i % 2 ? 'chat' : 'search' },
    });
  }
}

function median(sorted: number[]): number {
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}
