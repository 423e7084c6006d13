import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { findWallet } from '../../src/ledger/wallets.ts';
import { forwardToken, startTestApp, type CustomerWithMeter, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * The built-in demo provider through the official OpenAI SDK: answered in process, with no provider
 * key configured and its host pointed at a closed port (nothing may be sent there), billed at its
 * demo prices like any provider.
 */
describe.each(databasesUnderTest())('the offline demo provider on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  let customer: CustomerWithMeter;
  let token: string;

  beforeAll(async () => {
    // Port 9 (discard) on loopback: were the gateway to send the request anywhere, it would fail.
    t = await startTestApp(dialect, { env: { UPSTREAM_OVERRIDES: JSON.stringify({ 'demo.tollgate.invalid': 'http://127.0.0.1:9/v1' }) } });
    base = await t.listen();
    // A meter of 1.00 per 1M tokens on top of the demo's own prices.
    customer = await t.customerWithMeter({ credit: '5', meter: { name: 'Tokens', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: 0, rate: '1' }] } });
    token = forwardToken(t.merchant.secretKey, customer.customerId, customer.meterSlug);
  });
  afterAll(async () => t?.close());

  const client = (baseURL = `${base}/v1`) => new OpenAI({ apiKey: token, baseURL, maxRetries: 0 });
  const question = { model: 'demo-chat', messages: [{ role: 'user' as const, content: 'What is a billing gateway?' }] };
  const answer = `Hello from Tollgate's demo provider. You said: "What is a billing gateway?"`;
  const balance = async () => (await findWallet(t.storage, customer.walletId))!.balance;

  it('answers a chat completion with usage, recorded and charged to the customer at the demo price', async () => {
    const before = await balance();
    const { data, response } = await client().chat.completions.create(question).withResponse();
    expect(data.choices[0]?.message.content).toBe(answer);
    expect(data.choices[0]?.finish_reason).toBe('stop');
    // 26 characters asked → 7 tokens; the 74-character answer → 19 tokens.
    expect(data.usage).toEqual({ prompt_tokens: 7, completion_tokens: 19, total_tokens: 26 });

    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'demo', model: 'demo-chat', connection_id: customer.customerId });
    // Demo prices: 7 × 1.00 / 1M input, 19 × 2.00 / 1M output; the meter's fee: 26 × 1.00 / 1M.
    expect(record.model_usage).toMatchObject({ input_tokens: 7, output_tokens: 19, input_cost: '0.0000070000', output_cost: '0.0000380000' });
    expect(record.fee.amount).toBe('0.0000260000');
    expect(before - (await balance())).toBe(parseMoney(record.total_wallet_cost));
    expect(record.total_wallet_cost).toBe('0.0000710000');
  });

  it('streams the same answer chunk by chunk, with the usage chunk when asked for it', async () => {
    const { data: stream, response } = await client()
      .chat.completions.create({ ...question, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    let text = '';
    let chunks = 0;
    const pieces: string[] = [];
    const roles: string[] = [];
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      chunks += 1;
      text += chunk.choices[0]?.delta.content ?? '';
      if (chunk.choices[0]?.delta.content) pieces.push(chunk.choices[0].delta.content);
      if (chunk.choices[0]?.delta.role) roles.push(chunk.choices[0].delta.role);
      usage = chunk.usage ?? usage;
    }
    expect(text).toBe(answer);
    expect(chunks).toBeGreaterThan(3);
    // A role chunk first, then the content in 16-character pieces (the last one shorter).
    expect(roles).toEqual(['assistant']);
    expect(pieces.map((p) => p.length)).toEqual([16, 16, 16, 16, answer.length - 64]);
    expect(usage).toEqual({ prompt_tokens: 7, completion_tokens: 19, total_tokens: 26 });
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'demo', usage_estimated: false });
    expect(record.total_wallet_cost).toBe('0.0000710000');
  });

  it('bills a stream whose client did not ask for usage, and hides the usage chunk from it', async () => {
    const { data: stream, response } = await client().chat.completions.create({ ...question, stream: true }).withResponse();
    let text = '';
    for await (const chunk of stream) {
      expect(chunk.usage ?? null).toBeNull();
      text += chunk.choices[0]?.delta.content ?? '';
    }
    expect(text).toBe(answer);
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record.model_usage).toMatchObject({ input_tokens: 7, output_tokens: 19 });
    expect(record.usage_estimated).toBe(false);
  });

  it('is reached through /v1/forward at its documented base URL too, and honours max_tokens', async () => {
    const forward = client(`${base}/v1/forward?u=https://demo.tollgate.invalid/v1`);
    const { data, response } = await forward.chat.completions.create({ ...question, max_tokens: 5 }).withResponse();
    expect(data.choices[0]?.message.content).toBe(answer.slice(0, 20));
    expect(data.choices[0]?.finish_reason).toBe('length');
    expect(data.usage?.completion_tokens).toBe(5);
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'demo', endpoint: 'POST https://demo.tollgate.invalid/v1/chat/completions' });
    const models = await forward.models.list();
    expect(models.data.map((m) => m.id)).toEqual(['demo-chat']);
  });

  it("lists its model in the gateway's own model list, which needs no provider key for it", async () => {
    const models = await client().models.list();
    expect(models.data.map((m) => m.id)).toContain('demo/demo-chat');
    const one = await client().models.retrieve('demo/demo-chat');
    expect(one).toMatchObject({ id: 'demo/demo-chat', owned_by: 'demo' });
  });

  it('prices a usage record posted for the demo provider at the demo prices, as a forwarded call is', async () => {
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/requests',
      headers: t.auth(),
      payload: { request_id: `demo-posted-${dialect}`, customer_id: customer.customerId, meter_slug: customer.meterSlug, provider: 'demo', model: 'demo-chat', input_tokens: 7, output_tokens: 19 },
    });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json().model_usage).toMatchObject({ input_cost: '0.0000070000', output_cost: '0.0000380000' });
  });

  it("refuses a model it does not serve in OpenAI's error shape, and charges nothing for it", async () => {
    const before = await balance();
    const failed = await client()
      .chat.completions.create({ ...question, model: 'demo-large' })
      .catch((e: unknown) => e);
    expect(failed).toBeInstanceOf(OpenAI.NotFoundError);
    expect((failed as InstanceType<typeof OpenAI.NotFoundError>).code).toBe('model_not_found');
    const record = await t.settledRecord((failed as InstanceType<typeof OpenAI.NotFoundError>).headers?.get('x-tollgate-request-id') ?? null);
    expect(record.status).toBe('error');
    expect(await balance()).toBe(before);
  });
});
