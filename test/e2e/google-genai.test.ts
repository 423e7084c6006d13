import { ApiError, GoogleGenAI, type GenerateContentParameters } from '@google/genai';
import { describe, expect, it } from 'vitest';
import { BROKE_MESSAGE, useClientHarness, WEATHER_CALL } from '../helpers/client-harness.ts';
import { covers, type Call, type Coverage } from '../helpers/client-matrix.ts';

/**
 * @google/genai 3 through the published client's `providers.google` forward base with a forward
 * token (apiVersion v1beta, as that base names), and through Tollgate's native Gemini drop-in
 * (`baseUrl: <tollgate>`, a spend key as apiKey; the client adds `/v1/models/…`, its default API
 * version). Every call sends "one two three four" (4 input tokens at the mock) capped at 3 output
 * tokens:
 * gemini-2.0-flash at 1 in / 4 out per 1M costs 4 + 12 = 16 per 1M = 0.000016, plus through forward
 * the meter's fee of 7 × 100 per 1M = 0.0007.
 */
const h = useClientHarness();

const REQUEST: GenerateContentParameters = { model: 'gemini-2.0-flash', contents: 'one two three four', config: { maxOutputTokens: 3 } };
const WEATHER_DECLARATION = { name: 'get_weather', description: 'The weather in a city', parametersJsonSchema: { type: 'object', properties: { city: { type: 'string' } } } };
const TOTAL = { 'drop-in': '0.0000160000', forward: '0.0007160000' } as const;

async function genai(path: 'drop-in' | 'forward', key?: string): Promise<GoogleGenAI> {
  if (path === 'drop-in') return new GoogleGenAI({ apiKey: key ?? (await h.spendKey()), httpOptions: { baseUrl: h.base } });
  return new GoogleGenAI({ apiKey: key ?? h.token(), httpOptions: { baseUrl: h.lava.providers.google, apiVersion: 'v1beta' } });
}

/** The API version in the provider's path: the client's default (v1) on the drop-in, the base's on forward. */
const version = (path: 'drop-in' | 'forward') => (path === 'drop-in' ? 'v1' : 'v1beta');

const requestIdOf = (result: { sdkHttpResponse?: { headers?: Record<string, string> } }) => result.sdkHttpResponse?.headers?.['x-tollgate-request-id'];

/** The calls every path proves, written once; the drop-in's wait for its route. */
const CASES: { name: string; calls: Call[]; run: (path: 'drop-in' | 'forward') => Promise<void> }[] = [
  {
    name: 'generateContent: the text and usage; one record at the exact cost',
    calls: ['text'],
    run: async (path) => {
      const result = await (await genai(path)).models.generateContent(REQUEST);
      expect(h.lastUpstream().path).toBe(`/${version(path)}/models/gemini-2.0-flash:generateContent`);
      expect(h.lastUpstream().headers['x-goog-api-key']).toBe('goog-managed');
      expect(result.text).toBe('tok tok tok');
      expect(result.usageMetadata).toMatchObject({ promptTokenCount: 4, candidatesTokenCount: 3 });
      await h.expectBilled(requestIdOf(result), { path, model: 'google/gemini-2.0-flash', input: 4, output: 3, total: TOTAL[path] });
    },
  },
  {
    name: 'generateContentStream: every chunk; billed from the last chunk’s usage',
    calls: ['text stream'],
    run: async (path) => {
      let text = '';
      let requestId: string | undefined;
      for await (const chunk of await (await genai(path)).models.generateContentStream(REQUEST)) {
        text += chunk.text ?? '';
        requestId ??= requestIdOf(chunk);
      }
      expect(text).toBe('tok tok tok');
      expect(h.lastUpstream().path).toBe(`/${version(path)}/models/gemini-2.0-flash:streamGenerateContent`);
      expect(h.lastUpstream().query.getAll('alt')).toEqual(['sse']);
      await h.expectBilled(requestId, { path, model: 'google/gemini-2.0-flash', input: 4, output: 3, total: TOTAL[path] });
    },
  },
  {
    name: 'a function call arrives in functionCalls, JSON and streamed',
    calls: ['tool call', 'tool call stream'],
    run: async (path) => {
      h.upstream.setNext({ toolCall: WEATHER_CALL, times: 2 });
      const request = { ...REQUEST, config: { ...REQUEST.config, tools: [{ functionDeclarations: [WEATHER_DECLARATION] }] } };
      const client = await genai(path);
      const result = await client.models.generateContent(request);
      expect(h.lastUpstream().json).toMatchObject({ tools: [{ functionDeclarations: [{ name: 'get_weather' }] }] });
      expect(result.functionCalls).toEqual([{ name: 'get_weather', args: WEATHER_CALL.arguments }]);
      await h.expectBilled(requestIdOf(result), { path, model: 'google/gemini-2.0-flash', input: 4, output: 3, total: TOTAL[path] });

      const calls: unknown[] = [];
      for await (const chunk of await client.models.generateContentStream(request)) calls.push(...(chunk.functionCalls ?? []));
      expect(calls).toEqual([{ name: 'get_weather', args: WEATHER_CALL.arguments }]);
      expect(await h.recordsOnceThere(2)).toHaveLength(2);
    },
  },
  {
    name: 'a stream the provider cuts fails in the client and is billed for the chunks that arrived',
    calls: ['cut stream billed from what arrived'],
    run: async (path) => {
      h.upstream.setNext({ cutAfterChunks: 2 });
      let text = '';
      const cut = await (async () => {
        for await (const chunk of await (await genai(path)).models.generateContentStream(REQUEST)) text += chunk.text ?? '';
      })().then(
        () => null,
        (e: unknown) => e,
      );
      expect(cut).toBeInstanceOf(Error);
      expect(text).toBe('tok tok');
      // Each chunk carries Gemini's running usage (4 input, 2 output so far): the provider's own counts
      // cover all that arrived, so nothing is estimated. 4 × 1 + 2 × 4 = 12 per 1M, fee 6 × 100 per 1M.
      await h.expectBilled(null, { path, model: 'google/gemini-2.0-flash', input: 4, output: 2, total: path === 'drop-in' ? '0.0000120000' : '0.0006120000' });
    },
  },
  {
    name: "an empty wallet's 402 is the SDK's ApiError carrying Tollgate's message in Google's error shape",
    calls: ["refusal in the client's dialect"],
    run: async (path) => {
      const error = await (await genai(path, await h.brokeCredential(path))).models.generateContent(REQUEST).then(
        () => null,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ApiError);
      expect((error as ApiError).status).toBe(402);
      // The client shows Google's error body: its message, status name and the interface's code as the reason.
      const shown = JSON.parse((error as ApiError).message.slice((error as ApiError).message.indexOf('{'))) as unknown;
      expect(shown).toMatchObject({ error: { code: 402, message: BROKE_MESSAGE, status: 'RESOURCE_EXHAUSTED', details: [{ reason: 'insufficient_balance' }] } });
      await h.expectNothingCharged();
    },
  },
];

const coverage = (path: 'drop-in' | 'forward', calls: Call[]): Coverage[] => calls.map((call) => ({ client: '@google/genai', call, path }));

describe('@google/genai through forward', () => {
  for (const c of CASES) it(c.name, covers(...coverage('forward', c.calls)), () => c.run('forward'));

  it("models.list: the provider's models", covers(...coverage('forward', ['models'])), async () => {
    const names: string[] = [];
    for await (const model of await (await genai('forward')).models.list()) names.push(model.name ?? '');
    expect(h.lastUpstream()).toMatchObject({ method: 'GET', path: '/v1beta/models' });
    expect(names).toEqual(['models/gemini-2.0-flash', 'models/gemini-2.5-pro']);
  });

  it("countTokens: the provider's count, nothing charged", covers(...coverage('forward', ['count tokens'])), async () => {
    const counted = await (await genai('forward')).models.countTokens({ model: 'gemini-2.0-flash', contents: 'one two three four' });
    expect(h.lastUpstream().path).toBe('/v1beta/models/gemini-2.0-flash:countTokens');
    expect(counted.totalTokens).toBe(4);
    const [record] = await h.recordsOnceThere(1);
    expect(await h.t.settledRecord(record!.request_id)).toMatchObject({ status: 'completed', total_request_cost: '0.0000000000' });
  });
});

describe('@google/genai through the native Gemini drop-in', () => {
  for (const c of CASES) it(c.name, covers(...coverage('drop-in', c.calls)), () => c.run('drop-in'));
});
