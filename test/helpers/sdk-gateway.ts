import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, beforeEach, expect } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from './app.ts';
import { FEE_RATE, per1M, PRICES, type PricedModel } from './client-harness.ts';
import { priceOverridesFile, type TestDatabase } from './databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from './gateway.ts';
import { live } from './live.ts';
import type { MockUpstream, RecordedRequest } from './mock-upstream.ts';
import { until } from './until.ts';
import { checkResponsesAgainstOpenApi } from './openapi-responses.ts';

/**
 * The forward gateway the official provider clients (openai 7, @anthropic-ai/sdk 1,
 * @google/genai 3) and the published Lava client drive over real HTTP, in every billing mode and
 * on every engine. Each test checks that the client saw exactly what the (mock) provider
 * answered, and that the request record and the wallets show the exact cost, worked out by hand
 * from the mock's deterministic usage and the simple prices of client-harness.ts (PRICES, a meter
 * of FEE_RATE per 1M tokens, input + output).
 *
 * The merchant's wallet holds 10; per test a fresh customer's wallet holds 10 too, and moves only
 * by that test's requests.
 */

export type Billing =
  /** customer_id + meter_slug: the customer's wallet pays fee + base (meter payers default to wallet). */
  | 'customer'
  /** meter_slug only: priced by the meter, the merchant's wallet pays fee + base. */
  | 'meter_only'
  /** raw secret key (or a token with secret_key only): no fee, the merchant's wallet pays the base cost. */
  | 'merchant'
  /** customer billing with the caller's provider_key: fee only, base cost reported but not charged. */
  | 'customer_unmanaged'
  /** provider_key without customer or meter: nothing charged. */
  | 'merchant_unmanaged'
  /** disable_billing: recorded for the customer, customer wallet untouched, merchant pays the base cost. */
  | 'billing_disabled';

export type Expectation = {
  billing: Billing;
  provider: string;
  model: PricedModel;
  inputTokens: number;
  outputTokens: number;
  customerId?: string | null;
  meterId?: string | null;
  /** Hand-computed totals, as the wire shows them, to keep the arithmetic honest. */
  totalRequestCost?: string;
};

export type RecordJson = {
  request_id: string;
  status: string;
  provider: string;
  model: string | null;
  provider_key_type: string;
  customer_id: string | null;
  meter_id: string | null;
  endpoint: string;
  response_id: string | null;
  metadata: Record<string, string>;
  usage_estimated: boolean;
  model_usage: { input_tokens: number; output_tokens: number; input_cost: string; output_cost: string; total_cost: string };
  fee: { amount: string };
  cost: string;
  charge: { amount: string };
  total_request_cost: string;
  total_wallet_cost: string;
  total_merchant_cost: string;
};

/** Replaces the mock's per-request sequence numbers (chatcmpl-mock7, resp_mock7, …) so two answers compare. */
export function normalise<T>(value: T): T {
  return JSON.parse(JSON.stringify(value).replace(/mock\d+/g, 'mockN')) as T;
}

/** `data:` payloads of an SSE body, parsed; `[DONE]` left out. */
export function sseData(text: string): unknown[] {
  return text
    .split(/\r?\n\r?\n/)
    .map((event) =>
      event
        .split(/\r?\n/)
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5))
        .join('\n'),
    )
    .filter((data) => data !== '' && data !== '[DONE]')
    .map((data) => JSON.parse(data) as unknown);
}

export type SdkGateway = ReturnType<typeof useSdkGateway>;

/** Registers the block's gateway (beforeAll/afterAll) and a fresh customer per test (beforeEach). */
export function useSdkGateway(dialect: TestDatabase['dialect']) {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let lava: Lava;
  let meter: { meter_id: string; meter_slug: string };
  let customer: { customer_id: string; walletId: string };

  beforeAll(async () => {
    const pricesFile = priceOverridesFile(PRICES);
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      ...THREE_PROVIDERS,
      env: {
        PRICE_OVERRIDES_FILE: pricesFile,
        // Polling records and the Lava client's own calls share the secret key's rate limit.
        RATE_LIMIT_PER_MINUTE: '100000',
      },
    }));
    lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
    meter = await lava.meters.create({ name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: FEE_RATE }] });
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });
  checkResponsesAgainstOpenApi(() => t);

  beforeEach(async () => {
    // A fresh customer per test: its wallet only ever moves by this test's requests.
    const created = (await lava.customers.create({ name: 'SDK user' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
    customer = { customer_id: created.customer_id, walletId: created.wallet.wallet_id };
    await creditWallet(t.storage, customer.walletId, parseMoney('10'), new Date().toISOString());
  });

  const customerToken = () => lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug });

  /** The newest record before a test's call (see newestRecordId); every earlier request has settled by then. */
  let newestBeforeCall: string | undefined;

  async function balances() {
    const [c, m] = await Promise.all([findWallet(t.storage, customer.walletId), findWallet(t.storage, t.merchant.walletId)]);
    newestBeforeCall = await currentNewestRecordId();
    return { customer: c!.balance, merchant: m!.balance };
  }

  async function currentNewestRecordId(): Promise<string | undefined> {
    const res = await t.app.inject({ method: 'GET', url: '/v1/requests?limit=1', headers: t.auth() });
    return (res.json() as { data: RecordJson[] }).data[0]?.request_id;
  }

  /**
   * For gateway(), which returns only the JSON: the test's own record, the first newer than the
   * newest before its call. The embedded gateway writes a record just after the answer (decision
   * 0011), so it is waited for.
   */
  function newestRecordId(): Promise<string> {
    return until(async () => {
      const newest = await currentNewestRecordId();
      return newest !== newestBeforeCall && newest;
    }, 'the request to be recorded');
  }

  /** What the mock answers when called directly with exactly the bytes the gateway sent it. */
  async function direct(seen: RecordedRequest): Promise<{ status: number; contentType: string; text: string }> {
    const res = await fetch(`${upstream.url}${seen.url}`, {
      method: seen.method,
      headers: { 'content-type': String(seen.headers['content-type'] ?? 'application/json') },
      body: seen.body.length ? new Uint8Array(seen.body) : undefined,
    });
    upstream.requests.pop(); // the direct call is not part of the test's traffic
    return { status: res.status, contentType: res.headers.get('content-type') ?? '', text: await res.text() };
  }

  function lastUpstream(): RecordedRequest {
    const seen = upstream.requests.at(-1);
    if (!seen) throw new Error('the mock provider saw no request');
    return seen;
  }

  /** The record and both wallets show exactly the cost the billing mode implies. */
  async function expectBilled(requestId: string, before: { customer: bigint; merchant: bigint }, e: Expectation): Promise<RecordJson> {
    const record: RecordJson = await t.settledRecord(requestId);
    const prices = PRICES[e.model];
    const inputCost = per1M(e.inputTokens, prices.input);
    const outputCost = per1M(e.outputTokens, prices.output);
    const base = inputCost + outputCost;
    const metered = e.billing === 'customer' || e.billing === 'meter_only' || e.billing === 'customer_unmanaged';
    const fee = metered ? per1M(e.inputTokens + e.outputTokens, FEE_RATE) : 0n;
    const baseCharged = e.billing === 'customer' || e.billing === 'meter_only' || e.billing === 'merchant' || e.billing === 'billing_disabled';
    const total = fee + (baseCharged ? base : 0n);
    const customerPays = e.billing === 'customer' || e.billing === 'customer_unmanaged' ? total : 0n;
    const merchantPays = total - customerPays;

    expect(record).toMatchObject({
      status: 'completed',
      provider: e.provider,
      model: e.model.slice(e.model.indexOf('/') + 1),
      provider_key_type: e.billing.endsWith('unmanaged') ? 'unmanaged' : 'managed',
      usage_estimated: false,
      model_usage: {
        input_tokens: e.inputTokens,
        output_tokens: e.outputTokens,
        // Reported even when the provider bills the caller directly (unmanaged).
        input_cost: formatMoney(inputCost),
        output_cost: formatMoney(outputCost),
        total_cost: formatMoney(base),
      },
      cost: formatMoney(base),
      fee: { amount: formatMoney(fee) },
      charge: { amount: formatMoney(fee) },
      total_request_cost: formatMoney(total),
    });
    if (e.totalRequestCost !== undefined) expect(record.total_request_cost).toBe(e.totalRequestCost);
    if (e.customerId !== undefined) expect(record.customer_id).toBe(e.customerId);
    if (e.meterId !== undefined) expect(record.meter_id).toBe(e.meterId);
    expect(parseMoney(record.total_wallet_cost) + parseMoney(record.total_merchant_cost)).toBe(total);

    const after = await balances();
    expect(before.customer - after.customer).toBe(customerPays);
    expect(before.merchant - after.merchant).toBe(merchantPays);
    const [c, m] = await Promise.all([findWallet(t.storage, customer.walletId), findWallet(t.storage, t.merchant.walletId)]);
    expect(c!.held).toBe(0n);
    expect(m!.held).toBe(0n);
    return record;
  }

  /** Neither our token nor the merchant's secret key ever reaches the provider. */
  function expectNoTollgateCredential(seen: RecordedRequest, ...secrets: string[]) {
    const headers = JSON.stringify(seen.headers);
    for (const secret of [t.merchant.secretKey, ...secrets]) {
      expect(headers).not.toContain(secret);
      expect(seen.url).not.toContain(encodeURIComponent(secret));
    }
  }

  return {
    upstream: live('the mock provider', () => upstream),
    t: live('the test app', () => t),
    /** The published client, with the merchant's secret key. */
    lava: live('the Lava client', () => lava),
    /** The meter of FEE_RATE per 1M tokens. */
    meter: live('the meter', () => meter),
    /** This test's customer. */
    customer: live('the customer', () => customer),
    /** The gateway's base URL, e.g. http://127.0.0.1:PORT */
    get base() {
      return base;
    },
    /** A forward token: this test's customer pays base cost + the meter's fee. */
    customerToken,
    balances,
    newestRecordId,
    direct,
    lastUpstream,
    expectBilled,
    expectNoTollgateCredential,
  };
}
