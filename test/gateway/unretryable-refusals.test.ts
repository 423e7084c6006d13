import { createAnthropic } from '@ai-sdk/anthropic';
import { createGoogleGenerativeAI } from '@ai-sdk/google';
import { createOpenAI } from '@ai-sdk/openai';
import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI } from '@google/genai';
import { ChatOpenAI } from '@langchain/openai';
import { generateText, type LanguageModel } from 'ai';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { startGatewayOnMock, THREE_PROVIDERS } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

type Json = Record<string, unknown>;
type Shape = 'openai' | 'anthropic';

/**
 * A refusal that retrying cannot fix — a `total` request limit that is used up, a revoked key, a
 * paused key, a model the key may not use — reaches each mainstream client as an error it does not
 * retry: every client below is left at its default retry settings, and exactly one attempt (its
 * own fetch calls, counted) reaches Tollgate, none the provider.
 */
describe('refusals no retry can fix, with each client at its default retries', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock('sqlite', {
      ...THREE_PROVIDERS,
    }));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const api = async (method: 'POST' | 'PATCH' | 'DELETE', url: string, payload?: Json) => {
    const res = await t.app.inject({ method, url, headers: t.auth(), ...(payload ? { payload } : {}) });
    expect(res.statusCode).toBeLessThan(300);
    return res.statusCode === 204 ? {} : (res.json() as Json);
  };
  const createKey = async (shape: Shape, extra: Json = {}) =>
    (await api('POST', '/v1/spend_keys', { name: 'k', request_shape: shape, ...extra })) as { key: string; spend_key_id: string };

  /** Spends the one request a limit of 1 allows, so the next request is refused. */
  async function useTheOneAllowedRequest(key: string, shape: Shape): Promise<void> {
    const used = await fetch(`${base}/v1/${shape === 'anthropic' ? 'messages' : 'chat/completions'}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: shape === 'anthropic' ? 'claude-haiku-4-5' : 'gpt-4o-mini', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(used.status).toBe(200);
    await used.arrayBuffer();
  }

  /** A spend key refused for `reason`, of the shape the client speaks. */
  async function refusedKey(reason: Refusal, shape: Shape): Promise<string> {
    if (reason === 'model_not_allowed') return (await createKey(shape, { allowed_models: ['some-other-model'] })).key;
    if (reason === 'request_limit_exhausted') {
      const key = await createKey(shape, { request_limit: { count: 1, cycle: 'total' } });
      await useTheOneAllowedRequest(key.key, shape);
      return key.key;
    }
    const key = await createKey(shape);
    if (reason === 'spend_key_paused') await api('PATCH', `/v1/spend_keys/${key.spend_key_id}`, { status: 'paused' });
    else await api('DELETE', `/v1/spend_keys/${key.spend_key_id}`);
    return key.key;
  }

  type Refusal = 'request_limit_exhausted' | 'spend_key_paused' | 'unauthorized' | 'model_not_allowed';
  const REFUSALS: [Refusal, number][] = [
    ['request_limit_exhausted', 403],
    ['spend_key_paused', 403],
    ['unauthorized', 401],
    ['model_not_allowed', 403],
  ];

  /** A fetch that counts the attempts a client makes. */
  function countingFetch(): { fetch: typeof fetch; attempts: () => number } {
    let attempts = 0;
    return {
      fetch: (input, init) => {
        attempts += 1;
        return fetch(input, init);
      },
      attempts: () => attempts,
    };
  }

  const aiSdk = (model: LanguageModel) => generateText({ model, prompt: 'hi', maxOutputTokens: 2 });
  const CLIENTS: [name: string, shape: Shape, call: (key: string, f: typeof fetch) => Promise<unknown>][] = [
    ['openai', 'openai', (key, f) => new OpenAI({ apiKey: key, baseURL: `${base}/v1`, fetch: f }).chat.completions.create({ model: 'gpt-4o-mini', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] })],
    ['@anthropic-ai/sdk', 'anthropic', (key, f) => new Anthropic({ apiKey: key, baseURL: base, fetch: f }).messages.create({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] })],
    ['@google/genai', 'openai', (key, f) => new GoogleGenAI({ apiKey: key, httpOptions: { baseUrl: base, fetch: f } as never }).models.generateContent({ model: 'gemini-2.0-flash', contents: 'hi' })],
    ['ai + @ai-sdk/openai', 'openai', (key, f) => aiSdk(createOpenAI({ apiKey: key, baseURL: `${base}/v1`, fetch: f }).chat('gpt-4o-mini'))],
    ['ai + @ai-sdk/anthropic', 'anthropic', (key, f) => aiSdk(createAnthropic({ apiKey: key, baseURL: `${base}/v1`, fetch: f })('claude-haiku-4-5'))],
    ['ai + @ai-sdk/google', 'openai', (key, f) => aiSdk(createGoogleGenerativeAI({ apiKey: key, baseURL: `${base}/v1beta`, fetch: f })('gemini-2.0-flash'))],
    ['@langchain/openai', 'openai', (key, f) => new ChatOpenAI({ model: 'gpt-4o-mini', apiKey: key, configuration: { baseURL: `${base}/v1`, fetch: f } }).invoke('hi')],
  ];

  for (const [name, shape, call] of CLIENTS) {
    it(`${name} makes one attempt for each refusal and surfaces its status`, async () => {
      for (const [reason, status] of REFUSALS) {
        const key = await refusedKey(reason, shape);
        upstream.reset();
        const counter = countingFetch();
        const error = await call(key, counter.fetch).then(
          () => null,
          (e: unknown) => e as { status?: number; statusCode?: number; message?: string },
        );
        expect(error, `${name}: ${reason}`).not.toBeNull();
        expect(error!.status ?? error!.statusCode ?? (error as { lc_error_code?: string }).lc_error_code, `${name}: ${reason}`).toBe(status);
        expect(counter.attempts(), `${name}: ${reason}`).toBe(1);
        expect(upstream.requests, `${name}: ${reason}`).toHaveLength(0);
      }
    });
  }

  /** A key whose daily request limit of 1 is used up, of the shape the client speaks. */
  async function usedUpDailyKey(shape: Shape): Promise<string> {
    const key = await createKey(shape, { request_limit: { count: 1, cycle: 'daily' } });
    await useTheOneAllowedRequest(key.key, shape);
    return key.key;
  }
  const DAY_MS = 86_400_000;

  it('a daily request limit that resets hours away reaches every client as a prompt 429, never a wait until midnight', async () => {
    // Two minutes past midnight UTC: the limit resets almost a day away.
    t.clock.advance(DAY_MS - (t.clock.now() % DAY_MS) + 120_000);
    for (const [name, shape, call] of CLIENTS) {
      const key = await usedUpDailyKey(shape);
      upstream.reset();
      const counter = countingFetch();
      const started = performance.now();
      const error = await call(key, counter.fetch).then(
        () => null,
        (e: unknown) => e as { status?: number; statusCode?: number; lastError?: { statusCode?: number } },
      );
      const elapsedMs = performance.now() - started;
      expect(error, name).not.toBeNull();
      expect(error!.status ?? error!.statusCode ?? error!.lastError?.statusCode, name).toBe(429);
      // The Vercel AI SDK retries every 429; told retry-after-ms: 0, it does so at once and gives up.
      expect(counter.attempts(), name).toBeLessThanOrEqual(name.startsWith('ai + ') ? 3 : 1);
      expect(elapsedMs, name).toBeLessThan(1_500);
      expect(upstream.requests, name).toHaveLength(0);
    }
  });

  it('a daily request limit that resets within a minute keeps a short Retry-After and leaves retrying to the client', async () => {
    // 30 seconds before midnight UTC.
    t.clock.advance(DAY_MS - (t.clock.now() % DAY_MS) - 30_000);
    const key = await usedUpDailyKey('openai');
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(429);
    const retryAfter = Number(res.headers.get('retry-after'));
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(30);
    expect(res.headers.get('x-should-retry')).toBeNull();
    expect(((await res.json()) as { error: Json }).error).toMatchObject({ code: 'request_limit_reached', type: 'rate_limit_error' });
  });

  it('answers a used-up total request limit with 403 request_limit_exhausted and x-should-retry: false', async () => {
    const key = await refusedKey('request_limit_exhausted', 'openai');
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(403);
    expect(res.headers.get('x-should-retry')).toBe('false');
    expect(res.headers.get('retry-after')).toBeNull();
    const body = (await res.json()) as { error: Json };
    expect(body.error).toMatchObject({ code: 'request_limit_exhausted', type: 'permission_error', status: 403 });
    expect(String(body.error.message)).toContain('never resets');
  });
});
