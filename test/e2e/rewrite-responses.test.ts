import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, streamText, tool } from 'ai';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { covers, type Call, type Client } from '../helpers/client-matrix.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { useRewriteHarness, WEATHER_TOOL } from '../helpers/rewrite-harness.ts';

/**
 * OpenAI's Responses API through the rewrite proxy: clients that speak it (`openai`'s
 * `responses.create`, and `@ai-sdk/openai`'s default model) call Anthropic and Gemini. Each test
 * checks the provider's request, what the client read (text, items, status, usage, the stream's
 * events) and the exact bill, which comes from the provider's own usage.
 *
 * The mock Anthropic stops at the request's `max_tokens` (which the proxy always sends), so its
 * answers are `incomplete` with reason `max_output_tokens`, as OpenAI reports a capped answer;
 * the mock Gemini ends with STOP, so its answers are `completed`.
 */

/** What a test proves for docs/clients.md: calls of a client on the rewrite path. */
const rewrite = (client: Client, ...calls: Call[]) => covers(...calls.map((call) => ({ client, call, path: 'rewrite' as const })));

const TEXT_STREAM_EVENTS = (words: number) => [
  'response.created',
  'response.in_progress',
  'response.output_item.added',
  'response.content_part.added',
  ...Array.from({ length: words }, () => 'response.output_text.delta'),
  'response.output_text.done',
  'response.content_part.done',
  'response.output_item.done',
];

describe.each(databasesUnderTest())('the Responses API through the rewrite proxy on %s', (dialect) => {
  const h = useRewriteHarness(dialect);
  const { token, rewriteBase, lastUpstream, customerRecords, recordsOnceThere, expectBilled } = h;
  const openaiOn = (providerBase: string) => new OpenAI({ apiKey: token(), baseURL: rewriteBase('openai', providerBase), maxRetries: 0 });
  const claude = () => openaiOn('https://api.anthropic.com/v1');
  const gemini = () => openaiOn('https://generativelanguage.googleapis.com/v1beta');

  describe('openai responses.create', () => {
    it('to Anthropic: instructions and input become a Messages request; the answer is a response with its output text and usage', rewrite('openai', 'responses'), async () => {
      const { data, response } = await claude()
        .responses.create({ model: 'claude-haiku-4-5', instructions: 'be brief', input: 'one two three', max_output_tokens: 4, store: false })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/messages');
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.json).toEqual({ model: 'claude-haiku-4-5', max_tokens: 4, system: 'be brief', messages: [{ role: 'user', content: 'one two three' }] });
      expect(data).toMatchObject({
        object: 'response',
        model: 'claude-haiku-4-5',
        status: 'incomplete',
        incomplete_details: { reason: 'max_output_tokens' },
        output: [{ type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'tok tok tok tok', annotations: [] }] }],
        usage: { input_tokens: 5, output_tokens: 4, total_tokens: 9, input_tokens_details: { cached_tokens: 0 } },
      });
      expect(data.output_text).toBe('tok tok tok tok');
      // base 5 × 1 + 4 × 5 = 25 per 1M; fee 9 × 100 per 1M
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'anthropic', model: 'anthropic/claude-haiku-4-5', input: 5, output: 4, total: '0.0009250000' });
    });

    it("to Gemini, streamed: OpenAI's events in OpenAI's order, usage in response.completed", rewrite('openai', 'responses stream'), async () => {
      const stream = gemini().responses.stream({ model: 'gemini-2.0-flash', input: [{ role: 'user', content: [{ type: 'input_text', text: 'a b c' }] }], max_output_tokens: 3 });
      const types: string[] = [];
      const deltas: string[] = [];
      const sequence: number[] = [];
      for await (const event of stream) {
        types.push(event.type);
        sequence.push(event.sequence_number);
        if (event.type === 'response.output_text.delta') deltas.push(event.delta);
      }
      const final = await stream.finalResponse();

      expect(lastUpstream().url).toBe('/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse');
      expect(lastUpstream().json).toEqual({ contents: [{ role: 'user', parts: [{ text: 'a b c' }] }], generationConfig: { maxOutputTokens: 3 } });
      expect(types).toEqual([...TEXT_STREAM_EVENTS(3), 'response.completed']);
      expect(sequence).toEqual(types.map((_, i) => i));
      expect(deltas).toEqual(['tok', ' tok', ' tok']);
      expect(final).toMatchObject({ status: 'completed', model: 'gemini-2.0-flash', usage: { input_tokens: 3, output_tokens: 3, total_tokens: 6 } });
      expect(final.output_text).toBe('tok tok tok');
      const [record] = await recordsOnceThere(1);
      // base 3 × 1 + 3 × 4 = 15 per 1M; fee 6 × 100 per 1M
      await expectBilled(record!.request_id, { provider: 'google', model: 'google/gemini-2.0-flash', input: 3, output: 3, total: '0.0006150000' });
    });

    it('to Anthropic streamed, the capped answer ends in response.incomplete with the usage; to Gemini not streamed, a completed response', rewrite('openai', 'responses stream', 'responses'), async () => {
      const events: OpenAI.Responses.ResponseStreamEvent[] = [];
      for await (const event of await claude().responses.create({ model: 'claude-haiku-4-5', input: 'x y', max_output_tokens: 2, stream: true })) events.push(event);
      expect(lastUpstream().json).toMatchObject({ stream: true, max_tokens: 2 });
      expect(events.map((e) => e.type)).toEqual([...TEXT_STREAM_EVENTS(2), 'response.incomplete']);
      expect(events.at(-1)).toMatchObject({
        response: { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' }, usage: { input_tokens: 2, output_tokens: 2 } },
      });
      h.upstream.reset();

      const answer = await gemini().responses.create({ model: 'gemini-2.0-flash', input: 'x y', max_output_tokens: 2 });
      expect(lastUpstream().path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
      expect(answer).toMatchObject({ status: 'completed', incomplete_details: null, usage: { input_tokens: 2, output_tokens: 2 } });
      expect(answer.output_text).toBe('tok tok');
    });

    it('a tool call comes back as a function_call item, JSON and streamed; its output goes back as a tool result', rewrite('openai', 'tool call', 'tool call stream'), async () => {
      const tools = [{ type: 'function' as const, name: 'get_weather', description: 'Weather', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false }];
      h.upstream.setNext({ toolCall: WEATHER_TOOL, times: 2 });
      const request = { model: 'claude-haiku-4-5', input: 'weather in Paris', tools, max_output_tokens: 5 };

      const answer = await claude().responses.create(request);
      expect(lastUpstream().json).toMatchObject({ tools: [{ name: 'get_weather', description: 'Weather', input_schema: tools[0]!.parameters }] });
      expect(answer.status).toBe('completed');
      expect(answer.output).toEqual([
        { id: expect.stringMatching(/^fc_toolu_mock\d+$/), type: 'function_call', status: 'completed', call_id: expect.stringMatching(/^toolu_mock\d+$/), name: 'get_weather', arguments: JSON.stringify(WEATHER_TOOL.arguments) },
      ]);

      const stream = claude().responses.stream(request);
      const argumentDeltas: string[] = [];
      stream.on('response.function_call_arguments.delta', (event) => argumentDeltas.push(event.delta));
      const streamed = await stream.finalResponse();
      expect(argumentDeltas.join('')).toBe(JSON.stringify(WEATHER_TOOL.arguments));
      expect(streamed.output).toMatchObject([{ type: 'function_call', name: 'get_weather', arguments: JSON.stringify(WEATHER_TOOL.arguments), status: 'completed' }]);

      const call = answer.output[0] as OpenAI.Responses.ResponseFunctionToolCall;
      await claude().responses.create({
        model: 'claude-haiku-4-5',
        max_output_tokens: 2,
        input: [{ role: 'user', content: 'weather in Paris' }, call, { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }],
      });
      expect((lastUpstream().json as { messages: unknown[] }).messages).toEqual([
        { role: 'user', content: 'weather in Paris' },
        { role: 'assistant', content: [{ type: 'tool_use', id: call.call_id, name: 'get_weather', input: WEATHER_TOOL.arguments }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: call.call_id, content: 'sunny' }] },
      ]);
    });

    it("the provider's error reaches the client as OpenAI's typed error, and the call is recorded unbilled", async () => {
      h.upstream.setNext({ status: 429 });
      const error = await gemini()
        .responses.create({ model: 'gemini-2.0-flash', input: 'hi' })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OpenAI.RateLimitError);
      expect((error as { error: unknown }).error).toMatchObject({ message: 'Mock upstream error 429.', type: 'rate_limit_error' });
      const [record] = await recordsOnceThere(1);
      expect(await h.t.settledRecord(record!.request_id)).toMatchObject({ status: 'error', total_request_cost: '0.0000000000' });
    });

    it('what needs OpenAI’s own state is refused by name before any provider call, and nothing is billed', async () => {
      const error = await claude()
        .responses.create({ model: 'claude-haiku-4-5', input: 'hi', previous_response_id: 'resp_1', store: true })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OpenAI.BadRequestError);
      const body = (error as { error: { code: string; message: string; issues: { path: string[] }[] } }).error;
      expect(body.code).toBe('untranslatable_request');
      expect(body.message).toContain('previous_response_id');
      expect(body.issues.map((issue) => issue.path)).toEqual([['previous_response_id'], ['store']]);
      expect(h.upstream.requests).toHaveLength(0);
      expect(await customerRecords()).toEqual([]);
    });
  });

  describe('ai with @ai-sdk/openai (its default model speaks the Responses API)', () => {
    const openaiProvider = () => createOpenAI({ apiKey: token(), baseURL: rewriteBase('openai', 'https://api.anthropic.com/v1') });

    it('generateText to Anthropic: text, usage and the exact bill', rewrite('@ai-sdk/openai', 'responses'), async () => {
      const result = await generateText({ model: openaiProvider()('claude-haiku-4-5'), system: 'terse', prompt: 'one two', maxOutputTokens: 3, maxRetries: 0 });
      expect(lastUpstream().path).toBe('/v1/messages');
      expect(lastUpstream().json).toEqual({ model: 'claude-haiku-4-5', max_tokens: 3, system: 'terse', messages: [{ role: 'user', content: 'one two' }] });
      expect(result.text).toBe('tok tok tok');
      expect(result.finishReason).toBe('length');
      expect(result.usage).toMatchObject({ inputTokens: 3, outputTokens: 3 });
      const [record] = await recordsOnceThere(1);
      // base 3 × 1 + 3 × 5 = 18 per 1M; fee 6 × 100 per 1M
      await expectBilled(record!.request_id, { provider: 'anthropic', model: 'anthropic/claude-haiku-4-5', input: 3, output: 3, total: '0.0006180000' });
    });

    it('streamText to Gemini, and a tool call', rewrite('@ai-sdk/openai', 'responses stream'), async () => {
      const google = createOpenAI({ apiKey: token(), baseURL: rewriteBase('openai', 'https://generativelanguage.googleapis.com/v1beta') });
      const streamed = streamText({ model: google('gemini-2.0-flash'), prompt: 'a b c d', maxOutputTokens: 2, maxRetries: 0 });
      expect(await streamed.text).toBe('tok tok');
      expect(await streamed.usage).toMatchObject({ inputTokens: 4, outputTokens: 2 });
      expect(await streamed.finishReason).toBe('stop');
      expect(lastUpstream().url).toBe('/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse');
      const [record] = await recordsOnceThere(1);
      // base 4 × 1 + 2 × 4 = 12 per 1M; fee 6 × 100 per 1M
      await expectBilled(record!.request_id, { provider: 'google', model: 'google/gemini-2.0-flash', input: 4, output: 2, total: '0.0006120000' });

      h.upstream.setNext({ toolCall: WEATHER_TOOL });
      const withTool = streamText({
        model: google('gemini-2.0-flash'),
        prompt: 'weather?',
        maxRetries: 0,
        tools: { get_weather: tool({ description: 'Weather', inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } } }) }) },
      });
      expect(await withTool.toolCalls).toMatchObject([{ toolName: 'get_weather', input: WEATHER_TOOL.arguments }]);
      expect(await withTool.finishReason).toBe('tool-calls');
    });
  });
});
