import { createAnthropic } from '@ai-sdk/anthropic';
import Anthropic from '@anthropic-ai/sdk';
import { GoogleGenAI } from '@google/genai';
import { generateText, streamText } from 'ai';
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { findWallet } from '../../src/ledger/wallets.ts';
import { covers, type Call, type Client } from '../helpers/client-matrix.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { useRewriteHarness, WEATHER_TOOL } from '../helpers/rewrite-harness.ts';

/**
 * The rewrite proxy driven by official clients over real HTTP: each client speaks its own format
 * to a (mock) provider that speaks another. Each test checks what the client saw (content, tool
 * calls, stop reason, usage), what the provider was sent, and the exact bill: one record per call,
 * from the provider's own usage (the mock's is deterministic: input = words of the prompt, output
 * = the request's cap), at the harness's prices plus a fee of 100 per 1M tokens.
 *
 * Clients take `/v1/rewrite/<their format>/<provider base>` as their base URL and append their own
 * path (`/v1/messages`, `/chat/completions`, `/v1/models/…`), which the gateway takes off.
 */

/** What a test proves for docs/clients.md: calls of a client on the rewrite path. */
const rewrite = (client: Client, ...calls: Call[]) => covers(...calls.map((call) => ({ client, call, path: 'rewrite' as const })));

describe.each(databasesUnderTest())('the rewrite proxy with official clients on %s', (dialect) => {
  const h = useRewriteHarness(dialect);
  const { token, rewriteBase, lastUpstream, customerRecords, recordsOnceThere, expectBilled } = h;
  const anthropicOn = (providerBase: string) =>
    new Anthropic({ apiKey: token(), baseURL: rewriteBase('anthropic', providerBase), maxRetries: 0 });
  const openaiOn = (providerBase: string) => new OpenAI({ apiKey: token(), baseURL: rewriteBase('openai', providerBase), maxRetries: 0 });

  describe('@anthropic-ai/sdk to an OpenAI-shaped provider', () => {
    it('messages.create: text and stop reason come back in Anthropic shape; the provider got an OpenAI request', rewrite('@anthropic-ai/sdk', 'text'), async () => {
      const { data, response } = await anthropicOn('https://api.openai.com/v1')
        .messages.create({ model: 'gpt-4o', max_tokens: 6, system: 'be brief', messages: [{ role: 'user', content: 'one two three four' }] })
        .withResponse();

      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/chat/completions');
      expect(seen.headers.authorization).toBe('Bearer sk-managed-openai');
      expect(seen.headers['anthropic-version']).toBeUndefined();
      expect(seen.json).toEqual({
        model: 'gpt-4o',
        messages: [
          { role: 'system', content: 'be brief' },
          { role: 'user', content: 'one two three four' },
        ],
        max_completion_tokens: 6,
      });
      expect(data).toMatchObject({
        type: 'message',
        role: 'assistant',
        model: 'gpt-4o',
        content: [{ type: 'text', text: 'tok tok tok tok tok tok' }],
        stop_reason: 'end_turn',
        usage: { input_tokens: 6, output_tokens: 6 },
      });
      // base 6/1M + 12/1M = 0.000018; fee 12 × 100/1M = 0.0012
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'openai', model: 'openai/gpt-4o', input: 6, output: 6, total: '0.0012180000' });
    });

    it('messages.stream: text deltas, stop reason and the final usage arrive as Anthropic events', rewrite('@anthropic-ai/sdk', 'text stream'), async () => {
      const stream = anthropicOn('https://api.openai.com/v1').messages.stream({ model: 'gpt-4o', max_tokens: 3, messages: [{ role: 'user', content: 'a b c d e' }] });
      const texts: string[] = [];
      stream.on('text', (text) => texts.push(text));
      const message = await stream.finalMessage();
      const { response } = await stream.withResponse();

      expect(lastUpstream().json).toMatchObject({ stream: true, stream_options: { include_usage: true } });
      expect(texts).toEqual(['tok', ' tok', ' tok']);
      expect(message).toMatchObject({ model: 'gpt-4o', stop_reason: 'end_turn', usage: { input_tokens: 5, output_tokens: 3 } });
      expect(message.content).toEqual([{ type: 'text', text: 'tok tok tok', citations: undefined }].map(({ citations: _, ...block }) => block));
      // base 5/1M + 6/1M = 0.000011; fee 8 × 100/1M = 0.0008
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'openai', model: 'openai/gpt-4o', input: 5, output: 3, total: '0.0008110000' });
    });

    it('a tool call comes back as a tool_use block, JSON and streamed', rewrite('@anthropic-ai/sdk', 'tool call', 'tool call stream'), async () => {
      const tools = [{ name: 'get_weather', description: 'Weather', input_schema: { type: 'object' as const, properties: { city: { type: 'string' } } } }];
      const request = { model: 'gpt-4o', max_tokens: 4, tools, messages: [{ role: 'user' as const, content: 'weather in Paris' }] };
      h.upstream.setNext({ toolCall: WEATHER_TOOL, times: 2 });

      const client = anthropicOn('https://api.openai.com/v1');
      const message = await client.messages.create(request);
      expect(lastUpstream().json).toMatchObject({ tools: [{ type: 'function', function: { name: 'get_weather', parameters: tools[0]!.input_schema } }] });
      expect(message.stop_reason).toBe('tool_use');
      expect(message.content).toEqual([{ type: 'tool_use', id: expect.stringMatching(/^call_mock\d+$/), name: 'get_weather', input: WEATHER_TOOL.arguments }]);

      const streamed = await client.messages.stream(request).finalMessage();
      expect(streamed.stop_reason).toBe('tool_use');
      expect(streamed.content).toEqual([{ type: 'tool_use', id: expect.stringMatching(/^call_mock\d+$/), name: 'get_weather', input: WEATHER_TOOL.arguments }]);
    });

    it('a tool result goes back to the provider as a tool message', async () => {
      await anthropicOn('https://api.openai.com/v1').messages.create({
        model: 'gpt-4o',
        max_tokens: 2,
        messages: [
          { role: 'user', content: 'weather in Paris' },
          { role: 'assistant', content: [{ type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: 'sunny' }] },
        ],
      });
      expect((lastUpstream().json as { messages: unknown[] }).messages).toEqual([
        { role: 'user', content: 'weather in Paris' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
      ]);
    });

    it('a field OpenAI cannot take is refused by name before any provider call, and nothing is billed', async () => {
      const error = await anthropicOn('https://api.openai.com/v1')
        .messages.create({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }], ...{ top_k: 5 } })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Anthropic.BadRequestError);
      const body = (error as { error: { error: { code: string; message: string; issues: unknown[] } } }).error.error;
      expect(body.code).toBe('untranslatable_request');
      expect(body.message).toContain('top_k');
      expect(body.issues).toEqual([{ path: ['top_k'], message: 'OpenAI has no top_k' }]);
      expect(h.upstream.requests).toHaveLength(0);
      expect(await customerRecords()).toEqual([]);
    });

    it("the provider's error arrives in Anthropic's shape and the call is recorded as an error, unbilled", async () => {
      h.upstream.setNext({ status: 429 });
      const error = await anthropicOn('https://api.openai.com/v1')
        .messages.create({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Anthropic.RateLimitError);
      expect((error as { error: unknown }).error).toEqual({ type: 'error', error: { type: 'rate_limit_error', message: 'Mock upstream error 429.' } });
      const [record] = await recordsOnceThere(1);
      expect(await h.t.settledRecord(record!.request_id)).toMatchObject({ status: 'error', total_request_cost: '0.0000000000' });
      expect((await findWallet(h.t.storage, h.customer.walletId))!.balance).toBe(parseMoney('10'));
    });
    it('a stream the provider cuts is cut for the client too, and billed once as estimated', rewrite('@anthropic-ai/sdk', 'cut stream billed from what arrived'), async () => {
      // The role chunk, "tok", " tok" — then the cut.
      h.upstream.setNext({ cutAfterChunks: 3 });
      const stream = anthropicOn('https://api.openai.com/v1').messages.stream({ model: 'gpt-4o', max_tokens: 3, messages: [{ role: 'user', content: 'one two three four' }] });
      const texts: string[] = [];
      stream.on('text', (text) => texts.push(text));
      expect(await stream.finalMessage().catch((e: unknown) => e)).toBeInstanceOf(Anthropic.AnthropicError);
      expect(texts).toEqual(['tok', ' tok']);
      const [record] = await recordsOnceThere(1);
      // The provider's stream is metered: input estimated from "one two three four" (18 characters) as
      // 5, output from "tok tok" (7) as 2: 5 × 1 + 2 × 2 = 9 per 1M; fee 7 × 100 per 1M = 0.0007.
      await expectBilled(record!.request_id, { provider: 'openai', model: 'openai/gpt-4o', input: 5, output: 2, total: '0.0007090000', estimated: true });
    });

    it("Tollgate's own refusal (an empty wallet) reaches the client as its typed error with Tollgate's message", rewrite('@anthropic-ai/sdk', "refusal in the client's dialect"), async () => {
      const broke = (await h.lava.customers.create({ name: 'Broke' })) as unknown as { customer_id: string };
      const brokeToken = h.lava.generateForwardToken({ customer_id: broke.customer_id, meter_slug: h.meter.meter_slug });
      const client = new Anthropic({ apiKey: brokeToken, baseURL: rewriteBase('anthropic', 'https://api.openai.com/v1'), maxRetries: 0 });
      const error = await client.messages.create({ model: 'gpt-4o', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Anthropic.PaymentRequiredError);
      expect(error).toMatchObject({ type: 'billing_error', apiMessage: 'The wallet balance cannot cover this request.' });
      expect(h.upstream.requests).toHaveLength(0);
    });
  });

  describe('@ai-sdk/anthropic (base URL ending in /v1, it appends /messages) to an OpenAI-shaped provider', () => {
    const claudeClientOn = (providerBase: string) => createAnthropic({ apiKey: token(), baseURL: rewriteBase('anthropic', providerBase) });

    it('generateText and streamText reach /v1/chat/completions and are billed from its usage', rewrite('@ai-sdk/anthropic', 'text', 'text stream'), async () => {
      const model = claudeClientOn('https://api.openai.com/v1')('gpt-4o');
      const result = await generateText({ model, prompt: 'one two three', maxOutputTokens: 4, maxRetries: 0 });
      expect(lastUpstream().path).toBe('/v1/chat/completions');
      expect(lastUpstream().json).toMatchObject({ model: 'gpt-4o', max_completion_tokens: 4 });
      expect(result.text).toBe('tok tok tok tok');
      expect(result.usage).toMatchObject({ inputTokens: 3, outputTokens: 4 });
      const [record] = await recordsOnceThere(1);
      // base 3/1M + 8/1M = 0.000011; fee 7 × 100/1M = 0.0007
      await expectBilled(record!.request_id, { provider: 'openai', model: 'openai/gpt-4o', input: 3, output: 4, total: '0.0007110000' });

      const streamed = streamText({ model, prompt: 'one two', maxOutputTokens: 2, maxRetries: 0 });
      expect(await streamed.text).toBe('tok tok');
      expect(await streamed.usage).toMatchObject({ inputTokens: 2, outputTokens: 2 });
      expect(lastUpstream().path).toBe('/v1/chat/completions');
    });

    it.each(['https://api.openai.com', 'https://api.openai.com/', 'https://api.openai.com/v1/'])('the provider base %s works too', async (providerBase) => {
      const result = await generateText({ model: claudeClientOn(providerBase)('gpt-4o'), prompt: 'hi', maxOutputTokens: 1, maxRetries: 0 });
      expect(lastUpstream().path).toBe('/v1/chat/completions');
      expect(result.text).toBe('tok');
    });
  });

  describe('@anthropic-ai/sdk to a Gemini provider', () => {
    const gemini = () => anthropicOn('https://generativelanguage.googleapis.com/v1beta');

    it('messages.create: the model goes in the URL, the text comes back', async () => {
      const { data, response } = await gemini()
        .messages.create({ model: 'gemini-2.0-flash', max_tokens: 4, system: 'short', messages: [{ role: 'user', content: 'one two three' }] })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1beta/models/gemini-2.0-flash:generateContent');
      expect(seen.headers['x-goog-api-key']).toBe('goog-managed');
      expect(seen.json).toEqual({
        systemInstruction: { parts: [{ text: 'short' }] },
        contents: [{ role: 'user', parts: [{ text: 'one two three' }] }],
        generationConfig: { maxOutputTokens: 4 },
      });
      expect(data).toMatchObject({ model: 'gemini-2.0-flash', content: [{ type: 'text', text: 'tok tok tok tok' }], stop_reason: 'end_turn', usage: { input_tokens: 4, output_tokens: 4 } });
      // base 4/1M + 16/1M = 0.00002; fee 8 × 100/1M = 0.0008
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'google', model: 'google/gemini-2.0-flash', input: 4, output: 4, total: '0.0008200000' });
    });

    it('messages.stream goes to streamGenerateContent?alt=sse and is billed from its usage', async () => {
      const stream = gemini().messages.stream({ model: 'gemini-2.0-flash', max_tokens: 2, messages: [{ role: 'user', content: 'x y' }] });
      const message = await stream.finalMessage();
      const { response } = await stream.withResponse();
      expect(lastUpstream().url).toBe('/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse');
      expect(message).toMatchObject({ content: [{ type: 'text', text: 'tok tok' }], stop_reason: 'end_turn', usage: { input_tokens: 2, output_tokens: 2 } });
      // base 2/1M + 8/1M = 0.00001; fee 4 × 100/1M = 0.0004
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'google', model: 'google/gemini-2.0-flash', input: 2, output: 2, total: '0.0004100000' });
    });

    it('a function call comes back as tool_use, JSON and streamed', async () => {
      h.upstream.setNext({ toolCall: WEATHER_TOOL, times: 2 });
      const request = {
        model: 'gemini-2.0-flash',
        max_tokens: 3,
        tools: [{ name: 'get_weather', input_schema: { type: 'object' as const, properties: {} } }],
        messages: [{ role: 'user' as const, content: 'weather?' }],
      };
      const message = await gemini().messages.create(request);
      expect(message.stop_reason).toBe('tool_use');
      expect(message.content).toMatchObject([{ type: 'tool_use', name: 'get_weather', input: WEATHER_TOOL.arguments }]);
      const streamed = await gemini().messages.stream(request).finalMessage();
      expect(streamed.stop_reason).toBe('tool_use');
      expect(streamed.content).toMatchObject([{ type: 'tool_use', name: 'get_weather', input: WEATHER_TOOL.arguments }]);
    });
  });

  describe('openai client to an Anthropic provider', () => {
    const claude = () => openaiOn('https://api.anthropic.com/v1');

    it('chat.completions.create: an Anthropic request goes out, an OpenAI completion comes back', rewrite('openai', 'text'), async () => {
      const { data, response } = await claude()
        .chat.completions.create({
          model: 'claude-haiku-4-5',
          max_tokens: 5,
          messages: [
            { role: 'system', content: 'terse' },
            { role: 'user', content: 'one two three' },
          ],
        })
        .withResponse();
      const seen = lastUpstream();
      expect(seen.path).toBe('/v1/messages');
      expect(seen.headers['x-api-key']).toBe('sk-ant-managed');
      expect(seen.headers['anthropic-version']).toBe('2023-06-01');
      expect(seen.json).toEqual({ model: 'claude-haiku-4-5', max_tokens: 5, system: 'terse', messages: [{ role: 'user', content: 'one two three' }] });
      expect(data).toMatchObject({
        object: 'chat.completion',
        model: 'claude-haiku-4-5',
        choices: [{ index: 0, message: { role: 'assistant', content: 'tok tok tok tok tok' }, finish_reason: 'length' }],
        usage: { prompt_tokens: 4, completion_tokens: 5, total_tokens: 9 },
      });
      // base 4/1M + 25/1M = 0.000029; fee 9 × 100/1M = 0.0009
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'anthropic', model: 'anthropic/claude-haiku-4-5', input: 4, output: 5, total: '0.0009290000' });
    });

    it('a stream with include_usage ends with the usage chunk; one without has none', rewrite('openai', 'text stream', 'stream with usage'), async () => {
      const request = { model: 'claude-haiku-4-5', max_tokens: 2, stream: true as const, messages: [{ role: 'user' as const, content: 'a b c' }] };
      const { data: stream, response } = await claude()
        .chat.completions.create({ ...request, stream_options: { include_usage: true } })
        .withResponse();
      const chunks: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
      for await (const chunk of stream) chunks.push(chunk);
      expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('tok tok');
      expect(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0]?.finish_reason).toBe('length');
      expect(chunks.at(-1)).toMatchObject({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });
      // base 3/1M + 10/1M = 0.000013; fee 5 × 100/1M = 0.0005
      await expectBilled(response.headers.get('x-tollgate-request-id'), { provider: 'anthropic', model: 'anthropic/claude-haiku-4-5', input: 3, output: 2, total: '0.0005130000' });

      const plain: OpenAI.Chat.Completions.ChatCompletionChunk[] = [];
      for await (const chunk of await claude().chat.completions.create(request)) plain.push(chunk);
      expect(plain.some((c) => c.usage)).toBe(false);
    });

    it('tool calls come back in OpenAI shape, JSON and streamed', rewrite('openai', 'tool call', 'tool call stream'), async () => {
      h.upstream.setNext({ toolCall: WEATHER_TOOL, times: 2 });
      const request = {
        model: 'claude-haiku-4-5',
        max_tokens: 3,
        tools: [{ type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: {} } } }],
        messages: [{ role: 'user' as const, content: 'weather?' }],
      };
      const completion = await claude().chat.completions.create(request);
      expect(lastUpstream().json).toMatchObject({ tools: [{ name: 'get_weather', input_schema: { type: 'object', properties: {} } }] });
      expect(completion.choices[0]).toMatchObject({
        finish_reason: 'tool_calls',
        message: { content: null, tool_calls: [{ id: expect.stringMatching(/^toolu_mock\d+$/), type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(WEATHER_TOOL.arguments) } }] },
      });

      const stream = claude().chat.completions.stream({ ...request, stream: true });
      const final = await stream.finalChatCompletion();
      expect(final.choices[0]).toMatchObject({
        finish_reason: 'tool_calls',
        message: { tool_calls: [{ id: expect.stringMatching(/^toolu_mock\d+$/), type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(WEATHER_TOOL.arguments) } }] },
      });
    });

    it('an image by URL reaches Anthropic as a url image block', async () => {
      await claude().chat.completions.create({
        model: 'claude-haiku-4-5',
        max_tokens: 1,
        messages: [{ role: 'user', content: [{ type: 'text', text: 'what is this' }, { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } }] }],
      });
      expect((lastUpstream().json as { messages: unknown[] }).messages).toEqual([
        { role: 'user', content: [{ type: 'text', text: 'what is this' }, { type: 'image', source: { type: 'url', url: 'https://example.com/cat.png' } }] },
      ]);
    });
  });

  describe('@google/genai to an OpenAI-shaped provider', () => {
    it('generateContent and generateContentStream with the default API version: OpenAI gets /v1/chat/completions, the answer is in Gemini shape', rewrite('@google/genai', 'text', 'text stream'), async () => {
      const ai = new GoogleGenAI({ apiKey: token(), httpOptions: { baseUrl: rewriteBase('google', 'https://api.openai.com/v1') } });
      const result = await ai.models.generateContent({ model: 'gpt-4o', contents: 'one two', config: { maxOutputTokens: 2 } });
      expect(lastUpstream().path).toBe('/v1/chat/completions');
      expect(lastUpstream().json).toEqual({ model: 'gpt-4o', messages: [{ role: 'user', content: 'one two' }], max_completion_tokens: 2 });
      expect(result.text).toBe('tok tok');
      expect(result.candidates?.[0]?.finishReason).toBe('STOP');
      expect(result.usageMetadata).toMatchObject({ promptTokenCount: 2, candidatesTokenCount: 2 });
      const [record] = await recordsOnceThere(1);
      await expectBilled(record!.request_id, { provider: 'openai', model: 'openai/gpt-4o', input: 2, output: 2, total: '0.0004060000' });

      const texts: string[] = [];
      for await (const chunk of await ai.models.generateContentStream({ model: 'gpt-4o', contents: 'one two', config: { maxOutputTokens: 2 } })) {
        texts.push(chunk.text ?? '');
      }
      expect(lastUpstream().path).toBe('/v1/chat/completions');
      expect(lastUpstream().json).toMatchObject({ stream: true });
      expect(texts.join('')).toBe('tok tok');
    });

    it.each([
      ['v1beta', 'https://api.openai.com/v1'],
      ['v1', 'https://api.openai.com'],
      ['v1beta', 'https://api.openai.com/'],
      ['v1', 'https://api.openai.com/v1/'],
    ])('apiVersion %s on the provider base %s reaches /v1/chat/completions', async (apiVersion, providerBase) => {
      const ai = new GoogleGenAI({ apiKey: token(), httpOptions: { baseUrl: rewriteBase('google', providerBase), apiVersion } });
      const result = await ai.models.generateContent({ model: 'gpt-4o', contents: 'one two', config: { maxOutputTokens: 2 } });
      expect(lastUpstream().path).toBe('/v1/chat/completions');
      expect(result.text).toBe('tok tok');
    });
  });

  describe("the published client's gateway(url, {format})", () => {
    const pairs = [
      { format: 'anthropic', url: 'https://api.openai.com/v1/chat/completions', body: { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }, text: ['content', 0, 'text'] },
      { format: 'anthropic', url: 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generateContent', body: { model: 'gemini-2.0-flash', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }, text: ['content', 0, 'text'] },
      { format: 'openai', url: 'https://api.anthropic.com/v1/messages', body: { model: 'claude-haiku-4-5', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }, text: ['choices', 0, 'message', 'content'] },
      { format: 'openai', url: 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.0-flash:generateContent', body: { model: 'gemini-2.0-flash', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }] }, text: ['choices', 0, 'message', 'content'] },
      { format: 'google', url: 'https://api.openai.com/v1/models/gpt-4o:generateContent', body: { contents: [{ role: 'user', parts: [{ text: 'hi' }] }], generationConfig: { maxOutputTokens: 1 } }, text: ['candidates', 0, 'content', 'parts', 0, 'text'] },
      { format: 'google', url: 'https://api.anthropic.com/v1/models/claude-haiku-4-5:generateContent', body: { contents: [{ role: 'user', parts: [{ text: 'hi' }] }], generationConfig: { maxOutputTokens: 1 } }, text: ['candidates', 0, 'content', 'parts', 0, 'text'] },
    ] as const;

    it.each(pairs)('$format client to $url', async ({ format, url, body, text }) => {
      const result = await h.lava.gateway(url, { format, body, customer_id: h.customer.customer_id, meter_slug: h.meter.meter_slug });
      expect(text.reduce<unknown>((value, key) => (value as Record<string | number, unknown>)[key], result)).toBe('tok');
      expect(await recordsOnceThere(1)).toHaveLength(1);
    });

    it('the endpoint is in the OpenAPI document', async () => {
      const document = (await (await fetch(`${h.base}/v1/openapi.json`)).json()) as { paths: Record<string, { post?: { parameters?: { name: string }[] } }> };
      expect(document.paths['/v1/rewrite/{format}/{providerUrl}']?.post?.parameters?.map((p) => p.name)).toEqual(['format', 'providerUrl', 'metadata']);
    });

    it('bedrock is refused with unsupported_format', async () => {
      const error = await h.lava.gateway('https://bedrock-runtime.us-east-1.amazonaws.com/model/x/converse', { format: 'bedrock', body: {} }).catch((e: unknown) => e);
      expect(String(error)).toContain('bedrock');
      const res = await fetch(`${h.base}/v1/rewrite/bedrock/https://api.openai.com/v1/chat/completions`, { method: 'POST', headers: { authorization: `Bearer ${h.t.merchant.secretKey}` }, body: '{}' });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('unsupported_format');
    });
  });
});
