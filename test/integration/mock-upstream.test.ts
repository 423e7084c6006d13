import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { findProvider, type ProviderModule, type StreamUsage } from '../../src/providers/index.ts';
import { DEFAULT_OUTPUT_TOKENS, startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';

/** Self-test of the fake provider: its answers must be what our provider modules read. */

let mock: MockUpstream;
beforeAll(async () => {
  mock = await startMockUpstream();
});
afterAll(async () => {
  await mock.close();
});
beforeEach(() => mock.reset());

const post = (path: string, body: unknown, init: RequestInit = {}) =>
  fetch(`${mock.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    ...init,
  });

const provider = (publicUrl: string): ProviderModule => findProvider(new URL(publicUrl))!;

async function meterStream(res: Response, module: ProviderModule, publicUrl: string, requestBody: unknown): Promise<StreamUsage> {
  const meter = module.createStreamMeter({ now: Date.now(), url: new URL(publicUrl), requestBody });
  for await (const chunk of res.body!) meter.push(chunk);
  return meter.finish();
}

const chat = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'one two three' }, { role: 'user', content: 'four' }] };

describe('OpenAI', () => {
  it('answers chat completions with deterministic usage', async () => {
    const res = await post('/v1/chat/completions', { ...chat, max_tokens: 7 });
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, unknown>;
    expect(body).toMatchObject({
      id: expect.stringMatching(/^chatcmpl-/),
      model: 'gpt-4o-mini',
      usage: { prompt_tokens: 4, completion_tokens: 7, total_tokens: 11, prompt_tokens_details: { cached_tokens: 0 } },
    });
    const url = 'https://api.openai.com/v1/chat/completions';
    expect(provider(url).usageFromJson(body, { now: Date.now(), url: new URL(url), requestBody: chat })).toMatchObject({
      inputTokens: 4,
      outputTokens: 7,
    });
  });

  it('reports cached tokens when told to', async () => {
    mock.setNext({ cachedTokens: 3 });
    const body = (await (await post('/v1/chat/completions', chat)).json()) as { usage: unknown };
    expect(body.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: DEFAULT_OUTPUT_TOKENS, prompt_tokens_details: { cached_tokens: 3 } });
  });

  it('streams chunks ending in [DONE], with a usage chunk only when include_usage is set', async () => {
    const url = 'https://api.openai.com/v1/chat/completions';
    const plain = await (await post('/v1/chat/completions', { ...chat, stream: true, max_tokens: 3 })).text();
    expect(plain).toContain('"object":"chat.completion.chunk"');
    expect(plain.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(plain).not.toContain('"usage"');

    const requestBody = { ...chat, stream: true, max_tokens: 3, stream_options: { include_usage: true } };
    const res = await post('/v1/chat/completions', requestBody);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const usage = await meterStream(res, provider(url), url, requestBody);
    expect(usage).toMatchObject({ inputTokens: 4, outputTokens: 3, complete: true, estimated: false });
  });

  it('answers the Responses API as JSON and as a stream', async () => {
    const url = 'https://api.openai.com/v1/responses';
    const requestBody = { model: 'gpt-4.1', input: 'a b c d e', max_output_tokens: 2 };
    const body = (await (await post('/v1/responses', requestBody)).json()) as { usage: unknown };
    expect(body.usage).toMatchObject({ input_tokens: 5, output_tokens: 2, total_tokens: 7 });

    const streamed = { ...requestBody, stream: true };
    const text = await (await post('/v1/responses', streamed)).text();
    expect(text).toContain('event: response.completed');
    const usage = await meterStream(await post('/v1/responses', streamed), provider(url), url, streamed);
    expect(usage).toMatchObject({ inputTokens: 5, outputTokens: 2, complete: true });
  });

  it('answers a Responses tool call as a function_call item, JSON and streamed', async () => {
    const url = 'https://api.openai.com/v1/responses';
    const call = { name: 'lookup', arguments: { q: 'x' } };
    mock.setNext({ toolCall: call, times: 2 });
    const requestBody = { model: 'gpt-4.1', input: 'a b', max_output_tokens: 2 };
    const body = (await (await post('/v1/responses', requestBody)).json()) as { output: unknown[] };
    expect(body.output).toMatchObject([{ type: 'function_call', name: 'lookup', arguments: '{"q":"x"}', call_id: expect.stringMatching(/^call_mock/) }]);

    const streamed = { ...requestBody, stream: true };
    const res = await post('/v1/responses', streamed);
    const text = await res.clone().text();
    expect(text).toContain('event: response.function_call_arguments.delta');
    expect(text).toContain('event: response.output_item.done');
    const usage = await meterStream(res, provider(url), url, streamed);
    expect(usage).toMatchObject({ inputTokens: 2, outputTokens: 2, complete: true });
  });

  it('answers embeddings, models and speech', async () => {
    const embeddings = (await (await post('/v1/embeddings', { model: 'text-embedding-3-small', input: ['a b', 'c'] })).json()) as {
      data: unknown[];
      usage: unknown;
    };
    expect(embeddings.data).toHaveLength(2);
    expect(embeddings.usage).toEqual({ prompt_tokens: 3, total_tokens: 3 });

    const models = (await (await fetch(`${mock.url}/v1/models`)).json()) as { object: string; data: unknown[] };
    expect(models.object).toBe('list');
    expect(models.data.length).toBeGreaterThan(0);

    const speech = await post('/v1/audio/speech', { model: 'tts-1', input: 'héllo', voice: 'alloy' });
    expect(speech.headers.get('content-type')).toBe('audio/mpeg');
    expect(Buffer.from(await speech.arrayBuffer())).toEqual(Buffer.from([0, 1, 2, 3, 4]));
  });

  it("serves OpenAI-compatible providers' own base paths (Groq's /openai/v1)", async () => {
    const body = (await (await post('/openai/v1/chat/completions', chat)).json()) as { usage: { prompt_tokens: number } };
    expect(body.usage.prompt_tokens).toBe(4);
  });

  it.each([
    ['a doubled version', '/v1/v1/chat/completions'],
    ['an unknown base', '/v2/chat/completions'],
    ['a base with a trailing slash kept', '/v1//chat/completions'],
    ['a Gemini method under an OpenAI path', '/v1/v1/models/gpt-4o:generateContent'],
    ['an Anthropic path without its version', '/messages'],
  ])('answers 404 to a path no provider serves: %s', async (_label, path) => {
    const res = await post(path, chat);
    expect(res.status).toBe(404);
    expect(await res.json()).toMatchObject({ error: { message: `No provider serves POST ${path}.` } });
  });
});

describe('Anthropic', () => {
  const message = { model: 'claude-sonnet-4-5', max_tokens: 6, system: 'be brief', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi there' }] }] };
  const url = 'https://api.anthropic.com/v1/messages';

  it('answers messages as JSON, cache reads outside input_tokens', async () => {
    mock.setNext({ cachedTokens: 1 });
    const body = (await (await post('/v1/messages', message)).json()) as { usage: unknown };
    expect(body.usage).toMatchObject({ input_tokens: 3, cache_read_input_tokens: 1, output_tokens: 6 });
    expect(provider(url).usageFromJson(body, { now: Date.now(), url: new URL(url), requestBody: message })).toMatchObject({
      inputTokens: 4,
      cachedInputTokens: 1,
      outputTokens: 6,
    });
  });

  it('counts tokens and lists models in Anthropic\'s shape', async () => {
    const counted = (await (await post('/v1/messages/count_tokens', message)).json()) as unknown;
    expect(counted).toEqual({ input_tokens: 4 }); // 'be brief' + 'hi there'
    const models = (await (await fetch(`${mock.url}/v1/models`, { headers: { 'anthropic-version': '2023-06-01' } })).json()) as Record<string, unknown>;
    expect(models).toMatchObject({ data: [{ type: 'model', id: 'claude-haiku-4-5' }, { type: 'model' }], has_more: false });
  });

  it('streams message_start … message_stop', async () => {
    const requestBody = { ...message, stream: true };
    const text = await (await post('/v1/messages', requestBody)).text();
    for (const event of ['message_start', 'content_block_delta', 'message_delta', 'message_stop']) expect(text).toContain(`event: ${event}`);
    const usage = await meterStream(await post('/v1/messages', requestBody), provider(url), url, requestBody);
    expect(usage).toMatchObject({ inputTokens: 4, outputTokens: 6, complete: true, estimated: false });
  });
});

describe('Gemini', () => {
  const request = { contents: [{ role: 'user', parts: [{ text: 'why is the sky blue' }] }], generationConfig: { maxOutputTokens: 4 } };

  it('counts tokens and lists models in Gemini\'s shape', async () => {
    expect(await (await post('/v1beta/models/gemini-2.0-flash:countTokens', request)).json()).toEqual({ totalTokens: 5 });
    const models = (await (await fetch(`${mock.url}/v1beta/models`, { headers: { 'x-goog-api-key': 'k' } })).json()) as { models: { name: string }[] };
    expect(models.models.map((m) => m.name)).toEqual(['models/gemini-2.0-flash', 'models/gemini-2.5-pro']);
  });

  it('answers generateContent with usageMetadata', async () => {
    const path = '/v1beta/models/gemini-2.5-flash:generateContent';
    const body = (await (await post(path, request)).json()) as { usageMetadata: unknown };
    expect(body.usageMetadata).toEqual({ promptTokenCount: 5, candidatesTokenCount: 4, totalTokenCount: 9 });
    const url = `https://generativelanguage.googleapis.com${path}`;
    expect(provider(url).usageFromJson(body, { now: Date.now(), url: new URL(url), requestBody: request })).toMatchObject({
      inputTokens: 5,
      outputTokens: 4,
      model: 'gemini-2.5-flash',
    });
  });

  it('answers 404 in Gemini shape to a method or version Gemini does not have', async () => {
    for (const path of ['/v2/models/gemini-2.5-flash:generateContent', '/v1beta/models/gemini-2.5-flash:chat', '/v1beta/models/a/b:generateContent']) {
      const res = await post(path, request);
      expect(res.status).toBe(404);
    }
    expect(await (await post('/v1beta/models/gemini-2.5-flash:chat', request)).json()).toMatchObject({ error: { code: 404, status: 'NOT_FOUND' } });
  });

  it('streams streamGenerateContent?alt=sse', async () => {
    const path = '/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse';
    const url = `https://generativelanguage.googleapis.com${path}`;
    const res = await post(path, request);
    expect(res.headers.get('content-type')).toBe('text/event-stream');
    const usage = await meterStream(res, provider(url), url, request);
    expect(usage).toMatchObject({ inputTokens: 5, outputTokens: 4, complete: true });
    expect(mock.requests.at(-1)?.query.get('alt')).toBe('sse');
  });
});

describe('recording', () => {
  it('records method, url, headers and the raw body bytes', async () => {
    const raw = '{"model":"gpt-4o-mini",  "messages":[],"x_unknown":{"keep":[1,2.50]}}';
    await post('/v1/chat/completions?a=1', raw, { headers: { 'content-type': 'application/json', 'x-custom': 'yes' } });
    const [recorded] = mock.requests;
    expect(recorded).toMatchObject({ method: 'POST', url: '/v1/chat/completions?a=1', path: '/v1/chat/completions' });
    expect(recorded!.headers['x-custom']).toBe('yes');
    expect(recorded!.body.toString('utf8')).toBe(raw);
    expect(recorded!.json).toMatchObject({ x_unknown: { keep: [1, 2.5] } });
  });

  it('echoes any verb on …/echo', async () => {
    const res = await fetch(`${mock.url}/v1/things/echo?x=1`, { method: 'PATCH', body: 'abc' });
    expect(await res.json()).toMatchObject({ method: 'PATCH', path: '/v1/things/echo', query: { x: '1' }, body: 'abc' });
  });
});

describe('behaviours', () => {
  it('answers provider-shaped errors', async () => {
    mock.setNext({ status: 429 });
    const limited = await post('/v1/chat/completions', chat);
    expect(limited.status).toBe(429);
    expect(limited.headers.get('retry-after')).toBe('1');
    expect(await limited.json()).toMatchObject({ error: { type: 'rate_limit_error' } });

    mock.setNext({ status: 400 });
    expect(await (await post('/v1/messages', {})).json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error' } });

    mock.setNext({ status: 500 });
    expect(await (await post('/v1beta/models/m:generateContent', {})).json()).toMatchObject({ error: { code: 500, status: 'INTERNAL' } });
  });

  it('applies a behaviour only to its path, and only as many times as asked', async () => {
    mock.setNext({ path: '/messages', status: 500, times: 2 });
    expect((await post('/v1/chat/completions', chat)).status).toBe(200);
    expect((await post('/v1/messages', chat)).status).toBe(500);
    expect((await post('/v1/messages', chat)).status).toBe(500);
    expect((await post('/v1/messages', chat)).status).toBe(200);
  });

  it('redirects', async () => {
    mock.setNext({ redirectTo: 'http://elsewhere.example/x' });
    const res = await post('/v1/chat/completions', chat, { redirect: 'manual' });
    expect(res.status).toBe(302);
    expect(res.headers.get('location')).toBe('http://elsewhere.example/x');
  });

  it('delays the first byte', async () => {
    mock.setNext({ delayMs: 150 });
    const started = Date.now();
    await post('/v1/chat/completions', chat);
    expect(Date.now() - started).toBeGreaterThanOrEqual(140);
  });

  it('slows chunks down', async () => {
    mock.setNext({ chunkDelayMs: 30 });
    const started = Date.now();
    await (await post('/v1/chat/completions', { ...chat, stream: true, max_tokens: 3 })).text();
    // role chunk + 3 words + stop chunk + [DONE] = 6 chunks
    expect(Date.now() - started).toBeGreaterThanOrEqual(6 * 30 - 10);
  });

  it('cuts a stream after N chunks, and the meter sees what came before', async () => {
    mock.setNext({ cutAfterChunks: 3 });
    const url = 'https://api.openai.com/v1/chat/completions';
    const requestBody = { ...chat, stream: true, max_tokens: 10, stream_options: { include_usage: true } };
    const res = await post('/v1/chat/completions', requestBody);
    const meter = provider(url).createStreamMeter({ now: Date.now(), url: new URL(url), requestBody });
    const received: string[] = [];
    await expect(
      (async () => {
        for await (const chunk of res.body!) {
          meter.push(chunk);
          received.push(Buffer.from(chunk).toString('utf8'));
        }
      })(),
    ).rejects.toThrow();
    expect(received.join('').match(/^data: /gm)).toHaveLength(3);
    expect(meter.finish()).toMatchObject({ complete: false, estimated: true });
  });

  it('cuts a JSON body', async () => {
    mock.setNext({ cutAfterChunks: 0 });
    const res = await post('/v1/chat/completions', chat);
    expect(res.status).toBe(200);
    await expect(res.text()).rejects.toThrow();
  });

  it('hangs until the client gives up', async () => {
    mock.setNext({ hang: true });
    await expect(post('/v1/chat/completions', chat, { signal: AbortSignal.timeout(200) })).rejects.toThrow();
    expect(mock.requests).toHaveLength(1);
    // The next request is answered normally.
    expect((await post('/v1/chat/completions', chat)).status).toBe(200);
  });
});
