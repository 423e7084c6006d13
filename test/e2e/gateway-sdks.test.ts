import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI } from '@google/genai';
import { Lava } from '@lavapayments/nodejs';
import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest, priceOverridesFile } from '../helpers/databases.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream, RecordedRequest } from '../helpers/mock-upstream.ts';

/**
 * The official provider clients (openai 7, @anthropic-ai/sdk 1, @google/genai 3) and the published
 * Lava client drive the forward gateway over real HTTP. Each test checks that the client saw exactly
 * what the (mock) provider answered, and that the request record and the wallets show the exact
 * cost, worked out by hand from the mock's deterministic usage and the simple prices below.
 *
 * How each client is pointed at the gateway (see the tests for the proof):
 * - openai: `baseURL: lava.providers.openai` (`<base>/v1/forward?u=https://api.openai.com/v1`,
 *   raw u). The client appends its path to the base URL's PATH and re-serialises the query, so the
 *   server receives `/v1/forward/chat/completions?u=<percent-encoded base>`; the gateway joins the
 *   two. The client's own query parameters (e.g. `files.list({limit})`) stand beside `u` and are
 *   passed on to the provider.
 * - @anthropic-ai/sdk: `baseURL: lava.providers.anthropic` or `<base>/v1/forward?u=https://api.anthropic.com`;
 *   the client appends `/v1/messages` to the string, and the doubled `/v1/v1` of the published base
 *   is collapsed by the Anthropic provider module. In 1.x `apiKey` goes out as
 *   `Authorization: Bearer` (not x-api-key); to send the token in x-api-key, pass
 *   `apiKey: null, defaultHeaders: {'x-api-key': token}`.
 * - @google/genai: `httpOptions.baseUrl: <base>/v1/forward?u=https://generativelanguage.googleapis.com`
 *   (the client appends `/v1/models/...`), or `lava.providers.google` (the doubled version is
 *   collapsed to the client's). The apiKey goes out as x-goog-api-key. generateContentStream's path
 *   carries `?alt=sse`, and the client adds `alt=sse` next to `u` too: the provider gets it once.
 */

const FEE_RATE = '100'; // meter: fixed, per 1M tokens, input+output
const PRICES = {
  'openai/gpt-4o': { input: '1', output: '2' },
  'openai/text-embedding-3-small': { input: '0.5', output: '0' },
  'anthropic/claude-haiku-4-5': { input: '1', output: '5' },
  'google/gemini-2.0-flash': { input: '1', output: '4' },
} as const;
type PricedModel = keyof typeof PRICES;

/** rate per 1M tokens × tokens, exactly (the prices are chosen so that nothing rounds). */
function per1M(tokens: number, rate: string): bigint {
  const scaled = BigInt(tokens) * parseMoney(rate);
  expect(scaled % 1_000_000n).toBe(0n);
  return scaled / 1_000_000n;
}

type Billing =
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

type Expectation = {
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

type RecordJson = {
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
function normalise<T>(value: T): T {
  return JSON.parse(JSON.stringify(value).replace(/mock\d+/g, 'mockN')) as T;
}

/** `data:` payloads of an SSE body, parsed; `[DONE]` left out. */
function sseData(text: string): unknown[] {
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

const isUsageOnlyChunk = (chunk: unknown): boolean => {
  const c = chunk as { choices?: unknown[]; usage?: unknown };
  return Array.isArray(c.choices) && c.choices.length === 0 && c.usage !== null && typeof c.usage === 'object';
};

describe.each(databasesUnderTest())('official SDKs through the forward gateway on %s', (dialect) => {
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
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  beforeEach(async () => {
    // A fresh customer per test: its wallet only ever moves by this test's requests.
    const created = (await lava.customers.create({ name: 'SDK user' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
    customer = { customer_id: created.customer_id, walletId: created.wallet.wallet_id };
    await creditWallet(t.storage, customer.walletId, parseMoney('10'));
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
  async function newestRecordId(): Promise<string> {
    for (let i = 0; i < 100; i++) {
      const newest = await currentNewestRecordId();
      if (newest !== undefined && newest !== newestBeforeCall) return newest;
      await new Promise((r) => setTimeout(r, 10));
    }
    throw new Error('the request was not recorded within 1 s');
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

  // ---------------------------------------------------------------------------------------------
  describe('openai client', () => {
    const openaiClient = (apiKey: string, extra: Partial<ConstructorParameters<typeof OpenAI>[0]> = {}) =>
      new OpenAI({ apiKey, baseURL: lava.providers.openai, maxRetries: 0, ...extra });

    it('builds a forward URL the gateway joins from a baseURL with ?u=', () => {
      expect(lava.providers.openai).toBe(`${base}/v1/forward?u=https://api.openai.com/v1`);
      const client = openaiClient('x');
      // openai 7 appends its path to the base URL's path and re-encodes the query: the gateway
      // joins /chat/completions to the base named by u.
      expect(client.buildURL('/chat/completions', undefined)).toBe(
        `${base}/v1/forward/chat/completions?u=${encodeURIComponent('https://api.openai.com/v1')}`,
      );
      // Its own query parameters stand beside u: the gateway passes them on to the provider.
      expect(client.buildURL('/files', { limit: 2 })).toBe(`${base}/v1/forward/files?u=${encodeURIComponent('https://api.openai.com/v1')}&limit=2`);
    });

    it('chat.completions.create: the exact provider answer; customer pays fee + base', async () => {
      const token = customerToken();
      const openai = openaiClient(token, { defaultHeaders: { 'x-service-metadata': JSON.stringify({ feature: 'sdk-chat' }) } });
      const before = await balances();
      const { data, response } = await openai.chat.completions
        .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'one two three four' }], max_tokens: 7 })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/chat/completions');
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expect(seen.headers['x-service-metadata']).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      const answer = await direct(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse(answer.text)));
      expect(data.choices[0]!.message.content).toBe('tok tok tok tok tok tok tok');
      expect(data.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 7, total_tokens: 11 });

      const requestId = response.headers.get('x-tollgate-request-id')!;
      // base 4 × 1/1M + 7 × 2/1M = 0.000018; fee 11 × 100/1M = 0.0011
      const record = await expectBilled(requestId, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 7,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        totalRequestCost: '0.0011180000',
      });
      expect(record).toMatchObject({
        endpoint: 'POST https://api.openai.com/v1/chat/completions',
        response_id: data.id,
        metadata: { feature: 'sdk-chat' },
        total_wallet_cost: '0.0011180000',
        total_merchant_cost: '0.0000000000',
      });
    });

    it('streams without include_usage: the client gets every chunk but the usage one; billing is exact', async () => {
      const token = customerToken();
      const before = await balances();
      const { data: stream, response } = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'a b c d e' }] })
        .withResponse();
      const chunks: unknown[] = [];
      for await (const chunk of stream) chunks.push(chunk);

      const seen = lastUpstream();
      // The gateway asked for usage on the client's behalf …
      expect((seen.json as { stream_options?: unknown }).stream_options).toEqual({ include_usage: true });
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      const provided = sseData(answer.text);
      expect(provided.filter(isUsageOnlyChunk)).toHaveLength(1);
      // … and hid exactly that chunk, and the `usage: null` its request added to the others:
      // everything else arrives as the provider sent it.
      const withoutNullUsage = (c: unknown) => {
        const { usage, ...rest } = c as { usage?: unknown };
        return usage === null ? rest : c;
      };
      expect(normalise(chunks)).toEqual(normalise(provided.filter((c) => !isUsageOnlyChunk(c)).map(withoutNullUsage)));
      expect(chunks.some((c) => 'usage' in (c as object))).toBe(false);
      expect(chunks).toHaveLength(5); // role, three words, finish
      expect(chunks.some(isUsageOnlyChunk)).toBe(false);

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 5,
        outputTokens: 3,
        customerId: customer.customer_id,
        // base 5 × 1/1M + 3 × 2/1M = 0.000011; fee 8 × 100/1M = 0.0008
        totalRequestCost: '0.0008110000',
      });
    });

    it('streams with include_usage: the client sees the usage chunk, untouched', async () => {
      const token = customerToken();
      const before = await balances();
      const body = {
        model: 'gpt-4o',
        stream: true as const,
        stream_options: { include_usage: true },
        max_tokens: 2,
        messages: [{ role: 'user' as const, content: 'count these three' }],
      };
      const { data: stream, response } = await openaiClient(token).chat.completions.create(body).withResponse();
      const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
      for await (const chunk of stream) chunks.push(chunk);

      const seen = lastUpstream();
      expect(seen.body.toString()).toBe(JSON.stringify(body)); // nothing to add: passed through byte for byte
      const provided = sseData((await direct(seen)).text);
      expect(normalise(chunks)).toEqual(normalise(provided));
      expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 2,
        // base 3/1M + 4/1M = 0.000007; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005070000',
      });
    });

    it('embeddings.create: the exact vectors; input tokens only', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .embeddings.create({ model: 'text-embedding-3-small', input: ['alpha beta', 'gamma delta epsilon'], encoding_format: 'float' })
        .withResponse();
      const answer = await direct(lastUpstream());
      expect(data).toEqual(JSON.parse(answer.text));
      expect(data.data.map((d) => d.embedding)).toEqual([
        [0.1, 0.2, 0.3],
        [0.1, 0.2, 0.3],
      ]);
      expect(data.usage).toEqual({ prompt_tokens: 5, total_tokens: 5 });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/text-embedding-3-small',
        inputTokens: 5,
        outputTokens: 0,
        // base 5 × 0.5/1M = 0.0000025; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005025000',
      });
    });

    it('responses.create: the exact response object', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .responses.create({ model: 'gpt-4o', input: 'say six words please', max_output_tokens: 6 })
        .withResponse();
      const answer = await direct(lastUpstream());
      const provided = JSON.parse(answer.text) as Record<string, unknown>;
      // The client adds the convenience getter output_text; everything else is the provider's.
      const { output_text: outputText, ...rest } = data as typeof data & Record<string, unknown>;
      expect(outputText).toBe('tok tok tok tok tok tok');
      expect(normalise(rest)).toEqual(normalise(provided));
      expect(data.usage).toMatchObject({ input_tokens: 4, output_tokens: 6, total_tokens: 10 });

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 6,
        // base 4/1M + 12/1M = 0.000016; fee 10 × 100/1M = 0.001
        totalRequestCost: '0.0010160000',
      });
      expect(record.response_id).toBe(data.id);
    });

    it('responses.create streaming: every event the provider sent; usage from response.completed', async () => {
      const token = customerToken();
      const before = await balances();
      const { data: stream, response } = await openaiClient(token)
        .responses.create({ model: 'gpt-4o', input: 'two words', max_output_tokens: 4, stream: true })
        .withResponse();
      const events: unknown[] = [];
      for await (const event of stream) events.push(event);
      const seen = lastUpstream();
      expect((seen.json as Record<string, unknown>).stream_options).toBeUndefined(); // only chat/completions get it
      const provided = sseData((await direct(seen)).text);
      expect(normalise(events)).toEqual(normalise(provided));
      expect(events.at(-1)).toMatchObject({ type: 'response.completed', response: { usage: { input_tokens: 2, output_tokens: 4 } } });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 2,
        outputTokens: 4,
        // base 2/1M + 8/1M = 0.00001; fee 6 × 100/1M = 0.0006
        totalRequestCost: '0.0006100000',
      });
    });

    it('merchant mode: a raw secret key as apiKey; the merchant wallet pays the base cost, no fee', async () => {
      const before = await balances();
      const { data, response } = await openaiClient(t.merchant.secretKey)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'merchant pays this' }], max_tokens: 10 })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expectNoTollgateCredential(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'merchant',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 10,
        customerId: null,
        meterId: null,
        // base 3/1M + 20/1M = 0.000023; no fee
        totalRequestCost: '0.0000230000',
      });
      expect(record.total_merchant_cost).toBe('0.0000230000');
      expect(record.total_wallet_cost).toBe('0.0000000000');
    });

    it('unmanaged: provider_key in the token reaches the provider as its Bearer key; base cost not charged', async () => {
      const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, provider_key: 'sk-caller-own' });
      const before = await balances();
      const { data, response } = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'bring your own key' }], max_tokens: 1 })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-caller-own');
      expect(JSON.stringify(seen.headers)).not.toContain('sk-managed-openai');
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer_unmanaged',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 1,
        customerId: customer.customer_id,
        // fee 5 × 100/1M = 0.0005; base (4/1M + 2/1M) shown, not charged
        totalRequestCost: '0.0005000000',
      });
    });

    it('402 insufficient_balance reaches the client as an APIError before any provider call', async () => {
      const poor = (await lava.customers.create({ name: 'Empty wallet' })) as unknown as { customer_id: string; wallet: { wallet_id: string } };
      const token = lava.generateForwardToken({ customer_id: poor.customer_id, meter_slug: meter.meter_slug });
      const calls = upstream.requests.length;
      const error = await openaiClient(token)
        .chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'no money' }], max_tokens: 5 })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(OpenAI.APIError);
      const apiError = error as InstanceType<typeof OpenAI.APIError>;
      expect(apiError.status).toBe(402);
      expect(apiError.code).toBe('insufficient_balance');
      expect(apiError.headers?.get('x-tollgate-request-id')).toMatch(/^req_/);
      expect(upstream.requests.length).toBe(calls);
      expect((await findWallet(t.storage, poor.wallet.wallet_id))!).toMatchObject({ balance: 0n, held: 0n });
    });
  });

  // ---------------------------------------------------------------------------------------------
  describe('@anthropic-ai/sdk client', () => {
    const anthropicBase = () => `${base}/v1/forward?u=https://api.anthropic.com`;
    /** The token in x-api-key: 1.x sends `apiKey` as Authorization: Bearer, so it goes as a default header. */
    const viaXApiKey = (token: string) =>
      new Anthropic({ apiKey: null, authToken: null, defaultHeaders: { 'x-api-key': token }, baseURL: anthropicBase(), maxRetries: 0 });

    it('messages.create with the forward token in x-api-key: the exact message; customer pays', async () => {
      const token = customerToken();
      const before = await balances();
      const { data, response } = await viaXApiKey(token)
        .messages.create({
          model: 'claude-haiku-4-5',
          max_tokens: 6,
          system: 'be brief',
          messages: [{ role: 'user', content: 'hello from the sdk' }],
        })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/messages');
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.headers.authorization).toBeUndefined();
      expect(seen.headers['anthropic-version']).toBeTruthy(); // the client's, passed through
      expectNoTollgateCredential(seen, token);
      const provided = JSON.parse((await direct(seen)).text) as unknown;
      expect(normalise(data)).toEqual(normalise(provided));
      expect(data.content).toEqual([{ type: 'text', text: 'tok tok tok tok tok tok' }]);
      expect(data.usage).toMatchObject({ input_tokens: 6, output_tokens: 6 });

      const record = await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 6,
        outputTokens: 6,
        customerId: customer.customer_id,
        // base 6 × 1/1M + 6 × 5/1M = 0.000036; fee 12 × 100/1M = 0.0012
        totalRequestCost: '0.0012360000',
      });
      expect(record.response_id).toBe(data.id);
    });

    it('messages.create with apiKey (sent as Authorization: Bearer) works the same', async () => {
      const token = customerToken();
      const before = await balances();
      const client = new Anthropic({ apiKey: token, baseURL: anthropicBase(), maxRetries: 0 });
      const { data, response } = await client.messages
        .create({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'x y' }] })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.headers.authorization).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 2,
        outputTokens: 2,
        // base 2/1M + 10/1M = 0.000012; fee 4 × 100/1M = 0.0004
        totalRequestCost: '0.0004120000',
      });
    });

    it('messages.stream: every event the provider sent, the final message, exact billing', async () => {
      const token = customerToken();
      const before = await balances();
      const stream = viaXApiKey(token).messages.stream({
        model: 'claude-haiku-4-5',
        max_tokens: 4,
        messages: [{ role: 'user', content: 'stream me four' }],
      });
      // Copied as they arrive: the stream's accumulator later mutates message_start's message in place.
      const events: unknown[] = [];
      stream.on('streamEvent', (event) => events.push(structuredClone(event)));
      const { response } = await stream.withResponse();
      const message = await stream.finalMessage();

      const seen = lastUpstream();
      expect(seen.body.toString()).toContain('"stream":true');
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      // The client drops `ping` events by design; everything else is the provider's, in order.
      const provided = sseData(answer.text).filter((e) => (e as { type: string }).type !== 'ping');
      expect(normalise(events)).toEqual(normalise(provided));
      expect(message.content).toEqual([{ type: 'text', text: 'tok tok tok tok' }]);
      expect(message.usage).toMatchObject({ input_tokens: 3, output_tokens: 4 });

      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 3,
        outputTokens: 4,
        // base 3/1M + 20/1M = 0.000023; fee 7 × 100/1M = 0.0007
        totalRequestCost: '0.0007230000',
      });
    });

    it('unmanaged: provider_key reaches Anthropic in x-api-key; base cost not charged, nothing at all without a meter', async () => {
      const token = lava.generateForwardToken({ customer_id: null, meter_slug: null, provider_key: 'sk-ant-caller' });
      const before = await balances();
      const { data, response } = await viaXApiKey(token)
        .messages.create({ model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'my own key' }] })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-caller');
      expect(seen.headers.authorization).toBeUndefined();
      expectNoTollgateCredential(seen, token);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(response.headers.get('x-tollgate-request-id')!, before, {
        billing: 'merchant_unmanaged',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 3,
        outputTokens: 3,
        customerId: null,
        meterId: null,
        totalRequestCost: '0.0000000000',
      });
    });

    it("an upstream 429 reaches the client as the provider's own error; recorded as error, nothing charged", async () => {
      const token = customerToken();
      const before = await balances();
      upstream.setNext({ status: 429, path: '/messages' });
      const error = await viaXApiKey(token)
        .messages.create({ model: 'claude-haiku-4-5', max_tokens: 3, messages: [{ role: 'user', content: 'too many' }] })
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(Anthropic.RateLimitError);
      const apiError = error as InstanceType<typeof Anthropic.RateLimitError>;
      expect(apiError.error).toEqual({ type: 'error', error: { type: 'rate_limit_error', message: 'Mock upstream error 429.' } });
      expect(apiError.headers.get('retry-after')).toBe('1');
      const record: RecordJson = await t.settledRecord(apiError.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'error', total_request_cost: '0.0000000000', fee: { amount: '0.0000000000' } });
      const after = await balances();
      expect(after).toEqual(before);
      expect((await findWallet(t.storage, customer.walletId))!.held).toBe(0n);
    });
  });

  // ---------------------------------------------------------------------------------------------
  describe('@google/genai client', () => {
    const genai = (apiKey: string, httpOptions: { baseUrl: string; apiVersion?: string } = { baseUrl: `${base}/v1/forward?u=https://generativelanguage.googleapis.com` }) =>
      new GoogleGenAI({ apiKey, httpOptions });
    const pick = (r: unknown) => {
      const { candidates, usageMetadata, modelVersion, responseId } = r as Record<string, unknown>;
      return { candidates, usageMetadata, modelVersion, responseId };
    };

    it('generateContent with the forward token as apiKey (x-goog-api-key): the exact answer; customer pays', async () => {
      const token = customerToken();
      const before = await balances();
      const result = await genai(token).models.generateContent({
        model: 'gemini-2.0-flash',
        contents: 'what is one plus one',
        config: { maxOutputTokens: 3 },
      });
      const seen = lastUpstream();
      // @google/genai 3 asks for API version v1 unless told otherwise.
      expect(seen.path).toBe('/v1/models/gemini-2.0-flash:generateContent');
      expect(seen.headers['x-goog-api-key']).toBe('goog-managed');
      expect(seen.query.get('key')).toBeNull();
      expectNoTollgateCredential(seen, token);
      const provided = JSON.parse((await direct(seen)).text) as unknown;
      expect(normalise(pick(result))).toEqual(normalise(provided));
      expect(result.text).toBe('tok tok tok');
      expect(result.usageMetadata).toMatchObject({ promptTokenCount: 5, candidatesTokenCount: 3 });

      // The client exposes the response headers on every result.
      const requestId = result.sdkHttpResponse?.headers?.['x-tollgate-request-id'];
      expect(requestId).toMatch(/^req_/);
      const record = await expectBilled(requestId!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 5,
        outputTokens: 3,
        customerId: customer.customer_id,
        // base 5/1M + 12/1M = 0.000017; fee 8 × 100/1M = 0.0008
        totalRequestCost: '0.0008170000',
      });
      expect(record.endpoint).toBe('POST https://generativelanguage.googleapis.com/v1/models/gemini-2.0-flash:generateContent');
    });

    it('generateContentStream: every chunk the provider sent (alt=sse reaches it); usage from the last chunk', async () => {
      const token = customerToken();
      const before = await balances();
      const stream = await genai(token).models.generateContentStream({
        model: 'gemini-2.0-flash',
        contents: [{ role: 'user', parts: [{ text: 'stream four words' }] }],
        config: { maxOutputTokens: 4 },
      });
      const chunks: unknown[] = [];
      let text = '';
      let requestId: string | undefined;
      for await (const chunk of stream) {
        chunks.push(pick(chunk));
        text += chunk.text ?? '';
        requestId ??= chunk.sdkHttpResponse?.headers?.['x-tollgate-request-id'];
      }
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/models/gemini-2.0-flash:streamGenerateContent');
      // The client puts alt=sse both inside u and beside it: the provider gets it once.
      expect(seen.query.getAll('alt')).toEqual(['sse']);
      const answer = await direct(seen);
      expect(answer.contentType).toContain('text/event-stream');
      expect(normalise(chunks)).toEqual(normalise(sseData(answer.text)));
      expect(text).toBe('tok tok tok tok');

      expect(requestId).toMatch(/^req_/);
      await expectBilled(requestId!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 3,
        outputTokens: 4,
        // base 3/1M + 16/1M = 0.000019; fee 7 × 100/1M = 0.0007
        totalRequestCost: '0.0007190000',
      });
    });

    it("lava.providers.google works as baseUrl: the client's API version replaces the base's", async () => {
      const token = customerToken();
      const before = await balances();
      const client = genai(token, { baseUrl: lava.providers.google, apiVersion: 'v1beta' });
      const result = await client.models.generateContent({ model: 'gemini-2.0-flash', contents: 'hi', config: { maxOutputTokens: 1 } });
      const seen = lastUpstream();
      // …/v1beta (the published base) + /v1beta/models/… (the client's path) is one /v1beta.
      expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
      expect(normalise(pick(result))).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(result.sdkHttpResponse!.headers!['x-tollgate-request-id']!, before, {
        billing: 'customer',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 1,
        outputTokens: 1,
        // base 1/1M + 4/1M = 0.000005; fee 2 × 100/1M = 0.0002
        totalRequestCost: '0.0002050000',
      });
    });

    it('unmanaged: provider_key reaches Gemini in x-goog-api-key', async () => {
      const token = lava.generateForwardToken({ customer_id: customer.customer_id, meter_slug: meter.meter_slug, provider_key: 'goog-caller' });
      const before = await balances();
      const result = await genai(token).models.generateContent({ model: 'gemini-2.0-flash', contents: 'own key here', config: { maxOutputTokens: 2 } });
      const seen = lastUpstream();
      expect(seen.headers['x-goog-api-key']).toBe('goog-caller');
      expectNoTollgateCredential(seen, token);
      expect(normalise(pick(result))).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(result.sdkHttpResponse!.headers!['x-tollgate-request-id']!, before, {
        billing: 'customer_unmanaged',
        provider: 'google',
        model: 'google/gemini-2.0-flash',
        inputTokens: 3,
        outputTokens: 2,
        // fee 5 × 100/1M; base (3/1M + 8/1M) shown, not charged
        totalRequestCost: '0.0005000000',
      });
    });
  });

  // ---------------------------------------------------------------------------------------------
  describe('@lavapayments/nodejs client', () => {
    type Chat = { id: string; usage: { prompt_tokens: number; completion_tokens: number }; choices: { message: { content: string } }[] };
    const chatBody = (content: string, maxTokens: number) => ({ model: 'gpt-4o', messages: [{ role: 'user', content }], max_tokens: maxTokens });

    it('gateway() with customer billing: the exact answer; customer pays fee + base', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        customer_id: customer.customer_id,
        meter_slug: meter.meter_slug,
        body: chatBody('via the lava client', 5),
      });
      const seen = lastUpstream();
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expect(seen.body.toString()).toBe(JSON.stringify(chatBody('via the lava client', 5)));
      expectNoTollgateCredential(seen);
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 5,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        // base 4/1M + 10/1M = 0.000014; fee 9 × 100/1M = 0.0009
        totalRequestCost: '0.0009140000',
      });
    });

    it('gateway() meter-only: priced by the meter, the merchant wallet pays', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        meter_slug: meter.meter_slug,
        body: chatBody('meter only', 4),
      });
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(lastUpstream())).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'meter_only',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 2,
        outputTokens: 4,
        customerId: null,
        meterId: meter.meter_id,
        // base 2/1M + 8/1M = 0.00001; fee 6 × 100/1M = 0.0006
        totalRequestCost: '0.0006100000',
      });
    });

    it('gateway() with disable_billing: recorded for the customer, whose wallet is untouched', async () => {
      const before = await balances();
      const data = await lava.gateway<Chat>('https://api.openai.com/v1/chat/completions', {
        customer_id: customer.customer_id,
        meter_slug: meter.meter_slug,
        disable_billing: true,
        body: chatBody('free for the customer', 3),
      });
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(lastUpstream())).text)));
      const record = await expectBilled(await newestRecordId(), before, {
        billing: 'billing_disabled',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 4,
        outputTokens: 3,
        customerId: customer.customer_id,
        meterId: meter.meter_id,
        // merchant pays the managed key's base cost 4/1M + 6/1M = 0.00001; no fee
        totalRequestCost: '0.0000100000',
      });
      expect(record.total_wallet_cost).toBe('0.0000000000');
    });

    it('gateway() merchant billing with provider_key: the caller key upstream, nothing charged', async () => {
      const before = await balances();
      const data = await lava.gateway<{ content: { text: string }[] }>('https://api.anthropic.com/v1/messages', {
        provider_key: 'sk-ant-own',
        headers: { 'anthropic-version': '2023-06-01' },
        body: { model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hello' }] },
      });
      const seen = lastUpstream();
      expect(seen.headers['x-api-key']).toBe('sk-ant-own');
      expect(seen.headers['anthropic-version']).toBe('2023-06-01');
      expect(normalise(data)).toEqual(normalise(JSON.parse((await direct(seen)).text)));
      await expectBilled(await newestRecordId(), before, {
        billing: 'merchant_unmanaged',
        provider: 'anthropic',
        model: 'anthropic/claude-haiku-4-5',
        inputTokens: 1,
        outputTokens: 2,
        totalRequestCost: '0.0000000000',
      });
    });

    it('providers.openai + a path, with fetch and a forward token (raw u)', async () => {
      const token = customerToken();
      const before = await balances();
      const url = `${lava.providers.openai}/chat/completions`;
      expect(url).toBe(`${base}/v1/forward?u=https://api.openai.com/v1/chat/completions`);
      const res = await fetch(url, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: JSON.stringify(chatBody('raw u form', 2)),
      });
      expect(res.status).toBe(200);
      const text = await res.text();
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/chat/completions');
      // Byte for byte, not just the same JSON.
      expect(text.replace(/mock\d+/g, 'mockN')).toBe((await direct(seen)).text.replace(/mock\d+/g, 'mockN'));
      await expectBilled(res.headers.get('x-tollgate-request-id')!, before, {
        billing: 'customer',
        provider: 'openai',
        model: 'openai/gpt-4o',
        inputTokens: 3,
        outputTokens: 2,
        // base 3/1M + 4/1M = 0.000007; fee 5 × 100/1M = 0.0005
        totalRequestCost: '0.0005070000',
      });
    });
  });

  it('leaves a balanced ledger behind', async () => {
    expect((await verifyLedger(t.storage)).problems).toEqual([]);
  });
});
