import { ApiError as GenaiApiError, GoogleGenAI } from '@google/genai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

type Json = Record<string, unknown>;

/**
 * Gemini's native API as a drop-in: @google/genai given Tollgate as its base URL and a Tollgate key
 * (a spend key or a secret key) as its API key. Costs from the catalog (gemini-2.0-flash: 0.1 in /
 * 0.4 out per 1M) and the mock's counts (input = words of the prompt, output = the cap); the
 * merchant's own key pays the base cost alone.
 */
describe.each(databasesUnderTest())('the native Gemini drop-in on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['generativelanguage.googleapis.com'],
      providerKeys: { google: 'google-managed' },
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });
  beforeEach(() => upstream.reset());

  const genai = (apiKey: string, apiVersion?: string) => new GoogleGenAI({ apiKey, httpOptions: { baseUrl: base, ...(apiVersion ? { apiVersion } : {}) } });
  const merchantBalance = async () => (await findWallet(t.storage, t.merchant.walletId))!.balance;
  const createKey = async (body: Json = {}) => {
    const res = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 'gemini', ...body } });
    expect(res.statusCode).toBe(201);
    return res.json() as { key: string; spend_key_id: string };
  };
  const lastRecord = async () => {
    const list = (await t.app.inject({ method: 'GET', url: '/v1/requests?limit=1', headers: t.auth() })).json() as { data: { request_id: string }[] };
    return t.settledRecord(list.data[0]!.request_id);
  };
  const prompt = { model: 'gemini-2.0-flash', contents: 'one two three four', config: { maxOutputTokens: 6 } };

  it('answers generateContent with a spend key sent as x-goog-api-key, with Google’s managed key upstream, at the exact cost', async () => {
    const key = await createKey();
    const before = await merchantBalance();
    const result = await genai(key.key).models.generateContent(prompt);
    expect(result.text).toBe('tok tok tok tok tok tok');
    expect(result.usageMetadata).toMatchObject({ promptTokenCount: 4, candidatesTokenCount: 6 });
    const seen = upstream.requests.at(-1)!;
    // @google/genai 3 calls the v1 API unless told otherwise.
    expect(seen.path).toBe('/v1/models/gemini-2.0-flash:generateContent');
    expect(seen.headers['x-goog-api-key']).toBe('google-managed');
    const record = await lastRecord();
    expect(record).toMatchObject({
      status: 'completed',
      provider: 'google',
      model: 'gemini-2.0-flash',
      endpoint: 'POST https://generativelanguage.googleapis.com/v1/models/gemini-2.0-flash:generateContent',
    });
    // 4 × 0.1 + 6 × 0.4, per 1M.
    expect(record.model_usage).toMatchObject({ input_tokens: 4, output_tokens: 6, total_cost: '0.0000028000' });
    expect(before - (await merchantBalance())).toBe(parseMoney('0.0000028'));
  });

  it('streams generateContentStream (alt=sse reaches Google once) and bills the last chunk’s usage', async () => {
    const key = await createKey();
    const stream = await genai(key.key, 'v1beta').models.generateContentStream(prompt);
    let text = '';
    for await (const chunk of stream) text += chunk.text ?? '';
    expect(text).toBe('tok tok tok tok tok tok');
    const seen = upstream.requests.at(-1)!;
    expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:streamGenerateContent');
    expect(seen.query.getAll('alt')).toEqual(['sse']);
    expect(seen.query.has('key')).toBe(false);
    const record = await lastRecord();
    expect(record).toMatchObject({ status: 'completed', provider: 'google', usage_estimated: false });
    expect(record.model_usage).toMatchObject({ input_tokens: 4, output_tokens: 6, total_cost: '0.0000028000' });
  });

  it('takes the key from ?key=', async () => {
    const res = await fetch(`${base}/v1beta/models/gemini-2.0-flash:generateContent?key=${encodeURIComponent(t.merchant.secretKey)}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'one two' }] }], generationConfig: { maxOutputTokens: 2 } }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const seen = upstream.requests.at(-1)!;
    expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
    expect(seen.query.has('key')).toBe(false);
    expect(seen.headers['x-goog-api-key']).toBe('google-managed');
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id'));
    expect(record.model_usage).toMatchObject({ input_tokens: 2, output_tokens: 2 });
  });

  it('refuses in Google’s dialect, which @google/genai surfaces with Tollgate’s message, without calling Google', async () => {
    const anthropicKey = await createKey({ request_shape: 'anthropic' });
    const modelLimited = await createKey({ allowed_models: ['gemini-2.5-pro'] });
    for (const [apiKey, status, code] of [
      ['sk_live_unknownunknownunknown', 401, 'unauthorized'],
      [anthropicKey.key, 403, 'request_shape_mismatch'],
      [modelLimited.key, 403, 'model_not_allowed'],
    ] as const) {
      const error = await genai(apiKey).models.generateContent(prompt).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(GenaiApiError);
      expect((error as GenaiApiError).status).toBe(status);
      const body = JSON.parse((error as GenaiApiError).message) as { error: { code: number; status: string; message: string; details: { reason: string }[] } };
      expect(body.error.code).toBe(status);
      expect(body.error.status).toBe(status === 401 ? 'UNAUTHENTICATED' : 'PERMISSION_DENIED');
      expect(body.error.details[0]!.reason).toBe(code);
    }
    expect(upstream.requests).toHaveLength(0);
  });

  it('answers a Gemini method it does not serve with 404 in Google’s dialect', async () => {
    const res = await fetch(`${base}/v1beta/models/gemini-2.0-flash:predictLongRunning`, {
      method: 'POST',
      headers: { 'x-goog-api-key': t.merchant.secretKey, 'content-type': 'application/json' },
      body: '{}',
    });
    expect(res.status).toBe(404);
    expect(((await res.json()) as { error: { status: string } }).error.status).toBe('NOT_FOUND');
    expect(upstream.requests).toHaveLength(0);
  });

  const listedNames = async (client: GoogleGenAI) => {
    const names: string[] = [];
    for await (const model of await client.models.list()) names.push(model.name!);
    return names;
  };

  it('lists and gets Gemini models for @google/genai on v1 and v1beta, only those a spend key may use, without calling Google', async () => {
    for (const apiVersion of ['v1', 'v1beta']) {
      const names = await listedNames(genai(t.merchant.secretKey, apiVersion));
      expect(names).toContain('models/gemini-2.0-flash');
      expect(names.every((name) => name.startsWith('models/'))).toBe(true);
      const model = await genai(t.merchant.secretKey, apiVersion).models.get({ model: 'gemini-2.0-flash' });
      expect(model).toMatchObject({ name: 'models/gemini-2.0-flash', displayName: expect.any(String) });
    }
    const limited = await createKey({ allowed_models: ['gemini-2.0-flash'] });
    expect(await listedNames(genai(limited.key))).toEqual(['models/gemini-2.0-flash']);
    const anthropicShaped = await createKey({ request_shape: 'anthropic' });
    expect(await listedNames(genai(anthropicShaped.key, 'v1beta'))).toEqual([]);
    expect(upstream.requests).toHaveLength(0);
  });

  it('answers a model it does not list, or one a spend key may not use, with 404 in Google’s dialect', async () => {
    const limited = await createKey({ allowed_models: ['gemini-2.0-flash'] });
    for (const [apiKey, model, apiVersion] of [
      [t.merchant.secretKey, 'gemini-0-imaginary', 'v1beta'],
      [t.merchant.secretKey, 'gemini-0-imaginary', 'v1'],
      [limited.key, 'gemini-2.5-pro', 'v1beta'],
    ] as const) {
      const error = await genai(apiKey, apiVersion).models.get({ model }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(GenaiApiError);
      expect((error as GenaiApiError).status).toBe(404);
      expect(JSON.parse((error as GenaiApiError).message).error.status).toBe('NOT_FOUND');
    }
    const anonymous = await fetch(`${base}/v1beta/models`);
    expect(anonymous.status).toBe(401);
    expect(((await anonymous.json()) as { error: { status: string } }).error.status).toBe('UNAUTHENTICATED');
  });
});
