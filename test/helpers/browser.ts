import { readFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';

/** Debian's chromium, installed by .ci/run; never a downloaded browser. */
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

export const SCREENSHOT_DIR = join(process.cwd(), 'test-artifacts', 'screenshots');
export const VIEWPORTS = { narrow: { width: 375, height: 800 }, wide: { width: 1280, height: 900 } } as const;

export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true });
}

const axeSource = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

type AxeViolation = { id: string; impact: string | null; help: string; nodes: { target: string[] }[] };

/**
 * axe-core run inside the page (evaluated through the DevTools protocol, so the page's CSP stays
 * strict): the serious and critical violations, as readable strings.
 */
export async function seriousAccessibilityViolations(page: Page): Promise<string[]> {
  await page.evaluate(axeSource);
  const violations = await page.evaluate(async () => {
    const axe = (globalThis as unknown as { axe: { run(): Promise<{ violations: AxeViolation[] }> } }).axe;
    return (await axe.run()).violations;
  });
  return violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
}

/**
 * How far the page is wider than a 375 px phone screen (0 when it fits: wide tables scroll inside
 * their own box, the page itself never scrolls sideways).
 */
export async function overflowAtPhoneWidth(page: Page): Promise<number> {
  const original = page.viewportSize();
  await page.setViewportSize(VIEWPORTS.narrow);
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  if (original) await page.setViewportSize(original);
  return overflow;
}

/** Screenshots of the current page at both widths, kept as test artefacts (gitignored). */
export async function screenshotBothWidths(page: Page, name: string): Promise<void> {
  mkdirSync(SCREENSHOT_DIR, { recursive: true });
  const original = page.viewportSize();
  for (const [label, size] of Object.entries(VIEWPORTS)) {
    await page.setViewportSize(size);
    await page.screenshot({ path: join(SCREENSHOT_DIR, `${name}-${size.width}.png`), fullPage: true });
    void label;
  }
  if (original) await page.setViewportSize(original);
}

/**
 * Loads a page and adds up every response body it fetched (document, styles, scripts), and lists
 * any request that left the server's origin.
 */
export async function loadWithWeight(page: Page, url: string): Promise<{ bytes: number; foreign: string[] }> {
  const origin = new URL(url).origin;
  const bodies: Promise<number>[] = [];
  const foreign: string[] = [];
  const onResponse = (response: import('playwright-core').Response) => {
    bodies.push(response.body().then((b) => b.length, () => 0));
  };
  const onRequest = (request: import('playwright-core').Request) => {
    if (!request.url().startsWith(origin) && !request.url().startsWith('data:')) foreign.push(request.url());
  };
  page.on('response', onResponse);
  page.on('request', onRequest);
  try {
    await page.goto(url, { waitUntil: 'load' });
    const sizes = await Promise.all(bodies);
    return { bytes: sizes.reduce((a, b) => a + b, 0), foreign };
  } finally {
    page.off('response', onResponse);
    page.off('request', onRequest);
  }
}
