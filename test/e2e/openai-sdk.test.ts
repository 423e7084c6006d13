import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { BROKE_MESSAGE, countingFetch, useClientHarness, WEATHER_CALL } from '../helpers/client-harness.ts';
import { covers, type Call, type ClientPath } from '../helpers/client-matrix.ts';

/**
 * openai 7 through Tollgate's drop-in endpoints (`baseURL: <tollgate>/v1`, a spend key as apiKey)
 * and through the published client's `providers.openai` forward base with a forward token, call by
 * call. (the gateway-sdks-*.test.ts files prove the forward path byte for byte and in every billing mode.)
 * Every call sends "one two three four" (4 input tokens at the mock) capped at 3 output tokens:
 * gpt-4o at 1 in / 2 out per 1M costs 4 + 6 = 10 per 1M = 0.00001, plus through forward the
 * meter's fee of 7 × 100 per 1M = 0.0007.
 */
const h = useClientHarness();

type Via = Exclude<ClientPath, 'rewrite'>;
const TOTAL: Record<Via, string> = { 'drop-in': '0.0000100000', forward: '0.0007100000' };
const PROMPT = 'one two three four';
const CHAT = { model: 'gpt-4o', max_tokens: 3, messages: [{ role: 'user' as const, content: PROMPT }] };
const WEATHER_TOOL = { type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };

async function client(path: Via, opts: { key?: string; fetch?: typeof fetch; maxRetries?: number } = {}): Promise<OpenAI> {
  const apiKey = opts.key ?? (path === 'drop-in' ? await h.spendKey('openai') : h.token());
  const baseURL = path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.openai;
  return new OpenAI({ apiKey, baseURL, maxRetries: opts.maxRetries ?? 0, ...(opts.fetch ? { fetch: opts.fetch } : {}) });
}

const failure = async (call: Promise<unknown>) => call.then(() => null, (e: unknown) => e);
const gpt4o = (path: Via, requestId: string | null, tokens: { input: number; output: number; total: string; estimated?: boolean }) =>
  h.expectBilled(requestId, { path, model: 'openai/gpt-4o', ...tokens });

describe.each(['drop-in', 'forward'] as const)('openai 7 through %s', (path) => {
  const on = (...calls: Call[]) => covers(...calls.map((call) => ({ client: 'openai' as const, call, path })));

  it('chat.completions.create: the text and usage; one record at the exact cost', on('text'), async () => {
    const { data, response } = await (await client(path)).chat.completions.create(CHAT).withResponse();
    expect(h.lastUpstream().path).toBe('/v1/chat/completions');
    expect(h.lastUpstream().headers.authorization).toBe('Bearer sk-managed-openai');
    expect(data.choices[0]!.message.content).toBe('tok tok tok');
    expect(data.usage).toMatchObject({ prompt_tokens: 4, completion_tokens: 3 });
    const record = await gpt4o(path, response.headers.get('x-tollgate-request-id'), { input: 4, output: 3, total: TOTAL[path] });
    expect(record.response_id).toBe(data.id);
  });

  it('a stream without include_usage: text chunks and no usage chunk; billed from the usage the gateway asked for', on('text stream'), async () => {
    const { data: stream, response } = await (await client(path)).chat.completions.create({ ...CHAT, stream: true }).withResponse();
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('tok tok tok');
    expect(chunks.some((c) => c.usage)).toBe(false);
    expect(h.lastUpstream().json).toMatchObject({ stream_options: { include_usage: true } });
    await gpt4o(path, response.headers.get('x-tollgate-request-id'), { input: 4, output: 3, total: TOTAL[path] });
  });

  it('a stream with include_usage ends with the usage chunk', on('stream with usage'), async () => {
    const { data: stream, response } = await (await client(path)).chat.completions
      .create({ ...CHAT, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 4, completion_tokens: 3, total_tokens: 7 } });
    await gpt4o(path, response.headers.get('x-tollgate-request-id'), { input: 4, output: 3, total: TOTAL[path] });
  });

  it('a tool call arrives with its arguments, JSON and streamed', on('tool call', 'tool call stream'), async () => {
    h.upstream.setNext({ toolCall: WEATHER_CALL, times: 2 });
    const openai = await client(path);
    const completion = await openai.chat.completions.create({ ...CHAT, tools: [WEATHER_TOOL] });
    expect(h.lastUpstream().json).toMatchObject({ tools: [WEATHER_TOOL] });
    expect(completion.choices[0]).toMatchObject({
      finish_reason: 'tool_calls',
      message: { tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(WEATHER_CALL.arguments) } }] },
    });
    await gpt4o(path, null, { input: 4, output: 3, total: TOTAL[path] });

    const final = await openai.chat.completions.stream({ ...CHAT, tools: [WEATHER_TOOL], stream: true }).finalChatCompletion();
    expect(final.choices[0]).toMatchObject({ finish_reason: 'tool_calls', message: { tool_calls: [{ function: { name: 'get_weather', arguments: JSON.stringify(WEATHER_CALL.arguments) } }] } });
    expect(await h.recordsOnceThere(2)).toHaveLength(2);
  });

  it('responses.create: output_text and usage; one record at the exact cost', on('responses'), async () => {
    const { data, response } = await (await client(path)).responses.create({ model: 'gpt-4o', input: PROMPT, max_output_tokens: 3 }).withResponse();
    expect(h.lastUpstream().path).toBe('/v1/responses');
    expect(data.output_text).toBe('tok tok tok');
    expect(data.usage).toMatchObject({ input_tokens: 4, output_tokens: 3 });
    await gpt4o(path, response.headers.get('x-tollgate-request-id'), { input: 4, output: 3, total: TOTAL[path] });
  });

  it('responses.stream: text deltas, a function call, the completed response', on('responses stream'), async () => {
    const stream = (await client(path)).responses.stream({ model: 'gpt-4o', input: PROMPT, max_output_tokens: 3 });
    const deltas: string[] = [];
    stream.on('response.output_text.delta', (event) => deltas.push(event.delta));
    const final = await stream.finalResponse();
    expect(deltas.join('')).toBe('tok tok tok');
    expect(final.usage).toMatchObject({ input_tokens: 4, output_tokens: 3 });
    await gpt4o(path, null, { input: 4, output: 3, total: TOTAL[path] });

    h.upstream.setNext({ toolCall: WEATHER_CALL });
    const called = await (await client(path)).responses
      .stream({ model: 'gpt-4o', input: PROMPT, max_output_tokens: 3, tools: [{ type: 'function', name: 'get_weather', parameters: WEATHER_TOOL.function.parameters, strict: false }] })
      .finalResponse();
    expect(called.output).toMatchObject([{ type: 'function_call', name: 'get_weather', arguments: JSON.stringify(WEATHER_CALL.arguments) }]);
  });

  it('embeddings.create: the vector; input tokens only', on('embeddings'), async () => {
    const { data, response } = await (await client(path)).embeddings.create({ model: 'text-embedding-3-small', input: PROMPT, encoding_format: 'float' }).withResponse();
    expect(data.data[0]!.embedding).toEqual([0.1, 0.2, 0.3]);
    // 4 × 0.5 per 1M = 0.000002; fee through forward 4 × 100 per 1M = 0.0004.
    const total = path === 'drop-in' ? '0.0000020000' : '0.0004020000';
    await h.expectBilled(response.headers.get('x-tollgate-request-id'), { path, model: 'openai/text-embedding-3-small', input: 4, output: 0, total });
  });

  it('models.list: a list the client pages through', on('models'), async () => {
    const ids: string[] = [];
    for await (const model of (await client(path)).models.list()) ids.push(model.id);
    // The drop-in lists the catalog's models its providers serve; forward relays the provider's list.
    if (path === 'drop-in') expect(ids).toContain('gpt-4o');
    else expect(ids).toEqual(['gpt-4o-mini', 'gpt-4.1']);
  });

  it('a stream the provider cuts fails in the client and is billed as estimated', on('cut stream billed from what arrived'), async () => {
    // The role chunk, "tok", " tok" — then the cut.
    h.upstream.setNext({ cutAfterChunks: 3 });
    const stream = await (await client(path)).chat.completions.create({ ...CHAT, stream: true });
    const texts: string[] = [];
    const error = await failure(
      (async () => {
        for await (const chunk of stream) texts.push(chunk.choices[0]?.delta.content ?? '');
      })(),
    );
    expect(error).toBeInstanceOf(Error);
    expect(texts.join('')).toBe('tok tok');
    // Input estimated from "one two three four" (18 characters) as 5, output from "tok tok" (7) as 2:
    // 5 × 1 + 2 × 2 = 9 per 1M, fee through forward 7 × 100 per 1M.
    await gpt4o(path, null, { input: 5, output: 2, total: path === 'drop-in' ? '0.0000090000' : '0.0007090000', estimated: true });
  });

  it("an empty wallet's 402 is an APIError with Tollgate's message, OpenAI's type and the interface's code", on("refusal in the client's dialect"), async () => {
    const broke = await client(path, { key: await h.brokeCredential(path) });
    const error = await failure(broke.chat.completions.create(CHAT));
    expect(error).toBeInstanceOf(OpenAI.APIError);
    expect(error).toMatchObject({ status: 402, code: 'insufficient_balance', type: 'insufficient_quota', message: `402 ${BROKE_MESSAGE}` });
    await h.expectNothingCharged();
  });
});

describe('openai 7 and a request limit that never resets', () => {
  it('refuses the call over the limit once: the SDK does not retry it', covers({ client: 'openai', call: 'non-retryable refusal not retried', path: 'drop-in' }), async () => {
    const counted = countingFetch();
    const key = await h.limitedSpendKey({ request_shape: 'openai', request_limit: { count: 1, cycle: 'total' } });
    // The SDK's default of two retries: the refusal (403, x-should-retry: false) gets none of them.
    const openai = await client('drop-in', { key, fetch: counted.fetch, maxRetries: 2 });
    await openai.chat.completions.create(CHAT);
    const error = await failure(openai.chat.completions.create(CHAT));
    expect(error).toBeInstanceOf(OpenAI.PermissionDeniedError);
    expect(error).toMatchObject({ status: 403, code: 'request_limit_exhausted' });
    expect(counted.calls()).toBe(2);
    expect(h.upstream.requests).toHaveLength(1);
  });
});
