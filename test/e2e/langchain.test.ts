import type { AIMessageChunk } from '@langchain/core/messages';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { describe, expect, it } from 'vitest';
import { BROKE_MESSAGE, useClientHarness, WEATHER_CALL } from '../helpers/client-harness.ts';
import { covers, type Call, type ClientPath } from '../helpers/client-matrix.ts';

/**
 * @langchain/openai 1.x (`ChatOpenAI`, `OpenAIEmbeddings`) through Tollgate's drop-in endpoints
 * (`configuration.baseURL: <tollgate>/v1`, a spend key as apiKey) and through the published
 * client's `providers.openai` forward base with a forward token. LangChain shows no response
 * headers, so each test finds its call's record as the one record of its customer. Every call
 * sends "one two three four" (4 input tokens at the mock) capped at 3 output tokens: gpt-4o at 1 in
 * / 2 out per 1M costs 4 + 6 = 10 per 1M = 0.00001, plus through forward the meter's fee of
 * 7 × 100 per 1M = 0.0007.
 *
 * @langchain/openai 1.6 declares Node >= 22 in its engines (npm warns EBADENGINE on Node 20) and
 * carries openai 7 inside; every call here passes on Node 20.19+, the project's floor. (1.5.x,
 * which declared Node >= 20, carried openai 6, which joins a base URL and a path as strings.)
 */
const h = useClientHarness();

type Via = Exclude<ClientPath, 'rewrite'>;
const TOTAL: Record<Via, string> = { 'drop-in': '0.0000100000', forward: '0.0007100000' };
const PROMPT = 'one two three four';
const WEATHER_TOOL = { type: 'function' as const, function: { name: 'get_weather', description: 'The weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } } } } };

async function connection(path: Via, key?: string) {
  const apiKey = key ?? (path === 'drop-in' ? await h.spendKey() : h.token());
  return { apiKey, maxRetries: 0, configuration: { baseURL: path === 'drop-in' ? `${h.base}/v1` : h.lava.providers.openai } };
}
const chat = async (path: Via, opts: { key?: string; useResponsesApi?: boolean } = {}) =>
  new ChatOpenAI({ model: 'gpt-4o', maxTokens: 3, useResponsesApi: opts.useResponsesApi ?? false, ...(await connection(path, opts.key)) });

async function collect(stream: AsyncIterable<AIMessageChunk>): Promise<AIMessageChunk[]> {
  const chunks: AIMessageChunk[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}
const joined = (chunks: AIMessageChunk[]) => chunks.reduce((all, chunk) => all.concat(chunk));

describe.each(['drop-in', 'forward'] as const)('@langchain/openai through %s', (path) => {
  const on = (...calls: Call[]) => covers(...calls.map((call) => ({ client: '@langchain/openai' as const, call, path })));
  const gpt4o = (tokens: { input: number; output: number; total: string; estimated?: boolean }) => h.expectBilled(null, { path, model: 'openai/gpt-4o', ...tokens });

  it('invoke: the text and usage; one record at the exact cost', on('text'), async () => {
    const message = await (await chat(path)).invoke(PROMPT);
    expect(h.lastUpstream().path).toBe('/v1/chat/completions');
    expect(message.content).toBe('tok tok tok');
    expect(message.usage_metadata).toMatchObject({ input_tokens: 4, output_tokens: 3 });
    await gpt4o({ input: 4, output: 3, total: TOTAL[path] });
  });

  it('stream: every text chunk and the usage LangChain asks for', on('text stream', 'stream with usage'), async () => {
    const chunks = await collect(await (await chat(path)).stream(PROMPT));
    expect(h.lastUpstream().json).toMatchObject({ stream: true, stream_options: { include_usage: true } });
    const message = joined(chunks);
    expect(message.content).toBe('tok tok tok');
    expect(message.usage_metadata).toMatchObject({ input_tokens: 4, output_tokens: 3 });
    await gpt4o({ input: 4, output: 3, total: TOTAL[path] });
  });

  it('bindTools: the tool call with its args, invoked and streamed', on('tool call', 'tool call stream'), async () => {
    h.upstream.setNext({ toolCall: WEATHER_CALL, times: 2 });
    const model = (await chat(path)).bindTools([WEATHER_TOOL]);
    const message = await model.invoke(PROMPT);
    expect(message.tool_calls).toMatchObject([{ name: 'get_weather', args: WEATHER_CALL.arguments }]);
    await gpt4o({ input: 4, output: 3, total: TOTAL[path] });

    const streamed = joined(await collect(await model.stream(PROMPT)));
    expect(streamed.tool_calls).toMatchObject([{ name: 'get_weather', args: WEATHER_CALL.arguments }]);
    expect(await h.recordsOnceThere(2)).toHaveLength(2);
  });

  it('useResponsesApi: invoke and stream on the Responses API', on('responses', 'responses stream'), async () => {
    const model = await chat(path, { useResponsesApi: true });
    const message = await model.invoke(PROMPT);
    expect(h.lastUpstream().path).toBe('/v1/responses');
    expect(message.text).toBe('tok tok tok');
    await gpt4o({ input: 4, output: 3, total: TOTAL[path] });

    const streamed = joined(await collect(await model.stream(PROMPT)));
    expect(streamed.text).toBe('tok tok tok');
    expect(await h.recordsOnceThere(2)).toHaveLength(2);
  });

  it('OpenAIEmbeddings.embedQuery: the vector; input tokens only', on('embeddings'), async () => {
    const embeddings = new OpenAIEmbeddings({ model: 'text-embedding-3-small', ...(await connection(path)) });
    // The client asks for base64 and decodes the float32s.
    expect(await embeddings.embedQuery(PROMPT)).toEqual([0.1, 0.2, 0.3].map(Math.fround));
    // 4 × 0.5 per 1M = 0.000002; fee through forward 4 × 100 per 1M = 0.0004.
    await h.expectBilled(null, { path, model: 'openai/text-embedding-3-small', input: 4, output: 0, total: path === 'drop-in' ? '0.0000020000' : '0.0004020000' });
  });

  it('a stream the provider cuts fails in the client and is billed as estimated', on('cut stream billed from what arrived'), async () => {
    // The role chunk, "tok", " tok" — then the cut.
    h.upstream.setNext({ cutAfterChunks: 3 });
    const texts: string[] = [];
    const cut = await (async () => {
      for await (const chunk of await (await chat(path)).stream(PROMPT)) texts.push(chunk.text);
    })().then(
      () => null,
      (e: unknown) => e,
    );
    expect(cut).toBeInstanceOf(Error);
    expect(texts.join('')).toBe('tok tok');
    // Input estimated from "one two three four" (18 characters) as 5, output from "tok tok" (7) as 2:
    // 5 × 1 + 2 × 2 = 9 per 1M, fee through forward 7 × 100 per 1M.
    await gpt4o({ input: 5, output: 2, total: path === 'drop-in' ? '0.0000090000' : '0.0007090000', estimated: true });
  });

  it("an empty wallet's 402 surfaces with Tollgate's message, status and code", on("refusal in the client's dialect"), async () => {
    const error = await (await chat(path, { key: await h.brokeCredential(path) })).invoke(PROMPT).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(Error);
    expect(error).toMatchObject({ status: 402, code: 'insufficient_balance', message: expect.stringContaining(BROKE_MESSAGE) });
    await h.expectNothingCharged();
  });
});
