import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';

/** Official clients pointed at Tollgate's drop-in endpoints with a Tollgate key as their API key. */
describe.each(databasesUnderTest())('drop-in provider endpoints on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    upstream = await startMockUpstream();
    t = await startTestApp(dialect, {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url, 'api.anthropic.com': upstream.url, 'api.mistral.ai': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-openai-managed', anthropic: 'sk-ant-managed', mistral: 'mistral-managed' }),
      },
    });
    base = await t.listen();
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'));
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  async function settledRecords(count: number) {
    for (let i = 0; i < 100; i++) {
      const list = await t.app.inject({ method: 'GET', url: `/v1/requests?limit=${count}`, headers: t.auth() });
      const data = list.json().data as { status: string }[];
      if (data.length >= count && data.every((r) => r.status !== 'pending')) return data;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new Error('records never settled');
  }

  it('serves chat completions to the openai client and bills the merchant', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const before = (await findWallet(t.storage, t.merchant.walletId))!.balance;
    const completion = await openai.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 4 });
    expect(completion.usage?.completion_tokens).toBe(4);
    expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer sk-openai-managed');
    const [record] = await settledRecords(1);
    expect(record).toMatchObject({ status: 'completed', provider: 'openai', model: 'gpt-4o', provider_key_type: 'managed' });
    const after = (await findWallet(t.storage, t.merchant.walletId))!.balance;
    expect(before - after).toBe(parseMoney((record as unknown as { total_merchant_cost: string }).total_merchant_cost));
    expect(before - after).toBeGreaterThan(0n);
  });

  it('streams through the openai client', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const stream = await openai.chat.completions.create({ model: 'gpt-4o', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'x' }] });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text.length).toBeGreaterThan(0);
  });

  it('routes provider/model to that provider with the bare model name', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    await openai.chat.completions.create({ model: 'mistral/mistral-large-latest', messages: [{ role: 'user', content: 'hi' }] });
    const seen = upstream.requests.at(-1)!;
    expect((seen.json as { model: string }).model).toBe('mistral-large-latest');
    expect(seen.headers.authorization).toBe('Bearer mistral-managed');
  });

  it('serves messages to the anthropic client, which sends its key as x-api-key', async () => {
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base });
    const message = await anthropic.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 6, messages: [{ role: 'user', content: 'one two' }] });
    expect(message.usage.output_tokens).toBe(6);
    const seen = upstream.requests.at(-1)!;
    expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
    expect(JSON.stringify(seen.headers)).not.toContain(t.merchant.secretKey);
  });

  it('lists the models of providers with managed keys in the OpenAI shape', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const ids: string[] = [];
    for await (const model of openai.models.list()) ids.push(model.id);
    expect(ids).toContain('gpt-4o');
    expect(ids.some((id) => id.startsWith('anthropic/claude'))).toBe(true);
    expect(ids.some((id) => id.startsWith('groq/'))).toBe(false);
  });

  it('refuses unknown models, the wrong endpoint shape and missing keys with the envelope', async () => {
    const post = (path: string, body: object, key = t.merchant.secretKey) =>
      fetch(`${base}/v1${path}`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const unknown = await post('/chat/completions', { model: 'mystery-1', messages: [] });
    expect(unknown.status).toBe(400);
    expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe('unsupported_provider');
    const wrongShape = await post('/chat/completions', { model: 'claude-sonnet-4-5', messages: [] });
    expect(wrongShape.status).toBe(400);
    const noKey = await post('/chat/completions', { model: 'gpt-4o', messages: [] }, 'sk_live_nope');
    expect(noKey.status).toBe(401);
  });
});
