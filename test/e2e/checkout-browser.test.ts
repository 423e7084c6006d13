import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { chromium, type Browser, type Frame, type Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { seriousAccessibilityViolations } from '../helpers/browser.ts';
import { createCustomer, createPlan, eventsOfType, walletBuckets } from '../helpers/commerce.ts';

const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'];

/**
 * The hosted checkout in real headless Chromium (Debian's, installed by .ci/run), embedded in an
 * iframe of a shop page on another origin, as a merchant's site would. SQLite only: the money path
 * is the same code on both engines and the API tests run it on PostgreSQL.
 */
describe('hosted checkout in Chromium', () => {
  let t: TestApp;
  let base: string;
  let browser: Browser;
  let shop: Server;
  let shopOrigin: string;
  let page: Page;

  beforeAll(async () => {
    t = await startTestApp('sqlite');
    base = await t.listen();
    // The shop embeds the checkout URL given in ?src= and keeps every message it receives.
    shop = createServer((req, res) => {
      const src = new URL(req.url ?? '/', 'http://shop').searchParams.get('src') ?? '';
      res.setHeader('content-type', 'text/html');
      res.end(`<!doctype html><title>Shop</title><script>window.received=[];addEventListener('message',e=>received.push({origin:e.origin,data:e.data}));</script>
<iframe id="checkout" title="Checkout" src="${src.replace(/"/g, '&quot;')}" width="400" height="700"></iframe>`);
    });
    await new Promise<void>((resolve) => shop.listen(0, '127.0.0.1', resolve));
    shopOrigin = `http://127.0.0.1:${(shop.address() as AddressInfo).port}`;
    browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS });
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await new Promise((resolve) => shop?.close(resolve));
    await t?.close();
  });
  afterEach(async () => {
    await page?.close();
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  const createSession = async (payload: Record<string, unknown>) => {
    // Over HTTP: the token's base is the URL the request reached.
    const res = await fetch(`${base}/v1/checkout_sessions`, {
      method: 'POST',
      headers: { ...t.auth(), 'content-type': 'application/json' },
      body: JSON.stringify({ origin_url: `${shopOrigin}/cart`, ...payload }),
    });
    const body = await res.json();
    expect(res.status, JSON.stringify(body)).toBe(201);
    expect(JSON.parse(Buffer.from(body.checkout_session_token, 'base64').toString())).toEqual({ secret: expect.stringMatching(/^css_/), base: `${base}/` });
    return body;
  };
  /** Opens the shop with the checkout embedded (a phone-sized viewport) and returns the checkout frame. */
  const openInShop = async (checkoutUrl: string): Promise<Frame> => {
    page = await browser.newPage({ viewport: { width: 375, height: 740 } });
    await page.goto(`${shopOrigin}/?src=${encodeURIComponent(checkoutUrl)}`);
    const frame = await (await page.waitForSelector('#checkout')).contentFrame();
    await frame!.waitForSelector('main');
    return frame!;
  };
  const messages = () => page.evaluate(() => (window as unknown as { received: unknown[] }).received);

  it('a top-up paid with the test card funds the wallet once, records checkout.completed and tells the shop', async () => {
    const { customerId, walletId } = await createCustomer(t);
    const session = await createSession({ checkout_mode: 'topup', connection_id: customerId });
    const frame = await openInShop(session.checkout_url);
    expect(await frame.textContent('.merchant')).toBe('Acme');
    await frame.getByLabel('Amount').fill('20');
    await frame.getByLabel('Card number').fill('4242 4242 4242 4242');
    await frame.getByRole('button', { name: 'Pay' }).click();
    await frame.waitForSelector('text=Payment received');

    expect(await walletBuckets(t.storage, walletId)).toMatchObject({ prepaid: parseMoney('20'), balance: parseMoney('20') });
    const completed = (await eventsOfType(t.storage, 'checkout.completed')).filter((e) => e.data.checkout_session_id === session.checkout_session_id);
    expect(completed).toHaveLength(1);
    expect(completed[0]!.data).toMatchObject({ customer_id: customerId, checkout_mode: 'topup', completed_at: expect.any(String) });
    await page.waitForFunction(() => (window as unknown as { received: unknown[] }).received.length > 0);
    expect(await messages()).toEqual([
      { origin: base, data: expect.objectContaining({ type: 'tollgate:checkout.completed', checkout_session_id: session.checkout_session_id, customer_id: customerId }) },
    ]);
    // Back to the exact page the shop gave; what was paid and credited recapped.
    expect(await frame.getAttribute('a.button', 'href')).toBe(`${shopOrigin}/cart`);
    expect(await frame.textContent('dl.recap')).toContain('20.00 USD');

    // The same token again: refused, nothing credited twice.
    const replay = await page.goto(session.checkout_url);
    expect(replay!.status()).toBe(410);
    expect(await page.textContent('h1')).toBe('Checkout completed');
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    expect(shown).toMatchObject({ completed_at: expect.any(String), customer_id: customerId, checkout_session_token: null });
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(parseMoney('20'));
  });

  it('a declined card changes nothing and can be followed by a card that pays', async () => {
    const { customerId, walletId } = await createCustomer(t);
    const session = await createSession({ checkout_mode: 'topup', customer_id: customerId });
    const frame = await openInShop(session.checkout_url);
    await frame.getByLabel('Amount').fill('5');
    await frame.getByLabel('Card number').fill(TEST_CARDS.declined);
    await frame.getByRole('button', { name: 'Pay' }).click();
    await frame.waitForSelector('[role=alert]');
    expect(await frame.textContent('[role=alert]')).toContain('declined');
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
    const row = await t.storage.db.selectFrom('checkout_sessions').selectAll().where('id', '=', session.checkout_session_id).executeTakeFirstOrThrow();
    expect(row.completed_at).toBeNull();
    expect(await messages()).toEqual([]);

    // The amount typed is still there; the card number is not.
    expect(await frame.getByLabel('Amount (USD)').inputValue()).toBe('5');
    expect(await frame.getByLabel('Card number').inputValue()).toBe('');
    await frame.getByLabel('Card number').fill(TEST_CARDS.succeeds);
    await frame.getByRole('button', { name: 'Pay' }).click();
    await frame.waitForSelector('text=Payment received');
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(parseMoney('5'));
  });

  it('an expired token is refused', async () => {
    const { customerId } = await createCustomer(t);
    const session = await createSession({ checkout_mode: 'topup', customer_id: customerId });
    // The session's lifetime has run out on the app's clock, which the page reads.
    await t.storage.db.updateTable('checkout_sessions').set({ expires_at: new Date(t.clock.now() - 1000).toISOString() }).where('id', '=', session.checkout_session_id).execute();
    page = await browser.newPage();
    const res = await page.goto(session.checkout_url);
    expect(res!.status()).toBe(410);
    expect(await page.textContent('h1')).toBe('Checkout expired');
    const forged = await page.goto(`${base}/checkout?token=${Buffer.from(JSON.stringify({ secret: 'css_forged', base })).toString('base64')}`);
    expect(forged!.status()).toBe(404);
  });

  it('a subscription checkout creates the customer and an active subscription with its cycle credit, through an extra confirmation step', async () => {
    const plan = await createPlan(t, { name: 'Pro', period_amount: '9.99', included_credit: '12', billing_interval: 'month' });
    const session = await createSession({ checkout_mode: 'subscription', plan_id: plan.plan_id, reference_id: 'order-77' });
    const frame = await openInShop(session.checkout_url);
    expect(await frame.textContent('h1')).toBe('Subscribe to Pro');
    expect(await frame.textContent('dl')).toContain('9.99 USD per month');
    await frame.getByLabel('Name (optional)').fill('Grace Hopper');
    await frame.getByLabel('Email (optional)').fill('grace@example.com');
    await frame.getByLabel('Card number').fill(TEST_CARDS.requiresAction);
    await frame.getByRole('button', { name: 'Pay 9.99 USD' }).click();
    await frame.getByRole('button', { name: 'Confirm payment' }).click();
    await frame.waitForSelector('text=Payment received');

    const shown = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    expect(shown).toMatchObject({ completed_at: expect.any(String), reference_id: 'order-77', subscription_id: expect.stringMatching(/^sub_/) });
    const { subscription } = (await t.app.inject({ method: 'GET', url: `/v1/customers/${shown.customer_id}/subscription`, headers: t.auth() })).json();
    expect(subscription).toMatchObject({ status: 'active', plan_id: plan.plan_id, credits: { cycle_remaining: '12.0000000000' } });
    const customer = (await t.app.inject({ method: 'GET', url: `/v1/customers/${shown.customer_id}`, headers: t.auth() })).json();
    expect(customer).toMatchObject({ reference_id: 'order-77', contact: { first_name: 'Grace', last_name: 'Hopper', email: 'grace@example.com' } });
    for (const type of ['customer.created', 'subscription.created', 'checkout.completed']) {
      const events = await eventsOfType(t.storage, type);
      expect(events.some((e) => e.data.customer_id === shown.customer_id), type).toBe(true);
    }
    expect(t.payments.charges.filter((c) => c.amount === parseMoney('9.99'))).toHaveLength(1);
  });

  it('serves the page with a strict CSP whose frame-ancestors is the session origin, and no external assets', async () => {
    const { customerId } = await createCustomer(t);
    const session = await createSession({ checkout_mode: 'topup', customer_id: customerId });
    page = await browser.newPage();
    const requested: string[] = [];
    page.on('request', (r) => requested.push(r.url()));
    const res = await page.goto(session.checkout_url);
    const csp = res!.headers()['content-security-policy'];
    expect(csp).toContain(`frame-ancestors ${shopOrigin}`);
    expect(csp).toContain("default-src 'none'");
    expect(csp).toContain("script-src 'self'");
    expect(requested.every((u) => u.startsWith(base))).toBe(true);
    // Every input has a label.
    const unlabelled = await page.$$eval('input:not([type=hidden])', (inputs) => inputs.filter((i) => !(i as HTMLInputElement).labels?.length).length);
    expect(unlabelled).toBe(0);
  });

  it('shows the currency, a recap after paying and a receipt that stays, all axe-clean, and returns to the exact page the shop gave', async () => {
    const { customerId } = await createCustomer(t);
    const origin = `${shopOrigin}/account/billing?tab=credits&from=checkout`;
    const session = await createSession({ checkout_mode: 'topup', customer_id: customerId, origin_url: origin });
    page = await browser.newPage({ viewport: { width: 375, height: 740 } });
    await page.goto(session.checkout_url);
    expect(await page.getByLabel('Amount (USD)').count()).toBe(1);
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    await page.getByLabel('Amount (USD)').fill('12.5');
    await page.getByLabel('Card number').fill(TEST_CARDS.declined);
    await page.getByRole('button', { name: 'Pay' }).click();
    await page.waitForSelector('[role=alert]');
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    expect(await page.getByLabel('Amount (USD)').inputValue()).toBe('12.5');
    await page.getByLabel('Card number').fill(TEST_CARDS.succeeds);
    await page.getByRole('button', { name: 'Pay' }).click();
    await page.waitForSelector('text=Payment received');
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    const recap = Object.fromEntries(
      await page.$$eval('dl.recap dt', (dts) => dts.map((dt) => [dt.textContent, (dt.nextElementSibling as HTMLElement).textContent])),
    );
    const shown = (await t.app.inject({ method: 'GET', url: `/v1/checkout_sessions/${session.checkout_session_id}`, headers: t.auth() })).json();
    const payment = await t.storage.db.selectFrom('payments').selectAll().where('reference', '=', session.checkout_session_id).executeTakeFirstOrThrow();
    expect(recap).toEqual({
      Item: 'Wallet top-up',
      Paid: '12.50 USD',
      Credited: '12.50 USD prepaid balance',
      Date: `${shown.completed_at.slice(0, 10)} ${shown.completed_at.slice(11, 16)} UTC`,
      'Payment reference': payment.id,
    });

    // Back to the shop's own page, path and query as given.
    const receiptHref = (await page.getByRole('link', { name: 'Your receipt' }).getAttribute('href'))!;
    await page.getByRole('link', { name: /^Return to/ }).click();
    await page.waitForURL(origin);
    expect(page.url()).toBe(origin);

    // The receipt: the page links it, the API gives the same link (asked in process, so with the
    // host that request reached), and it opens again later.
    const receiptAt = new URL(shown.receipt_url);
    expect(receiptHref).toBe(`${receiptAt.pathname}${receiptAt.search}`);
    for (let i = 0; i < 2; i++) {
      const res = await page.goto(`${base}${receiptHref}`);
      expect(res!.status()).toBe(200);
      expect(await page.textContent('h1')).toBe('Receipt');
      expect(await page.textContent('dl.recap')).toContain('12.50 USD prepaid balance');
    }
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
  });
});
