import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Official clients pointed at Tollgate's drop-in endpoints with a Tollgate key as their API key.
 * Costs are hand-computed from the catalog's prices per 1M tokens (gpt-4o 2.5 in / 10 out,
 * text-embedding-3-small 0.02 in, gemini-2.0-flash 0.1 in / 0.4 out) and the mock's counts (one
 * input token per prompt word; output = the request's cap). The merchant's own key pays the base
 * cost alone (no meter, no fee).
 */
describe.each(databasesUnderTest())('drop-in provider endpoints on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'api.anthropic.com', 'api.mistral.ai', 'generativelanguage.googleapis.com'],
      providerKeys: { openai: 'sk-openai-managed', anthropic: 'sk-ant-managed', mistral: 'mistral-managed' },
      env: {
        // Only the native Gemini key: the OpenAI-compatible Gemini path must use it too.
        GOOGLE_API_KEY: 'google-managed',
      },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const merchantBalance = async () => (await findWallet(t.storage, t.merchant.walletId))!.balance;

  it('serves chat completions to the openai client and bills the merchant the exact base cost', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const before = await merchantBalance();
    const { data: completion, response } = await openai.chat.completions
      .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 4 })
      .withResponse();
    expect(completion.usage?.completion_tokens).toBe(4);
    expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer sk-openai-managed');
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'openai', model: 'gpt-4o', provider_key_type: 'managed' });
    // 2 input tokens × 2.5 + 4 output tokens × 10, per 1M: 0.000005 + 0.00004.
    expect(record.model_usage).toMatchObject({ input_tokens: 2, output_tokens: 4, input_cost: '0.0000050000', output_cost: '0.0000400000' });
    expect(record.total_merchant_cost).toBe('0.0000450000');
    expect(before - (await merchantBalance())).toBe(parseMoney('0.000045'));
  });

  it('serves responses to the openai client with the exact cost', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const before = await merchantBalance();
    const { data, response } = await openai.responses.create({ model: 'gpt-4o', input: 'one two three', max_output_tokens: 5 }).withResponse();
    expect(data.output_text).toBe('tok tok tok tok tok');
    expect(upstream.requests.at(-1)!.path).toBe('/v1/responses');
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'openai', endpoint: 'POST https://api.openai.com/v1/responses', response_id: data.id });
    // 3 × 2.5 + 5 × 10, per 1M: 0.0000075 + 0.00005.
    expect(record.model_usage).toMatchObject({ input_tokens: 3, output_tokens: 5, total_cost: '0.0000575000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.0000575'));
  });

  it('serves embeddings to the openai client with the exact cost', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const before = await merchantBalance();
    const { data, response } = await openai.embeddings
      .create({ model: 'text-embedding-3-small', input: 'one two three four', encoding_format: 'float' })
      .withResponse();
    expect(data.data[0]!.embedding).toEqual([0.1, 0.2, 0.3]);
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', model: 'text-embedding-3-small', endpoint: 'POST https://api.openai.com/v1/embeddings' });
    // 4 × 0.02 per 1M.
    expect(record.model_usage).toMatchObject({ input_tokens: 4, output_tokens: 0, total_cost: '0.0000000800' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.00000008'));
  });

  it('routes gemini-… models to the OpenAI-compatible Gemini path with the Google key, at the exact cost', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const before = await merchantBalance();
    const { data, response } = await openai.chat.completions
      .create({ model: 'gemini-2.0-flash', messages: [{ role: 'user', content: 'one two three four' }], max_tokens: 6 })
      .withResponse();
    expect(data.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 6 });
    const seen = upstream.requests.at(-1)!;
    expect(seen.path).toBe('/v1beta/openai/chat/completions');
    expect(seen.headers.authorization).toBe('Bearer google-managed');
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'google-openai', model: 'gemini-2.0-flash' });
    // 4 × 0.1 + 6 × 0.4, per 1M: 0.0000004 + 0.0000024.
    expect(record.model_usage).toMatchObject({ input_cost: '0.0000004000', output_cost: '0.0000024000', total_cost: '0.0000028000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.0000028'));
  });

  it('forwards to generativelanguage.googleapis.com/v1beta/openai with the Google key, at the exact cost', async () => {
    const before = await merchantBalance();
    const target = 'https://generativelanguage.googleapis.com/v1beta/openai/chat/completions';
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(target)}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gemini-2.0-flash', max_tokens: 6, messages: [{ role: 'user', content: 'one two three four' }] }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer google-managed');
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'google-openai', endpoint: `POST ${target}`, cost: '0.0000028000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.0000028'));
  });

  it('lists Gemini models under ids the OpenAI-shaped endpoints route', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    const ids: string[] = [];
    for await (const model of openai.models.list()) ids.push(model.id);
    expect(ids).toContain('google-openai/gemini-2.0-flash');
    expect(ids.some((id) => id.startsWith('google/'))).toBe(false);
    const completion = await openai.chat.completions.create({ model: 'google-openai/gemini-2.0-flash', messages: [{ role: 'user', content: 'hi' }] });
    expect(completion.choices[0]!.message.content).toBeTruthy();
    expect((upstream.requests.at(-1)!.json as { model: string }).model).toBe('gemini-2.0-flash');
  });

  it("lists only the models a spend key's allow-lists admit", async () => {
    const createKey = async (body: object) =>
      (await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'models', ...body } })).json() as { key: string };
    const list = async (key: string) => {
      const openai = new OpenAI({ apiKey: key, baseURL: `${base}/v1` });
      const ids: string[] = [];
      for await (const model of openai.models.list()) ids.push(model.id);
      return ids;
    };
    // By provider: `google` admits Gemini's OpenAI-compatible path and nothing else.
    const byProvider = await list((await createKey({ allowed_providers: ['google'] })).key);
    expect(byProvider.length).toBeGreaterThan(0);
    expect(byProvider.every((id) => id.startsWith('google-openai/'))).toBe(true);
    expect(byProvider).toContain('google-openai/gemini-2.0-flash');
    // By model, bare or provider/model.
    const byModel = await list((await createKey({ allowed_models: ['gpt-4o', 'openai/gpt-4o-mini', 'gemini-2.0-flash'] })).key);
    expect(byModel.sort()).toEqual(['google-openai/gemini-2.0-flash', 'gpt-4o', 'gpt-4o-mini']);
    // Both lists at once: the model must pass both.
    const both = await list((await createKey({ allowed_models: ['gpt-4o', 'gemini-2.0-flash'], allowed_providers: ['openai'] })).key);
    expect(both).toEqual(['gpt-4o']);
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

  it("lists Anthropic's models in Anthropic's shape to the anthropic client, and each one routes", async () => {
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base });
    const models: Anthropic.ModelInfo[] = [];
    for await (const model of anthropic.models.list()) models.push(model);
    expect(models.length).toBeGreaterThan(0);
    expect(models.every((m) => m.type === 'model' && m.id.startsWith('claude-') && m.display_name.length > 0)).toBe(true);
    const haiku = models.find((m) => m.id === 'claude-haiku-4-5');
    expect(haiku).toMatchObject({ type: 'model', display_name: expect.stringContaining('Haiku') });
    const message = await anthropic.messages.create({ model: haiku!.id, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });
    expect(message.model).toBe('claude-haiku-4-5');
  });

  it('counts tokens for the anthropic client through Anthropic, recorded at no cost', async () => {
    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base });
    const { data, response } = await anthropic.messages
      .countTokens({ model: 'claude-sonnet-4-5', messages: [{ role: 'user', content: 'one two three' }] })
      .withResponse();
    expect(data.input_tokens).toBe(3);
    const seen = upstream.requests.at(-1)!;
    expect(seen.path).toBe('/v1/messages/count_tokens');
    expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
    const record = await t.settledRecord(response.headers.get('x-tollgate-request-id'));
    expect(record).toMatchObject({ status: 'completed', provider: 'anthropic', endpoint: 'POST https://api.anthropic.com/v1/messages/count_tokens', usage_estimated: false });
    expect(record.model_usage).toMatchObject({ input_tokens: 0, output_tokens: 0, total_cost: '0.0000000000' });
    expect(record).toMatchObject({ total_merchant_cost: '0.0000000000', total_wallet_cost: '0.0000000000' });
  });

  it('retrieves one model for the openai and anthropic clients by the id their lists show, and 404s one it does not list', async () => {
    const openai = new OpenAI({ apiKey: t.merchant.secretKey, baseURL: `${base}/v1` });
    expect(await openai.models.retrieve('gpt-4o')).toMatchObject({ id: 'gpt-4o', object: 'model', owned_by: 'openai' });
    expect(await openai.models.retrieve('anthropic/claude-haiku-4-5')).toMatchObject({ id: 'anthropic/claude-haiku-4-5', owned_by: 'anthropic' });
    const missing = await openai.models.retrieve('mystery-1').catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(OpenAI.NotFoundError);
    expect((missing as InstanceType<typeof OpenAI.NotFoundError>).message).toContain('No model with id mystery-1');

    const anthropic = new Anthropic({ apiKey: t.merchant.secretKey, baseURL: base });
    expect(await anthropic.models.retrieve('claude-haiku-4-5')).toMatchObject({ type: 'model', id: 'claude-haiku-4-5', display_name: expect.stringContaining('Haiku') });
    const notAnthropic = await anthropic.models.retrieve('gpt-4o').catch((e: unknown) => e);
    expect(notAnthropic).toBeInstanceOf(Anthropic.NotFoundError);
    expect((notAnthropic as InstanceType<typeof Anthropic.NotFoundError>).error).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });

    const limited = (await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'one model', allowed_models: ['gpt-4o-mini'] } })).json() as { key: string };
    const keyed = new OpenAI({ apiKey: limited.key, baseURL: `${base}/v1` });
    expect((await keyed.models.retrieve('gpt-4o-mini')).id).toBe('gpt-4o-mini');
    expect(await keyed.models.retrieve('gpt-4o').catch((e: unknown) => e)).toBeInstanceOf(OpenAI.NotFoundError);
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
