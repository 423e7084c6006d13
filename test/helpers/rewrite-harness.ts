import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, beforeEach, expect } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from './app.ts';
import { covers, type Call, type Client } from './client-matrix.ts';
import { priceOverridesFile, type TestDatabase } from './databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from './gateway.ts';
import type { MockUpstream, RecordedRequest } from './mock-upstream.ts';
import { until } from './until.ts';
import { checkResponsesAgainstOpenApi } from './openapi-responses.ts';

/**
 * The rewrite proxy's client tests' shared stand: a gateway on the mock provider (OpenAI,
 * Anthropic and Gemini), a merchant with a token meter (a fee of FEE_RATE per 1M tokens), and
 * per test a fresh customer with 10 in their wallet. Exact bills: the mock's usage is
 * deterministic (input = words of the prompt, output = the request's cap), the prices below are
 * chosen so nothing rounds.
 */

export const FEE_RATE = '100';
export const PRICES = {
  'openai/gpt-4o': { input: '1', output: '2' },
  'anthropic/claude-haiku-4-5': { input: '1', output: '5' },
  'google/gemini-2.0-flash': { input: '1', output: '4' },
} as const;
export type PricedModel = keyof typeof PRICES;

export const WEATHER_TOOL = { name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } };

/** What a test proves for docs/clients.md: calls of a client on the rewrite path. */
export const rewrite = (client: Client, ...calls: Call[]) => covers(...calls.map((call) => ({ client, call, path: 'rewrite' as const })));

/** Exact cost in 1e-10 units: tokens × price per 1M (prices chosen so nothing rounds). */
function per1M(tokens: number, rate: string): bigint {
  const scaled = BigInt(tokens) * parseMoney(rate);
  expect(scaled % 1_000_000n).toBe(0n);
  return scaled / 1_000_000n;
}

export type Billed = { provider: string; model: PricedModel; input: number; output: number; total: string; estimated?: boolean };

export type RewriteHarness = {
  readonly upstream: MockUpstream;
  readonly t: TestApp;
  readonly base: string;
  readonly lava: Lava;
  readonly meter: { meter_slug: string };
  readonly customer: { customer_id: string; walletId: string };
  /** A forward token of this test's customer. */
  token(): string;
  /** `<gateway>/v1/rewrite/<format>/<provider base>`: a client's base URL. */
  rewriteBase(format: string, providerBase: string): string;
  lastUpstream(): RecordedRequest;
  customerRecords(): Promise<{ request_id: string }[]>;
  /** The customer's records once there are `count`: the embedded gateway writes one just after its answer. */
  recordsOnceThere(count: number): Promise<{ request_id: string }[]>;
  /** The call's one record, settled: exact tokens and cost, charged to the customer's wallet. */
  expectBilled(requestId: string | null, e: Billed): Promise<void>;
};

/** Registers the suite's hooks and returns the stand; its members are set once beforeAll ran. */
export function useRewriteHarness(dialect: TestDatabase['dialect']): RewriteHarness {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let lava: Lava;
  let meter: { meter_slug: string };
  let customer: { customer_id: string; walletId: string };

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      ...THREE_PROVIDERS,
      env: { PRICE_OVERRIDES_FILE: priceOverridesFile(PRICES), RATE_LIMIT_PER_MINUTE: '100000' },
    }));
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
    meter = await lava.meters.create({ name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: FEE_RATE }] });
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });
  checkResponsesAgainstOpenApi(() => t);
  beforeEach(async () => {
    upstream.reset();
    const created = (await lava.customers.create({ name: 'Rewrite user' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
    customer = { customer_id: created.customer_id, walletId: created.wallet.wallet_id };
    await creditWallet(t.storage, customer.walletId, parseMoney('10'), new Date().toISOString());
  });

  const customerRecords = async (): Promise<{ request_id: string }[]> => {
    const res = await t.app.inject({ method: 'GET', url: `/v1/requests?limit=100&customer_id=${customer.customer_id}`, headers: t.auth() });
    return (res.json() as { data: { request_id: string }[] }).data;
  };

  return {
    get upstream() {
      return upstream;
    },
    get t() {
      return t;
    },
    get base() {
      return base;
    },
    get lava() {
      return lava;
    },
    get meter() {
      return meter;
    },
    get customer() {
      return customer;
    },
    token: () => lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug }),
    rewriteBase: (format, providerBase) => `${base}/v1/rewrite/${format}/${providerBase}`,
    lastUpstream() {
      const seen = upstream.requests.at(-1);
      if (!seen) throw new Error('the mock provider saw no request');
      return seen;
    },
    customerRecords,
    recordsOnceThere(count) {
      return until(async () => {
        const records = await customerRecords();
        return records.length >= count && records;
      }, `${count} records for the customer`);
    },
    async expectBilled(requestId, e) {
      const record = await t.settledRecord(requestId);
      const prices = PRICES[e.model];
      const baseCost = per1M(e.input, prices.input) + per1M(e.output, prices.output);
      const total = baseCost + per1M(e.input + e.output, FEE_RATE);
      expect(formatMoney(total)).toBe(e.total);
      expect(record).toMatchObject({
        status: 'completed',
        provider: e.provider,
        model: e.model.slice(e.model.indexOf('/') + 1),
        usage_estimated: e.estimated ?? false,
        customer_id: customer.customer_id,
        model_usage: { input_tokens: e.input, output_tokens: e.output, total_cost: formatMoney(baseCost) },
        total_request_cost: e.total,
      });
      expect((await customerRecords()).map((r) => r.request_id)).toEqual([requestId]);
      const wallet = await findWallet(t.storage, customer.walletId);
      expect(parseMoney('10') - wallet!.balance).toBe(total);
      expect(wallet!.held).toBe(0n);
      expect((await verifyLedger(t.storage)).problems).toEqual([]);
    },
  };
}
