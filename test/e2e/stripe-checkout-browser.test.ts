import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Browser, Page } from 'playwright-core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { launchChromium, seriousAccessibilityViolations } from '../helpers/browser.ts';
import { TestClock } from '../helpers/clock.ts';
import { walletBuckets } from '../helpers/commerce.ts';
import { closeStripeApp, listenForStripe, startAppOnStripeStandIn, type StripeApp } from '../helpers/stripe-app.ts';

/**
 * The hosted checkout with Stripe in real headless Chromium: embedded in a shop's iframe, the
 * form sends the whole window to Stripe Checkout (the local stand-in's hosted page), where the
 * card is typed; Stripe sends the customer back to Tollgate's success page and sends its signed
 * events, before or after that return. A decline and a 3-D Secure step happen on Stripe's page.
 * The instance's currency is EUR, shown on both pages. SQLite only: the money path is the same
 * code on both engines and test/commerce/stripe-checkout.test.ts runs it on PostgreSQL.
 */
const SECRET_KEY = 'sk_test_tollgate_browser';
const WEBHOOK_SECRET = 'whsec_tollgate_browser';

describe('hosted checkout with Stripe Checkout in Chromium', () => {
  const clock = new TestClock();
  let started: StripeApp;
  let base: string;
  let browser: Browser;
  let shop: Server;
  let shopOrigin: string;
  let page: Page;

  beforeAll(async () => {
    started = await startAppOnStripeStandIn('sqlite', clock, { apiKey: SECRET_KEY, webhookSecret: WEBHOOK_SECRET }, { CURRENCY: 'EUR' });
    base = await listenForStripe(started, clock, WEBHOOK_SECRET);
    // The shop embeds the checkout URL given in ?src=.
    shop = createServer((req, res) => {
      const src = new URL(req.url ?? '/', 'http://shop').searchParams.get('src') ?? '';
      res.setHeader('content-type', 'text/html');
      res.end(`<!doctype html><title>Shop</title><h1>Shop</h1><iframe id="checkout" title="Checkout" src="${src.replace(/"/g, '&quot;')}" width="400" height="700"></iframe>`);
    });
    await new Promise<void>((resolve) => shop.listen(0, '127.0.0.1', resolve));
    shopOrigin = `http://127.0.0.1:${(shop.address() as AddressInfo).port}`;
    browser = await launchChromium();
  }, 60_000);
  afterAll(async () => {
    await browser?.close();
    await new Promise((resolve) => shop?.close(resolve));
    await closeStripeApp(started);
  });
  afterEach(async () => {
    await page?.close();
    started.stripeApi.setWebhookTiming('immediate');
    expect(started.stripeApi.problems).toEqual([]);
    expect((await verifyLedger(started.storage)).problems).toEqual([]);
  });

  async function createSession(payload: Record<string, unknown>) {
    const res = await fetch(`${base}/v1/checkout_sessions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${started.secretKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ origin_url: `${shopOrigin}/account?tab=billing`, ...payload }),
    });
    const body = await res.json();
    expect(res.status, JSON.stringify(body)).toBe(201);
    return body as { checkout_session_id: string; checkout_url: string };
  }
  const customerOf = async (sessionId: string) => {
    const row = await started.storage.db.selectFrom('checkout_sessions').select('connection_id').where('id', '=', sessionId).executeTakeFirstOrThrow();
    return row.connection_id ? started.storage.db.selectFrom('connections').select(['id', 'wallet_id']).where('id', '=', row.connection_id).executeTakeFirstOrThrow() : null;
  };
  const creditsOf = async (sessionId: string) => {
    const ids = (await started.storage.db.selectFrom('payments').select('id').where('reference', 'like', `${sessionId}%`).execute()).map((p) => p.id);
    return (await started.storage.db.selectFrom('ledger_transactions').select('id').where('reference', 'in', ids).execute()).length;
  };
  /** Opens the shop with the checkout in its iframe (a phone-sized viewport) and returns the frame. */
  async function openInShop(checkoutUrl: string) {
    page = await browser.newPage({ viewport: { width: 375, height: 740 } });
    await page.goto(`${shopOrigin}/?src=${encodeURIComponent(checkoutUrl)}`);
    const frame = (await (await page.waitForSelector('#checkout')).contentFrame())!;
    await frame.waitForSelector('main');
    return frame;
  }
  /** On the stand-in's page (the whole window): types the card and presses its pay button. */
  async function payOnStripe(card: string) {
    await page.waitForURL(`${started.stripeApi.url}/c/pay/**`);
    await page.getByLabel('Card number').fill(card);
    await page.getByRole('button', { name: /^(Pay|Save card)/ }).click();
  }

  it('a top-up from the shop iframe goes to Stripe in the whole window, comes back paid, and is credited once by the event that came first', async () => {
    const session = await createSession({ checkout_mode: 'onboarding' });
    const frame = await openInShop(session.checkout_url);
    expect(await frame.getByText("Next you enter your card on the payment provider's secure page.").count()).toBe(1);
    expect(await frame.getByLabel('Card number').count()).toBe(0);
    await frame.getByLabel('Amount (EUR)').fill('20');
    await frame.getByLabel('Name (optional)').fill('Ada Lovelace');
    await frame.getByRole('button', { name: 'Pay' }).click();

    await page.waitForURL(`${started.stripeApi.url}/c/pay/**`);
    expect(await page.textContent('#amount')).toBe('20.00 EUR');
    await payOnStripe('4242 4242 4242 4242');
    await page.waitForURL(`${base}/checkout/return?**`);
    await page.waitForSelector('text=Payment received');
    expect(await page.textContent('dl.recap')).toContain('20.00 EUR');
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    expect(started.stripeApi.deliveries.map((d) => `${d.type}: ${JSON.parse(d.body).result}`).slice(-2)).toEqual([
      'payment_intent.succeeded: credited',
      'checkout.session.completed: unchanged',
    ]);

    const customer = (await customerOf(session.checkout_session_id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('20'));
    expect(await creditsOf(session.checkout_session_id)).toBe(1);
    await page.getByRole('link', { name: /^Return to/ }).click();
    await page.waitForURL(`${shopOrigin}/account?tab=billing`);
  });

  it("a card declined on Stripe's page, then one that pays, with Stripe's events after the return: credited once", async () => {
    const session = await createSession({ checkout_mode: 'onboarding' });
    started.stripeApi.setWebhookTiming('held');
    page = await browser.newPage({ viewport: { width: 375, height: 740 } });
    await page.goto(session.checkout_url);
    expect(await seriousAccessibilityViolations(page)).toEqual([]);
    await page.getByLabel('Amount (EUR)').fill('12.50');
    await page.getByRole('button', { name: 'Pay' }).click();

    await payOnStripe('4000000000000002');
    expect(await page.textContent('[role=alert]')).toContain('Your card was declined.');
    expect(await customerOf(session.checkout_session_id)).toBeNull();
    await payOnStripe('4242424242424242');
    await page.waitForSelector('text=Payment received');
    const customer = (await customerOf(session.checkout_session_id))!;
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('12.5'));

    const late = await started.stripeApi.deliverHeld();
    expect(late.map((d) => `${d.type}: ${JSON.parse(d.body).result}`)).toEqual([
      'payment_intent.payment_failed: unchanged',
      'payment_intent.succeeded: unchanged',
      'checkout.session.completed: unchanged',
    ]);
    expect((await walletBuckets(started.storage, customer.wallet_id)).prepaid).toBe(parseMoney('12.5'));
    expect(await creditsOf(session.checkout_session_id)).toBe(1);
    // Reloading the success page credits nothing more.
    await page.reload();
    await page.waitForSelector('text=Payment received');
    expect(await creditsOf(session.checkout_session_id)).toBe(1);
  });

  it('a subscription whose card needs 3-D Secure: the step on Stripe\'s page, then an active subscription with its cycle credit', async () => {
    const plan = await (
      await fetch(`${base}/v1/plans`, {
        method: 'POST',
        headers: { authorization: `Bearer ${started.secretKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'Pro', period_amount: '9.99', included_credit: '12', billing_interval: 'month' }),
      })
    ).json();
    const session = await createSession({ checkout_mode: 'subscription', plan_id: plan.plan_id });
    page = await browser.newPage({ viewport: { width: 375, height: 740 } });
    await page.goto(session.checkout_url);
    expect(await page.textContent('dl')).toContain('9.99 EUR per month');
    await page.getByRole('button', { name: 'Pay 9.99 EUR' }).click();
    await payOnStripe('4000002500003155');
    await page.getByRole('button', { name: 'Complete authentication' }).click();
    await page.waitForSelector('text=Payment received');
    expect(await page.textContent('dl.recap')).toContain('9.99 EUR');

    const customer = (await customerOf(session.checkout_session_id))!;
    const res = await fetch(`${base}/v1/customers/${customer.id}/subscription`, { headers: { authorization: `Bearer ${started.secretKey}` } });
    expect((await res.json()).subscription).toMatchObject({ status: 'active', plan_id: plan.plan_id, credits: { cycle_remaining: '12.0000000000' } });
    const method = await started.storage.db.selectFrom('payment_methods').selectAll().where('connection_id', '=', customer.id).executeTakeFirstOrThrow();
    expect(method.label).toBe('Visa ending 3155');
  });
});
