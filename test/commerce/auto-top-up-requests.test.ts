import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, saveTestCard, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { openaiHoldOf, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Auto top-up on the request path, over real HTTP: when a request on a meter linked to the
 * customer's plan is refused for want of money (cycle credit, bundle credit and prepaid balance
 * all spent), the subscription's auto top-up bundle is bought through the payment provider once,
 * however many requests are short at the same time, and the requests proceed. Without an auto
 * top-up bundle, on a meter the plan does not link, or with a card that is declined, it stays 402.
 */

const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
const PER_REQUEST = { name: 'Per request', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.25' }] };
const PER_TOKEN = { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '50' }] };
const chatBody = JSON.stringify({ model: 'gpt-4o', max_tokens: 2000, messages: [{ role: 'user', content: 'one two three four five' }] });

type Envelope = { error: { code: string } };

describe.each(databasesUnderTest())('auto top-up on the request path on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed-openai' } }));
  });
  afterEach(async () => {
    upstream.reset();
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  async function meter(definition: Record<string, unknown>): Promise<{ meter_id: string; meter_slug: string }> {
    return (await t.app.inject({ method: 'POST', url: '/v1/meters', headers: t.auth(), payload: definition })).json();
  }

  /** A customer on a free plan with `cycle` credit that links `meterIds`, optionally with an auto top-up bundle. */
  async function subscribed(opts: { cycle: string; meterIds: string[]; bundle?: { cost: string; credit_amount: string }; card?: 'succeeds' | 'declinesLater' }) {
    const plan = await createPlan(t, {
      name: 'Metered',
      period_amount: '0',
      included_credit: opts.cycle,
      billing_interval: 'month',
      meter_ids: opts.meterIds,
      credit_bundles: opts.bundle ? [{ name: 'Refill', ...opts.bundle }] : [],
      ...(opts.bundle ? { default_auto_top_up_bundle_index: 0 } : {}),
    });
    const customer = await createCustomer(t);
    await saveTestCard(t.storage, t.merchant.merchantId, customer.customerId, opts.card ?? 'succeeds');
    expect((await subscribe(t, customer.customerId, plan.plan_id)).statusCode).toBe(201);
    return customer;
  }

  function recordUsage(customerId: string, meterSlug: string): Promise<Response> {
    return fetch(`${base}/v1/requests`, {
      method: 'POST',
      headers: { ...t.auth(), 'content-type': 'application/json' },
      body: JSON.stringify({ request_id: `r-${crypto.randomUUID()}`, customer_id: customerId, meter_slug: meterSlug }),
    });
  }

  const autoTopUps = async (walletId: string) =>
    t.storage.db
      .selectFrom('payments')
      .innerJoin('connections', 'connections.id', 'payments.connection_id')
      .select(['payments.status', 'payments.amount'])
      .where('connections.wallet_id', '=', walletId)
      .where('payments.purpose', '=', 'auto_top_up')
      .execute();

  it('POST /v1/requests: cycle credit, then prepaid, then one bundle bought for 20 concurrent requests; all 20 recorded', async () => {
    const m = await meter(PER_REQUEST);
    const c = await subscribed({ cycle: '1', meterIds: [m.meter_id], bundle: { cost: '4', credit_amount: '4.5' } });
    await creditWallet(t.storage, c.walletId, parseMoney('0.5'), new Date().toISOString());

    // Four requests spend the cycle credit first; the prepaid balance is untouched.
    for (let i = 0; i < 4; i++) expect((await recordUsage(c.customerId, m.meter_slug)).status).toBe(201);
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ cycle: 0n, bundle: 0n, prepaid: parseMoney('0.5') });

    // 20 at once cost 5: 0.5 prepaid, then the 4.5 bundle, bought once mid-burst.
    const chargesBefore = t.payments.charges.length;
    const statuses = await Promise.all(Array.from({ length: 20 }, async () => (await recordUsage(c.customerId, m.meter_slug)).status));
    expect(statuses).toEqual(Array(20).fill(201));
    expect(t.payments.charges.slice(chargesBefore)).toEqual([expect.objectContaining({ amount: parseMoney('4'), status: 'succeeded' })]);
    expect(await autoTopUps(c.walletId)).toEqual([{ status: 'succeeded', amount: parseMoney('4') }]);
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ balance: 0n, cycle: 0n, bundle: 0n });

    // Spent to zero again: the next request buys the bundle a second time.
    expect((await recordUsage(c.customerId, m.meter_slug)).status).toBe(201);
    expect(await autoTopUps(c.walletId)).toHaveLength(2);
    expect((await walletBuckets(t.storage, c.walletId)).bundle).toBe(parseMoney('4.25'));
  });

  it('POST /v1/requests: 402 without an auto top-up bundle, on a meter the plan does not link, and when the card is declined', async () => {
    const linked = await meter(PER_REQUEST);
    const unlinked = await meter(PER_REQUEST);
    const plain = await subscribed({ cycle: '0.25', meterIds: [linked.meter_id] });
    expect((await recordUsage(plain.customerId, linked.meter_slug)).status).toBe(201);
    const refused = await recordUsage(plain.customerId, linked.meter_slug);
    expect(refused.status).toBe(402);
    expect(((await refused.json()) as Envelope).error.code).toBe('insufficient_balance');

    const withBundle = await subscribed({ cycle: '0', meterIds: [linked.meter_id], bundle: { cost: '1', credit_amount: '1' } });
    expect((await recordUsage(withBundle.customerId, unlinked.meter_slug)).status).toBe(402);
    expect(await autoTopUps(withBundle.walletId)).toEqual([]);

    const declined = await subscribed({ cycle: '0', meterIds: [linked.meter_id], bundle: { cost: '1', credit_amount: '1' }, card: 'declinesLater' });
    expect((await recordUsage(declined.customerId, linked.meter_slug)).status).toBe(402);
    expect(await autoTopUps(declined.walletId)).toEqual([{ status: 'failed', amount: parseMoney('1') }]);
    expect((await walletBuckets(t.storage, declined.walletId)).balance).toBe(0n);
  });

  /** The hold the gateway places for `chatBody` with this forward token (the customer pays all of it). */
  async function holdFor(token: string): Promise<bigint> {
    const estimate = await openaiHoldOf(t, token, JSON.parse(chatBody) as { model: string });
    expect(estimate.merchant).toBe(0n);
    return estimate.wallet;
  }

  const forward = (token: string) =>
    fetch(`${base}/v1/forward?${OPENAI_CHAT}`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: chatBody });
  const tokenOf = (customerId: string, meterSlug: string) =>
    forwardToken(t.merchant.secretKey, customerId, meterSlug);

  it('forward: 20 concurrent requests short of money buy the bundle once and are all forwarded', async () => {
    const m = await meter(PER_TOKEN);
    // The hold does not depend on the wallet, so a probe customer prices it first.
    const probe = await createCustomer(t);
    const hold = await holdFor(tokenOf(probe.customerId, m.meter_slug));
    const c = await subscribed({ cycle: formatMoney(hold / 2n), meterIds: [m.meter_id], bundle: { cost: '3', credit_amount: formatMoney(hold * 25n) } });
    const token = tokenOf(c.customerId, m.meter_slug);

    const chargesBefore = t.payments.charges.length;
    upstream.setNext({ path: '/chat/completions', delayMs: 200, times: 20 });
    const responses = await Promise.all(Array.from({ length: 20 }, () => forward(token)));
    const results = await Promise.all(responses.map(async (res) => ({ status: res.status, id: res.headers.get('x-tollgate-request-id'), text: await res.text() })));
    expect(results.map((r) => r.status)).toEqual(Array(20).fill(200));
    expect(t.payments.charges.slice(chargesBefore)).toEqual([expect.objectContaining({ amount: parseMoney('3'), status: 'succeeded' })]);
    expect(await autoTopUps(c.walletId)).toEqual([{ status: 'succeeded', amount: parseMoney('3') }]);
    for (const r of results) expect((await t.settledRecord(r.id)).status).toBe('completed');
    const after = await walletBuckets(t.storage, c.walletId);
    // Cycle credit went first; what is left is bundle credit.
    expect(after.cycle).toBe(0n);
    expect(after.balance).toBe(after.bundle);
    expect(after.bundle).toBeGreaterThan(0n);
  });

  it('forward: a request short only because of a hold in flight waits for it to settle (lower) and buys nothing', async () => {
    const m = await meter(PER_TOKEN);
    const probe = await createCustomer(t);
    const hold = await holdFor(tokenOf(probe.customerId, m.meter_slug));
    // A hold and a half: the second request fits the balance, not the balance less the first's hold.
    const c = await subscribed({ cycle: formatMoney(hold + hold / 2n), meterIds: [m.meter_id], bundle: { cost: '3', credit_amount: formatMoney(hold * 4n) } });
    const token = tokenOf(c.customerId, m.meter_slug);

    let release!: () => void;
    // The first answers 20 output tokens of the 2000 held for.
    upstream.setNext({ path: '/chat/completions', releasedBy: new Promise<void>((resolve) => (release = resolve)), outputTokens: 20 });
    const first = forward(token);
    const heldOf = async () => BigInt((await t.storage.db.selectFrom('wallets').select('held').where('id', '=', c.walletId).executeTakeFirstOrThrow()).held);
    await vi.waitFor(async () => expect(await heldOf()).toBeGreaterThan(0n));

    const chargesBefore = t.payments.charges.length;
    let secondEnded = false;
    const second = forward(token).finally(() => (secondEnded = true));
    // Decided against the hold, the bundle was bought at once and the second forwarded; it waits instead.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(secondEnded).toBe(false);
    expect(t.payments.charges.length).toBe(chargesBefore);
    release();
    expect((await first).status).toBe(200);
    const answered = await second;
    expect(answered.status, await answered.clone().text()).toBe(200);
    await answered.text();
    // The first settled far below its hold: nothing needed buying.
    expect(t.payments.charges.slice(chargesBefore)).toEqual([]);
    expect(await autoTopUps(c.walletId)).toEqual([]);
    await t.settledRecord(answered.headers.get('x-tollgate-request-id'));
  });

  it('POST /v1/requests: 60 concurrent requests, each bundle paying for 4: none refused, and bundles bought only for what was spent', async () => {
    const m = await meter(PER_REQUEST);
    const c = await subscribed({ cycle: '0', meterIds: [m.meter_id], bundle: { cost: '1', credit_amount: '1' } });
    const statuses = await Promise.all(Array.from({ length: 60 }, async () => (await recordUsage(c.customerId, m.meter_slug)).status));
    expect(statuses.filter((s) => s !== 201)).toEqual([]);
    // 60 × 0.25 = 15 spent: 15 bundles of 1, the last one spent to zero.
    expect(await autoTopUps(c.walletId)).toEqual(Array(15).fill({ status: 'succeeded', amount: parseMoney('1') }));
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ balance: 0n });
  });

  it('forward: 30 concurrent requests whose holds settle far lower are all forwarded, with bundles bought against what they spent, not what they held', async () => {
    const m = await meter(PER_TOKEN);
    const probe = await createCustomer(t);
    const hold = await holdFor(tokenOf(probe.customerId, m.meter_slug));
    // Each bundle covers two holds; the cycle credit one.
    const credit = hold * 2n;
    const c = await subscribed({ cycle: formatMoney(hold), meterIds: [m.meter_id], bundle: { cost: '2', credit_amount: formatMoney(credit) } });
    const token = tokenOf(c.customerId, m.meter_slug);
    // Each answers 20 output tokens of the 2000 held for.
    upstream.setNext({ path: '/chat/completions', delayMs: 30, times: 30, outputTokens: 20 });
    const responses = await Promise.all(Array.from({ length: 30 }, () => forward(token)));
    const results = await Promise.all(responses.map(async (res) => ({ status: res.status, id: res.headers.get('x-tollgate-request-id'), text: await res.text() })));
    expect(results.filter((r) => r.status !== 200).map((r) => r.text)).toEqual([]);
    let spent = 0n;
    for (const r of results) {
      const record = await t.settledRecord(r.id);
      expect(record.status).toBe('completed');
      spent += parseMoney(record.total_wallet_cost);
    }
    const bought = (await autoTopUps(c.walletId)).length;
    // A purchase is made only when the settled balance could not cover one more hold, so the balance
    // after the last one was below a hold and a bundle: the cycle credit and what was bought exceed
    // what was spent by less than that.
    expect(hold + BigInt(bought) * credit - spent).toBeLessThan(hold + credit);
    const after = await walletBuckets(t.storage, c.walletId);
    expect(after.balance).toBe(hold + BigInt(bought) * credit - spent);
  });

  it('forward: 402 before any provider call when there is no auto top-up bundle', async () => {
    const m = await meter(PER_TOKEN);
    const c = await subscribed({ cycle: '0', meterIds: [m.meter_id] });
    const before = upstream.requests.length;
    const res = await forward(tokenOf(c.customerId, m.meter_slug));
    expect(res.status).toBe(402);
    expect(((await res.json()) as Envelope).error.code).toBe('insufficient_balance');
    expect(upstream.requests.length).toBe(before);
  });
});
