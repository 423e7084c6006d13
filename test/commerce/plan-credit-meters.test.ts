import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, type TestApp } from '../helpers/app.ts';
import { createCustomer, createPlan, subscribe, walletBuckets } from '../helpers/commerce.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { openaiHoldOf, startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Plan credit pays only usage on the meters the plan links (decision 0016): such usage draws cycle
 * credit, then bundle credit, then the prepaid balance; usage on any other meter draws the prepaid
 * balance only, and is refused (402) when the prepaid balance cannot cover it, however much plan
 * credit is left. Over real HTTP, on POST /v1/requests and forwarded calls, on both engines (the
 * forward gateway's admission runs in process on SQLite, in the database on PostgreSQL, and from
 * wallet leases on PostgreSQL with WALLET_LEASE_HOT_AFTER=0).
 */

const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
const PER_REQUEST = { name: 'Per request', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.25' }] };
const PER_TOKEN = { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '50' }] };
const chatBody = JSON.stringify({ model: 'gpt-4o', max_tokens: 2000, messages: [{ role: 'user', content: 'one two three four five' }] });

type Setup = { name: string; dialect: 'sqlite' | 'postgres'; env: Record<string, string> };
const setups: Setup[] = [
  ...databasesUnderTest().map((dialect) => ({ name: dialect, dialect, env: {} })),
  ...(databasesUnderTest().includes('postgres') ? [{ name: 'postgres from wallet leases', dialect: 'postgres' as const, env: { WALLET_LEASE_HOT_AFTER: '0' } }] : []),
];

describe.each(setups)('plan credit and the meters a plan links on $name', ({ dialect, env }) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed-openai' }, env }));
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

  /** A customer on a free plan linking `linked`, with these amounts in its cycle, bundle and prepaid buckets. */
  async function subscribed(linked: string, buckets: { cycle: string; bundle: string; prepaid: string }) {
    const plan = await createPlan(t, { name: 'Metered', period_amount: '0', included_credit: buckets.cycle, billing_interval: 'month', meter_ids: [linked] });
    const customer = await createCustomer(t);
    expect((await subscribe(t, customer.customerId, plan.plan_id)).statusCode).toBe(201);
    if (parseMoney(buckets.bundle) > 0n) await creditWallet(t.storage, customer.walletId, parseMoney(buckets.bundle), new Date().toISOString(), 'bundle');
    if (parseMoney(buckets.prepaid) > 0n) await creditWallet(t.storage, customer.walletId, parseMoney(buckets.prepaid), new Date().toISOString());
    return customer;
  }

  /** The wallet's buckets, as decimal amounts. */
  const bucketsOf = async (walletId: string) => {
    const { cycle, bundle, prepaid } = await walletBuckets(t.storage, walletId);
    return { cycle: Number(formatMoney(cycle)), bundle: Number(formatMoney(bundle)), prepaid: Number(formatMoney(prepaid)) };
  };

  const recordUsage = (customerId: string, meterSlug: string) =>
    t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(),
      payload: { request_id: `r-${crypto.randomUUID()}`, customer_id: customerId, meter_slug: meterSlug },
    });

  it('POST /v1/requests on a linked meter draws cycle credit, then bundle credit, then the prepaid balance', async () => {
    const linked = await meter(PER_REQUEST);
    const c = await subscribed(linked.meter_id, { cycle: '0.5', bundle: '0.5', prepaid: '1' });

    for (const expected of [
      { cycle: 0.25, bundle: 0.5, prepaid: 1 },
      { cycle: 0, bundle: 0.5, prepaid: 1 },
      { cycle: 0, bundle: 0.25, prepaid: 1 },
      { cycle: 0, bundle: 0, prepaid: 1 },
      { cycle: 0, bundle: 0, prepaid: 0.75 },
    ]) {
      expect((await recordUsage(c.customerId, linked.meter_slug)).statusCode).toBe(201);
      expect(await bucketsOf(c.walletId)).toEqual(expected);
    }
  });

  it('POST /v1/requests on a meter the plan does not link draws the prepaid balance only, and is refused when only plan credit is left', async () => {
    const linked = await meter(PER_REQUEST);
    const unlinked = await meter(PER_REQUEST);
    const c = await subscribed(linked.meter_id, { cycle: '0.5', bundle: '0.5', prepaid: '0.25' });

    expect((await recordUsage(c.customerId, unlinked.meter_slug)).statusCode).toBe(201);
    expect(await bucketsOf(c.walletId)).toEqual({ cycle: 0.5, bundle: 0.5, prepaid: 0 });

    const refused = await recordUsage(c.customerId, unlinked.meter_slug);
    expect(refused.statusCode).toBe(402);
    expect(refused.json().error.code).toBe('insufficient_balance');
    expect(refused.json().error.message).toMatch(/has 0(\.0+)? available/);
    expect(await bucketsOf(c.walletId)).toEqual({ cycle: 0.5, bundle: 0.5, prepaid: 0 });

    // The plan credit is still there for the linked meter.
    expect((await recordUsage(c.customerId, linked.meter_slug)).statusCode).toBe(201);
    expect(await bucketsOf(c.walletId)).toEqual({ cycle: 0.25, bundle: 0.5, prepaid: 0 });
  });

  it('POST /v1/requests: a customer without a subscription has no linked meter; plan credit it kept is not spent', async () => {
    const m = await meter(PER_REQUEST);
    const c = await createCustomer(t);
    await creditWallet(t.storage, c.walletId, parseMoney('1'), new Date().toISOString(), 'bundle');
    await creditWallet(t.storage, c.walletId, parseMoney('0.25'), new Date().toISOString());
    expect((await recordUsage(c.customerId, m.meter_slug)).statusCode).toBe(201);
    expect((await recordUsage(c.customerId, m.meter_slug)).statusCode).toBe(402);
    expect(await bucketsOf(c.walletId)).toEqual({ cycle: 0, bundle: 1, prepaid: 0 });
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

  async function forwardAndSettle(token: string): Promise<{ status: number; cost: bigint }> {
    const res = await forward(token);
    const text = await res.text();
    if (res.status !== 200) return { status: res.status, cost: 0n };
    expect(text).toContain('choices');
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    expect(record.status).toBe('completed');
    return { status: 200, cost: parseMoney(record.total_wallet_cost) };
  }

  it('forward: a linked meter draws cycle credit first; an unlinked one the prepaid balance only, refused before any provider call when only plan credit could pay', async () => {
    const linked = await meter(PER_TOKEN);
    const unlinked = await meter(PER_TOKEN);
    const probe = await createCustomer(t);
    const hold = await holdFor(tokenOf(probe.customerId, linked.meter_slug));
    // Plan credit for many requests; prepaid for exactly one hold of the unlinked meter.
    const c = await subscribed(linked.meter_id, { cycle: formatMoney(hold * 10n), bundle: formatMoney(hold * 10n), prepaid: formatMoney(hold) });
    const start = await walletBuckets(t.storage, c.walletId);

    const onLinked = await forwardAndSettle(tokenOf(c.customerId, linked.meter_slug));
    expect(onLinked.status).toBe(200);
    expect(onLinked.cost).toBeGreaterThan(0n);
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ cycle: start.cycle - onLinked.cost, bundle: start.bundle, prepaid: start.prepaid });

    const onUnlinked = await forwardAndSettle(tokenOf(c.customerId, unlinked.meter_slug));
    expect(onUnlinked.status).toBe(200);
    expect(onUnlinked.cost).toBeGreaterThan(0n);
    expect(await walletBuckets(t.storage, c.walletId)).toMatchObject({ cycle: start.cycle - onLinked.cost, bundle: start.bundle, prepaid: start.prepaid - onUnlinked.cost });

    // What prepaid is left is less than a hold: refused, though plan credit could pay twenty.
    const before = upstream.requests.length;
    const refused = await forward(tokenOf(c.customerId, unlinked.meter_slug));
    expect(refused.status).toBe(402);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe('insufficient_balance');
    expect(upstream.requests.length).toBe(before);

    // The linked meter is still served, from plan credit.
    expect((await forwardAndSettle(tokenOf(c.customerId, linked.meter_slug))).status).toBe(200);
    expect((await walletBuckets(t.storage, c.walletId)).prepaid).toBe(start.prepaid - onUnlinked.cost);

    if (env.WALLET_LEASE_HOT_AFTER) {
      // Leases are on (a wallet of prepaid money only gets one), but a wallet with plan credit is never leased.
      const plain = await createCustomer(t);
      await creditWallet(t.storage, plain.walletId, hold * 4n, new Date().toISOString());
      expect((await forwardAndSettle(tokenOf(plain.customerId, unlinked.meter_slug))).status).toBe(200);
      expect(await leaseRows(plain.walletId)).toHaveLength(1);
      expect(await leaseRows(c.walletId)).toEqual([]);
    }
  });

  /** A wallet's lease rows (holds whose reference is their own id), given back or not. */
  const leaseRows = (walletId: string) =>
    t.storage.db.selectFrom('holds').select('id').where('wallet_id', '=', walletId).whereRef('reference', '=', 'id').execute();
});
