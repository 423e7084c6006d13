import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from './app.ts';
import { waitsFor, type ClientPath, type Coverage } from './client-matrix.ts';
import { databasesUnderTest, priceOverridesFile } from './databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from './gateway.ts';
import type { MockUpstream, RecordedRequest } from './mock-upstream.ts';
import { until } from './until.ts';
import { checkResponsesAgainstOpenApi } from './openapi-responses.ts';

/**
 * One gateway on one mock provider for a whole client e2e file, and per test a fresh customer
 * whose wallet holds 10: its records and its wallet move only by that test's calls, so every test
 * can check the one record its call left and the exact amount charged.
 *
 * The clients reach the gateway two ways (docs/clients.md): the drop-in endpoints with a spend
 * key of the customer (the customer's wallet pays the provider's base cost, no fee), and
 * /v1/forward (or /v1/rewrite) with a forward token naming the customer and a meter of 100 per
 * 1M tokens (the customer pays base cost + fee). Prices are simple overrides so that hand-worked
 * costs never round; the mock's usage is deterministic (input = words of the prompt, output = the
 * request's cap).
 *
 * These files prove client compatibility, not storage: they run on one engine, PostgreSQL when
 * the run has one (as in CI), else SQLite; the storage suites run on both.
 */
export const FEE_RATE = '100';
export const PRICES = {
  'openai/gpt-4o': { input: '1', output: '2' },
  'openai/gpt-4o-2024-08-06': { input: '1', output: '2' },
  'openai/text-embedding-3-small': { input: '0.5', output: '0' },
  'anthropic/claude-haiku-4-5': { input: '1', output: '5' },
  'google/gemini-2.0-flash': { input: '1', output: '4' },
  'google-openai/gemini-2.0-flash': { input: '1', output: '4' },
} as const;
export type PricedModel = keyof typeof PRICES;

/** Tollgate's message for a wallet that cannot pay (402 insufficient_balance), which every client must show. */
export const BROKE_MESSAGE = 'The wallet balance cannot cover this request.';

/** The one tool call the mock answers with when a test asks for one. */
export const WEATHER_CALL = { name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } };

export type Billed = {
  path: ClientPath;
  model: PricedModel;
  input: number;
  output: number;
  /** The hand-worked total the customer pays, as the record shows it (keeps the arithmetic honest). */
  total: string;
  /** A cut stream: the tokens are the gateway's estimate of what was seen. */
  estimated?: boolean;
  /** The model name the record must show, when it is not the priced one's. */
  recordedModel?: string;
};

type Customer = { customerId: string; walletId: string; spendKeys: Map<string, string> };
export type RecordJson = Record<string, unknown> & { request_id: string; status: string };

export type ClientHarness = ReturnType<typeof useClientHarness>;

/** Registers the file's gateway (beforeAll/afterAll) and a fresh customer per test (beforeEach). */
export function useClientHarness() {
  const dialect = databasesUnderTest().at(-1)!;
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let lava: Lava;
  let meterSlug: string;
  let customer: Customer;

  beforeAll(async () => {
    const pricesFile = priceOverridesFile(PRICES);
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      ...THREE_PROVIDERS,
      env: { PRICE_OVERRIDES_FILE: pricesFile, RATE_LIMIT_PER_MINUTE: '100000' },
    }));
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
    const meter = await lava.meters.create({ name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: FEE_RATE }] });
    meterSlug = meter.meter_slug;
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });
  checkResponsesAgainstOpenApi(() => t);
  beforeEach(async () => {
    upstream.reset();
    customer = await newCustomer('10');
  });

  async function newCustomer(credit: string): Promise<Customer> {
    const created = (await lava.customers.create({ name: 'Client user' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
    if (credit !== '0') await creditWallet(t.storage, created.wallet.wallet_id, parseMoney(credit), new Date().toISOString());
    return { customerId: created.customer_id, walletId: created.wallet.wallet_id, spendKeys: new Map() };
  }

  async function createSpendKey(of: Customer, body: Record<string, unknown>): Promise<string> {
    const res = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'client e2e', customer_id: of.customerId, ...body } });
    expect(res.statusCode, res.body).toBe(201);
    return (res.json() as { key: string }).key;
  }

  async function customerRecords(of = customer): Promise<RecordJson[]> {
    const res = await t.app.inject({ method: 'GET', url: `/v1/requests?limit=100&customer_id=${of.customerId}`, headers: t.auth() });
    return (res.json() as { data: RecordJson[] }).data;
  }

  const h = {
    get upstream() {
      return upstream;
    },
    get t() {
      return t;
    },
    /** The gateway's base URL, e.g. http://127.0.0.1:PORT */
    get base() {
      return base;
    },
    get lava() {
      return lava;
    },
    get customerId() {
      return customer.customerId;
    },
    /** A forward token: this test's customer pays base cost + the meter's fee. */
    token: (): string => lava.generateForwardToken({ customer_id: customer.customerId, meter_slug: meterSlug }),
    /** This test's customer's spend key for the drop-in endpoints of a request shape (base cost, no fee). */
    async spendKey(shape: 'openai' | 'anthropic' = 'openai'): Promise<string> {
      const known = customer.spendKeys.get(shape);
      if (known) return known;
      const key = await createSpendKey(customer, { request_shape: shape });
      customer.spendKeys.set(shape, key);
      return key;
    },
    /** Another spend key of this test's customer, with limits (e.g. `request_limit`). */
    limitedSpendKey: (settings: Record<string, unknown>): Promise<string> => createSpendKey(customer, settings),
    /** A credential of a customer with an empty wallet: every billed call is refused with 402. */
    async brokeCredential(path: ClientPath, shape: 'openai' | 'anthropic' = 'openai'): Promise<string> {
      const broke = await newCustomer('0');
      if (path === 'drop-in') return createSpendKey(broke, { request_shape: shape });
      return lava.generateForwardToken({ customer_id: broke.customerId, meter_slug: meterSlug });
    },
    lastUpstream(): RecordedRequest {
      const seen = upstream.requests.at(-1);
      if (!seen) throw new Error('the mock provider saw no request');
      return seen;
    },
    /** The customer's records once there are `count` (the gateway writes one just after its answer, decision 0011). */
    recordsOnceThere(count = 1): Promise<RecordJson[]> {
      return until(async () => {
        const records = await customerRecords();
        return records.length >= count && records;
      }, `${count} records for the customer`);
    },

    /**
     * The call left exactly one record, settled with exactly these tokens and costs, and the
     * customer's wallet paid exactly its total (nothing left held). `requestId` (from the
     * x-tollgate-request-id header) when the client shows it, else the customer's one record.
     */
    async expectBilled(requestId: string | null | undefined, e: Billed): Promise<RecordJson> {
      const [only] = await h.recordsOnceThere(1);
      const record = (await t.settledRecord(requestId ?? only!.request_id)) as RecordJson;
      const prices = PRICES[e.model];
      const inputCost = per1M(e.input, prices.input);
      const outputCost = per1M(e.output, prices.output);
      const fee = e.path === 'drop-in' ? 0n : per1M(e.input + e.output, FEE_RATE);
      const total = inputCost + outputCost + fee;
      expect(formatMoney(total)).toBe(e.total);
      expect(record).toMatchObject({
        status: 'completed',
        provider: e.model.slice(0, e.model.indexOf('/')),
        model: e.recordedModel ?? e.model.slice(e.model.indexOf('/') + 1),
        customer_id: customer.customerId,
        usage_estimated: e.estimated ?? false,
        model_usage: {
          input_tokens: e.input,
          output_tokens: e.output,
          input_cost: formatMoney(inputCost),
          output_cost: formatMoney(outputCost),
          total_cost: formatMoney(inputCost + outputCost),
        },
        fee: { amount: formatMoney(fee) },
        total_request_cost: e.total,
        total_wallet_cost: e.total,
      });
      expect((await customerRecords()).map((r) => r.request_id)).toEqual([record.request_id]);
      const wallet = await findWallet(t.storage, customer.walletId);
      expect(parseMoney('10') - wallet!.balance).toBe(total);
      expect(wallet!.held).toBe(0n);
      return record;
    },

    /** A refused call: nothing reached the provider, nothing was charged or left held. */
    async expectNothingCharged(): Promise<void> {
      expect(upstream.requests).toHaveLength(0);
      const wallet = await findWallet(t.storage, customer.walletId);
      expect(wallet).toMatchObject({ balance: parseMoney('10'), held: 0n });
    },

    async expectBalancedLedger(): Promise<void> {
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    },
  };
  return h;
}

/** rate per 1M tokens × tokens, exactly (the prices are chosen so that nothing rounds). */
export function per1M(tokens: number, rate: string): bigint {
  const scaled = BigInt(tokens) * parseMoney(rate);
  expect(scaled % 1_000_000n).toBe(0n);
  return scaled / 1_000_000n;
}

/** A fetch that counts the client's attempts, to prove a refusal is not retried. */
export function countingFetch(): { fetch: typeof fetch; calls: () => number } {
  let calls = 0;
  return {
    fetch: (input, init) => {
      calls += 1;
      return fetch(input, init);
    },
    calls: () => calls,
  };
}

/**
 * A test of a server feature that is not on main yet: written out, listed as todo in the matrix
 * (naming the feature), not run. When the feature lands it becomes `it(name, covers(…), fn)`.
 */
export function itAwaiting(feature: string, name: string, coverage: Coverage[], fn: () => Promise<void>): void {
  it.todo(name, waitsFor(feature, ...coverage), fn);
}
