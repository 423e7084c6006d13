import { createAnthropic } from '@ai-sdk/anthropic';
import { createGoogleGenerativeAI } from '@ai-sdk/google';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { APICallError, embed, generateText, jsonSchema, streamText, tool, type LanguageModel } from 'ai';
import { describe, expect, it } from 'vitest';
import { BROKE_MESSAGE, countingFetch, useClientHarness, WEATHER_CALL, type PricedModel } from '../helpers/client-harness.ts';
import { covers, type Call, type Client, type ClientPath } from '../helpers/client-matrix.ts';

/**
 * The Vercel AI SDK (`ai` 7) with its provider packages, pointed at Tollgate's drop-in endpoints
 * with a spend key and at /v1/forward (the published client's `providers` bases) with a forward
 * token. Every call uses the prompt "one two three four" (4 input tokens at the mock) and a cap of
 * 3 output tokens, so the hand-worked totals below hold for every call of a model:
 *   gpt-4o            4 × 1 + 3 × 2 = 10 per 1M → 0.00001
 *   claude-haiku-4-5  4 × 1 + 3 × 5 = 19 per 1M → 0.000019
 *   gemini-2.0-flash  4 × 1 + 3 × 4 = 16 per 1M → 0.000016
 * plus, through forward, the meter's fee of 7 tokens × 100 per 1M = 0.0007.
 */
const h = useClientHarness();

const PROMPT = 'one two three four';
const WEATHER = { get_weather: tool({ description: 'The weather in a city', inputSchema: jsonSchema<{ city: string; unit: string }>({ type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } } }) }) };

type Via = Exclude<ClientPath, 'rewrite'>;

type Family = {
  client: Client;
  priced: PricedModel;
  totals: Record<Via, string>;
  /** The provider path the call reaches, JSON and streamed. */
  upstreamPath: string;
  streamPath: string;
  /** Whether the client itself asks an OpenAI-shaped stream for its usage chunk. */
  asksForUsage: boolean;
  /** Chunks of the mock's stream to let through before the cut, and what they are billed. */
  cut: { chunks: number; input: number; output: number; total: Record<Via, string>; estimated: boolean };
  /** The client's model, with this test's credential unless `key` names another. */
  model(path: Via, key?: string): Promise<LanguageModel>;
};

const credential = (path: Via, shape: 'openai' | 'anthropic' = 'openai') => (path === 'drop-in' ? h.spendKey(shape) : Promise.resolve(h.token()));

const FAMILIES: (Family & { paths: Via[] })[] = [
  {
    client: '@ai-sdk/openai',
    paths: ['drop-in', 'forward'],
    priced: 'openai/gpt-4o',
    totals: { 'drop-in': '0.0000100000', forward: '0.0007100000' },
    upstreamPath: '/v1/chat/completions',
    streamPath: '/v1/chat/completions',
    asksForUsage: true,
    // role chunk, "tok", " tok": 7 characters → 2 output tokens; input from the request's
    // "one two three four" (18 characters) → 5: 5 × 1 + 2 × 2 = 9 per 1M, fee 7 × 100 per 1M.
    cut: { chunks: 3, input: 5, output: 2, total: { 'drop-in': '0.0000090000', forward: '0.0007090000' }, estimated: true },
    model: async (path, key) =>
      createOpenAI({ baseURL: path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.openai, apiKey: key ?? (await credential(path)) }).chat('gpt-4o'),
  },
  {
    client: '@ai-sdk/anthropic',
    paths: ['drop-in', 'forward'],
    priced: 'anthropic/claude-haiku-4-5',
    totals: { 'drop-in': '0.0000190000', forward: '0.0007190000' },
    upstreamPath: '/v1/messages',
    streamPath: '/v1/messages',
    asksForUsage: false,
    // message_start (4 input, 1 output reported), block start, ping, "tok", " tok": 1 + 2 output:
    // 4 × 1 + 3 × 5 = 19 per 1M, fee 7 × 100 per 1M.
    cut: { chunks: 5, input: 4, output: 3, total: { 'drop-in': '0.0000190000', forward: '0.0007190000' }, estimated: true },
    model: async (path, key) =>
      createAnthropic({ baseURL: path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.anthropic, apiKey: key ?? (await credential(path, 'anthropic')) })(
        'claude-haiku-4-5',
      ),
  },
  {
    client: '@ai-sdk/google',
    paths: ['drop-in', 'forward'],
    priced: 'google/gemini-2.0-flash',
    totals: { 'drop-in': '0.0000160000', forward: '0.0007160000' },
    upstreamPath: '/v1beta/models/gemini-2.0-flash:generateContent',
    streamPath: '/v1beta/models/gemini-2.0-flash:streamGenerateContent',
    asksForUsage: false,
    // Two chunks, each with Gemini's running usage (4 input, 2 output so far): the provider's own
    // counts cover all that arrived, so nothing is estimated. 4 × 1 + 2 × 4 = 12 per 1M, fee 6 × 100.
    cut: { chunks: 2, input: 4, output: 2, total: { 'drop-in': '0.0000120000', forward: '0.0006120000' }, estimated: false },
    model: async (path, key) =>
      createGoogleGenerativeAI({ baseURL: path === 'drop-in' ? `${h.base}/v1beta` : h.lava.providers.google, apiKey: key ?? (await credential(path)) })(
        'gemini-2.0-flash',
      ),
  },
  {
    client: '@ai-sdk/openai-compatible',
    paths: ['drop-in', 'forward'],
    priced: 'google-openai/gemini-2.0-flash',
    totals: { 'drop-in': '0.0000160000', forward: '0.0007160000' },
    upstreamPath: '/v1beta/openai/chat/completions',
    streamPath: '/v1beta/openai/chat/completions',
    asksForUsage: true,
    // As for OpenAI: 5 input, 2 output estimated: 5 × 1 + 2 × 4 = 13 per 1M, fee 7 × 100 per 1M.
    cut: { chunks: 3, input: 5, output: 2, total: { 'drop-in': '0.0000130000', forward: '0.0007130000' }, estimated: true },
    model: async (path, key) =>
      createOpenAICompatible({
        name: 'tollgate',
        baseURL: path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.googleOpenaiCompatible,
        apiKey: key ?? (await credential(path)),
        includeUsage: true,
      })('gemini-2.0-flash'),
  },
];

for (const family of FAMILIES) {
  describe.each(family.paths)(`${family.client} through %s`, (path) => {
    const billed = (requestId: string | undefined, tokens: { input: number; output: number; total: string; estimated?: boolean }) =>
      h.expectBilled(requestId, { path, model: family.priced, ...tokens });

    it('generateText: the text and usage; one record at the exact cost', covers({ client: family.client, call: 'text', path }), async () => {
      const result = await generateText({ model: await family.model(path), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 });
      expect(result.text).toBe('tok tok tok');
      expect(result.usage).toMatchObject({ inputTokens: 4, outputTokens: 3 });
      expect(h.lastUpstream().path).toBe(family.upstreamPath);
      await billed(result.response.headers?.['x-tollgate-request-id'], { input: 4, output: 3, total: family.totals[path] });
    });

    // The OpenAI-shaped providers ask for the usage chunk themselves (the SDK reads the usage from it).
    const streamCalls: Call[] = family.asksForUsage ? ['text stream', 'stream with usage'] : ['text stream'];
    it('streamText: every text delta and the usage; one record at the exact cost', covers(...streamCalls.map((call) => ({ client: family.client, call, path }))), async () => {
      const result = streamText({ model: await family.model(path), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 });
      const deltas: string[] = [];
      for await (const delta of result.textStream) deltas.push(delta);
      expect(deltas.join('')).toBe('tok tok tok');
      expect(await result.usage).toMatchObject({ inputTokens: 4, outputTokens: 3 });
      expect(h.lastUpstream().path).toBe(family.streamPath);
      if (family.asksForUsage) expect(h.lastUpstream().json).toMatchObject({ stream_options: { include_usage: true } });
      await billed((await result.response).headers?.['x-tollgate-request-id'], { input: 4, output: 3, total: family.totals[path] });
    });

    it('a tool call arrives as the SDK tool call, JSON and streamed', covers({ client: family.client, call: 'tool call', path }, { client: family.client, call: 'tool call stream', path }), async () => {
      h.upstream.setNext({ toolCall: WEATHER_CALL, times: 2 });
      const model = await family.model(path);
      const result = await generateText({ model, prompt: PROMPT, tools: WEATHER, maxOutputTokens: 3, maxRetries: 0 });
      expect(result.finishReason).toBe('tool-calls');
      expect(result.toolCalls).toMatchObject([{ toolName: 'get_weather', input: WEATHER_CALL.arguments }]);
      await billed(result.response.headers?.['x-tollgate-request-id'], { input: 4, output: 3, total: family.totals[path] });

      const streamed = streamText({ model, prompt: PROMPT, tools: WEATHER, maxOutputTokens: 3, maxRetries: 0 });
      expect(await streamed.toolCalls).toMatchObject([{ toolName: 'get_weather', input: WEATHER_CALL.arguments }]);
      expect(await streamed.finishReason).toBe('tool-calls');
      expect(await h.recordsOnceThere(2)).toHaveLength(2);
    });

    it('a stream the provider cuts fails in the client and is billed for what arrived', covers({ client: family.client, call: 'cut stream billed from what arrived', path }), async () => {
      h.upstream.setNext({ cutAfterChunks: family.cut.chunks });
      const result = streamText({ model: await family.model(path), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0, onError: () => {} });
      const parts: string[] = [];
      const cut = await (async () => {
        for await (const part of result.fullStream) parts.push(part.type);
      })().catch((e: unknown) => e);
      // The SDK reports the truncated transfer, as it would talking to the provider directly.
      expect(APICallError.isInstance(cut) || parts.includes('error')).toBe(true);
      expect(parts).not.toContain('finish');
      await billed(undefined, { input: family.cut.input, output: family.cut.output, total: family.cut.total[path], estimated: family.cut.estimated });
    });

    it("a refusal (empty wallet) surfaces as APICallError with Tollgate's message", covers({ client: family.client, call: "refusal in the client's dialect", path }), async () => {
      const broke = await h.brokeCredential(path, family.client === '@ai-sdk/anthropic' ? 'anthropic' : 'openai');
      const refused = await generateText({ model: await family.model(path, broke), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 }).catch((e: unknown) => e);
      expect(APICallError.isInstance(refused)).toBe(true);
      const error = refused as APICallError;
      expect(error.statusCode).toBe(402);
      expect(error.message).toBe(BROKE_MESSAGE);
      expect(error.isRetryable).toBe(false);
      await h.expectNothingCharged();
    });
  });
}

describe('@ai-sdk/openai Responses API and embeddings', () => {
  const openai = async (path: Via) => createOpenAI({ baseURL: path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.openai, apiKey: await credential(path) });
  const totals = { 'drop-in': '0.0000100000', forward: '0.0007100000' } as const;

  describe.each(['drop-in', 'forward'] as const)('through %s', (path) => {
    it('generateText on the Responses API (the default model)', covers({ client: '@ai-sdk/openai', call: 'responses', path }), async () => {
      const result = await generateText({ model: (await openai(path))('gpt-4o'), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 });
      expect(h.lastUpstream().path).toBe('/v1/responses');
      expect(result.text).toBe('tok tok tok');
      await h.expectBilled(result.response.headers?.['x-tollgate-request-id'], { path, model: 'openai/gpt-4o', input: 4, output: 3, total: totals[path] });
    });

    it('streamText on the Responses API, and a tool call', covers({ client: '@ai-sdk/openai', call: 'responses stream', path }), async () => {
      const result = streamText({ model: (await openai(path))('gpt-4o'), prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 });
      expect(await result.text).toBe('tok tok tok');
      await h.expectBilled((await result.response).headers?.['x-tollgate-request-id'], { path, model: 'openai/gpt-4o', input: 4, output: 3, total: totals[path] });

      h.upstream.setNext({ toolCall: WEATHER_CALL });
      const called = streamText({ model: (await openai(path))('gpt-4o'), prompt: PROMPT, tools: WEATHER, maxOutputTokens: 3, maxRetries: 0 });
      expect(await called.toolCalls).toMatchObject([{ toolName: 'get_weather', input: WEATHER_CALL.arguments }]);
    });

    it('embed: the vector; input tokens only', covers({ client: '@ai-sdk/openai', call: 'embeddings', path }), async () => {
      const result = await embed({ model: (await openai(path)).embedding('text-embedding-3-small'), value: PROMPT, maxRetries: 0 });
      expect(result.embedding).toEqual([0.1, 0.2, 0.3]);
      // 4 × 0.5 per 1M = 0.000002; fee through forward 4 × 100 per 1M = 0.0004.
      const total = path === 'drop-in' ? '0.0000020000' : '0.0004020000';
      await h.expectBilled(result.response?.headers?.['x-tollgate-request-id'], { path, model: 'openai/text-embedding-3-small', input: 4, output: 0, total });
    });
  });
});

describe('a request limit that never resets', () => {
  it('is refused once and not retried by the AI SDK', covers({ client: '@ai-sdk/openai', call: 'non-retryable refusal not retried', path: 'drop-in' }), async () => {
    const key = await h.limitedSpendKey({ request_shape: 'openai', request_limit: { count: 1, cycle: 'total' } });
    const counted = countingFetch();
    const model = createOpenAI({ baseURL: `${h.base}/v1`, apiKey: key, fetch: counted.fetch }).chat('gpt-4o');
    await generateText({ model, prompt: PROMPT, maxOutputTokens: 3, maxRetries: 0 });
    // The SDK's default: two retries, which it makes for any 429 and any 5xx, but not for a 403.
    const refused = await generateText({ model, prompt: PROMPT, maxOutputTokens: 3 }).catch((e: unknown) => e);
    expect(APICallError.isInstance(refused)).toBe(true);
    expect(refused).toMatchObject({ statusCode: 403, isRetryable: false });
    expect(counted.calls()).toBe(2);
  });
});
