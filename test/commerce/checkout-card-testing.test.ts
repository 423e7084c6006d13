import { Redis } from 'ioredis';
import { ulid } from 'ulid';
import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { MemoryRateLimiter, RedisRateLimiter, type RateLimiter } from '../../src/http/rate-limit.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { TEST_CARDS } from '../../src/payments/test-provider.ts';
import { ADDRESS_WINDOW_MS, DECLINES_PER_ADDRESS, DECLINES_PER_SESSION } from '../../src/web/checkout-limits.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { createCustomer, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * Card testing on the hosted checkout, over real HTTP: declines are limited per session (then the
 * session is locked) and per client address (the address the connection comes from: Linux routes
 * all of 127/8 to loopback, so two client addresses are two local source addresses). Time moves on
 * the app's clock. On PostgreSQL the address windows live in Redis when TEST_REDIS_URL is set.
 */
describe.each(databasesUnderTest())('card-testing limits on the hosted checkout on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  let redis: Redis | null = null;
  const agents = new Map<string, Agent>();

  beforeAll(async () => {
    let rateLimiter: RateLimiter = new MemoryRateLimiter();
    if (dialect === 'postgres' && process.env.TEST_REDIS_URL) {
      redis = new Redis(process.env.TEST_REDIS_URL, { maxRetriesPerRequest: 2 });
      rateLimiter = new RedisRateLimiter(redis, { prefix: `tollgate:test:${ulid()}:` });
    }
    t = await startTestApp(dialect, { rateLimiter });
    base = await t.listen();
  });
  afterAll(async () => {
    await Promise.all([...agents.values()].map((a) => a.close()));
    await t?.close();
    await redis?.quit();
  });
  afterEach(async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });

  /** A fresh address window, so that no test starts near the end of one. */
  const startOfNextWindow = () => t.clock.advance(ADDRESS_WINDOW_MS - (t.clock.now() % ADDRESS_WINDOW_MS) + 1000);

  const topUpSession = async () => {
    const { customerId, walletId } = await createCustomer(t);
    const res = await t.app.inject({ method: 'POST', url: '/v1/checkout_sessions', headers: t.auth(), payload: { checkout_mode: 'topup', customer_id: customerId, origin_url: 'https://shop.example.com/cart' } });
    expect(res.statusCode, res.body).toBe(201);
    return { token: res.json().checkout_session_token as string, walletId };
  };

  /** Posts the checkout form from the client address `from`. */
  const pay = async (from: string, token: string, card: string) => {
    let agent = agents.get(from);
    if (!agent) agents.set(from, (agent = new Agent({ localAddress: from })));
    const res = await undiciFetch(`${base}/checkout/pay`, {
      method: 'POST',
      dispatcher: agent,
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'text/html' },
      body: new URLSearchParams({ token, amount: '7', card_number: card }).toString(),
    });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.text() };
  };
  const chargesAtProvider = () => t.payments.charges.length;

  it('the limits below are the ones README.md and decision 0031 state: 5 a session, 10 an address per clock hour', () => {
    expect({ DECLINES_PER_SESSION, DECLINES_PER_ADDRESS, ADDRESS_WINDOW_MS }).toEqual({ DECLINES_PER_SESSION: 5, DECLINES_PER_ADDRESS: 10, ADDRESS_WINDOW_MS: 3_600_000 });
  });

  it(`a session is locked after ${DECLINES_PER_SESSION} declines: a hundred tries reach the provider ${DECLINES_PER_SESSION} times, and then even a good card cannot pay it`, async () => {
    startOfNextWindow();
    const { token, walletId } = await topUpSession();
    const before = chargesAtProvider();
    const statuses: number[] = [];
    for (let i = 0; i < 100; i++) statuses.push((await pay('127.0.0.1', token, TEST_CARDS.declined)).status);
    expect(statuses.slice(0, DECLINES_PER_SESSION)).toEqual(Array(DECLINES_PER_SESSION).fill(402));
    expect(new Set(statuses.slice(DECLINES_PER_SESSION))).toEqual(new Set([429]));
    expect(chargesAtProvider() - before).toBe(DECLINES_PER_SESSION);

    const good = await pay('127.0.0.1', token, TEST_CARDS.succeeds);
    expect(good.status).toBe(429);
    expect(good.body).toContain(`This checkout is locked after ${DECLINES_PER_SESSION} declined cards`);
    expect(good.body).not.toContain('action="/checkout/pay"');
    // Locked whoever asks: another address, whose own count is clean, is refused too.
    expect((await pay('127.0.0.2', token, TEST_CARDS.succeeds)).status).toBe(429);
    const opened = await t.app.inject({ method: 'GET', url: `/checkout?token=${encodeURIComponent(token)}` });
    expect(opened.statusCode).toBe(429);
    expect(opened.body).toContain('Checkout locked');
    expect(chargesAtProvider() - before).toBe(DECLINES_PER_SESSION);
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(0n);
  });

  it(`an address is refused after ${DECLINES_PER_ADDRESS} declines over any sessions until its window ends; another address is limited on its own`, async () => {
    startOfNextWindow();
    const sessionsNeeded = Math.ceil(DECLINES_PER_ADDRESS / DECLINES_PER_SESSION);
    for (let s = 0; s < sessionsNeeded; s++) {
      const { token } = await topUpSession();
      for (let i = 0; i < DECLINES_PER_SESSION; i++) expect((await pay('127.0.0.3', token, TEST_CARDS.declined)).status).toBe(402);
    }
    const fresh = await topUpSession();
    const before = chargesAtProvider();
    const refused = await pay('127.0.0.3', fresh.token, TEST_CARDS.succeeds);
    expect(refused.status).toBe(429);
    expect(refused.body).toContain('Too many declined cards from your network');
    expect(refused.body).toContain('action="/checkout/pay"');
    const retryAfter = Number(refused.retryAfter);
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(ADDRESS_WINDOW_MS / 1000);
    expect(chargesAtProvider()).toBe(before);

    // Another address: its own count, so one decline is a decline and a good card pays the same session.
    expect((await pay('127.0.0.4', fresh.token, TEST_CARDS.declined)).status).toBe(402);
    expect((await pay('127.0.0.4', fresh.token, TEST_CARDS.succeeds)).status).toBe(200);
    expect((await walletBuckets(t.storage, fresh.walletId)).balance).toBe(parseMoney('7'));

    // Once the window has passed, the first address may pay again.
    t.clock.advance(retryAfter * 1000);
    const later = await topUpSession();
    expect((await pay('127.0.0.3', later.token, TEST_CARDS.succeeds)).status).toBe(200);
    expect((await walletBuckets(t.storage, later.walletId)).balance).toBe(parseMoney('7'));
  });

  it('a payment the provider did not decline (a bad amount) counts against nothing', async () => {
    startOfNextWindow();
    const { token, walletId } = await topUpSession();
    for (let i = 0; i < DECLINES_PER_SESSION + 2; i++) {
      const res = await undiciFetch(`${base}/checkout/pay`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ token, amount: 'lots', card_number: TEST_CARDS.succeeds }).toString(),
      });
      expect(res.status).toBe(400);
      await res.text();
    }
    expect((await pay('127.0.0.5', token, TEST_CARDS.succeeds)).status).toBe(200);
    expect((await walletBuckets(t.storage, walletId)).balance).toBe(parseMoney('7'));
  });
});
