import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/http/errors.ts';
import {
  REWRITE_FORMATS,
  Untranslatable,
  type ChatRequest,
  type ChatResponse,
  type JsonObject,
  type Message,
  type Part,
  type ResponsePart,
  type RewriteFormat,
  type StreamEvent,
} from '../../src/gateway/rewrite/canonical.ts';
import { CODECS, createStreamTranslator, translateRequest, translateResponseBody } from '../../src/gateway/rewrite/translate.ts';

/**
 * Round trips through every pair of formats: a request written in the client's format, translated
 * to the provider's and back, is the same request; a provider's answer translated to the client's
 * format and back is the same answer; and a provider's stream, cut into arbitrary chunks and
 * translated, tells the client the same text, tool calls, stop reason and usage.
 *
 * The generators produce what both formats of a pair can express (decision 0022 lists the rest,
 * which is refused by name, as the last tests show).
 */

const PAIRS = REWRITE_FORMATS.flatMap((client) => REWRITE_FORMATS.filter((p) => p !== client).map((provider) => [client, provider] as const));
const CTX = { created: 1_700_000_000 };

type Features = { topK: boolean; user: boolean; imageUrl: boolean; toolError: boolean };
const featuresOf = (a: RewriteFormat, b: RewriteFormat): Features => ({
  topK: a !== 'openai' && b !== 'openai',
  user: a !== 'google' && b !== 'google',
  imageUrl: a !== 'google' && b !== 'google',
  toolError: a !== 'openai' && b !== 'openai',
});

const word = fc.stringMatching(/^[a-z]{1,8}( [a-z]{1,8}){0,3}$/);
const name = fc.stringMatching(/^[a-z][a-z_]{0,11}$/);
const args: fc.Arbitrary<JsonObject> = fc.dictionary(name, fc.oneof(fc.integer(), word, fc.boolean()), { maxKeys: 3 });
const ratio = fc.integer({ min: 0, max: 100 }).map((n) => n / 100);

function messagesArb(f: Features): fc.Arbitrary<Message[]> {
  const image = f.imageUrl
    ? fc.oneof(fc.constant({ kind: 'url' as const, url: 'https://example.com/a.png' }), fc.constant({ kind: 'base64' as const, mediaType: 'image/png', data: 'aGVsbG8=' }))
    : fc.constant({ kind: 'base64' as const, mediaType: 'image/png', data: 'aGVsbG8=' });
  const userPart: fc.Arbitrary<Part> = fc.oneof(word.map((text) => ({ type: 'text' as const, text })), image.map((source) => ({ type: 'image' as const, source })));
  const turn = fc.record({
    user: fc.array(userPart, { minLength: 1, maxLength: 3 }),
    text: fc.option(word, { nil: undefined }),
    calls: fc.array(fc.record({ name, arguments: args }), { maxLength: 2 }),
    results: fc.array(fc.record({ content: word, isError: f.toolError ? fc.boolean() : fc.constant(false) }), { minLength: 2, maxLength: 2 }),
  });
  return fc.array(turn, { minLength: 1, maxLength: 3 }).map((turns) => {
    const messages: Message[] = [];
    turns.forEach((t, i) => {
      // A turn's user message answers the previous turn's tool calls, when it made any.
      const previous = messages.at(-1);
      const calls = previous?.parts.flatMap((p) => (p.type === 'tool_call' ? [p.call] : [])) ?? [];
      if (calls.length > 0) {
        messages.push({ role: 'user', parts: calls.map((c, j) => ({ type: 'tool_result', callId: c.id, content: t.results[j]!.content, isError: t.results[j]!.isError })) });
      } else {
        messages.push({ role: 'user', parts: t.user });
      }
      const assistant: Part[] = t.text === undefined ? [] : [{ type: 'text', text: t.text }];
      t.calls.forEach((c, j) => assistant.push({ type: 'tool_call', call: { id: `call_${i}_${j}`, name: c.name, arguments: c.arguments } }));
      if (assistant.length > 0) messages.push({ role: 'assistant', parts: assistant });
    });
    return messages;
  });
}

function requestArb(f: Features): fc.Arbitrary<ChatRequest> {
  const tool = fc.record({ name, description: fc.option(word, { nil: undefined }), parameters: fc.constant({ type: 'object', properties: { q: { type: 'string' } } }) });
  return fc
    .record({
      model: name,
      system: fc.option(word, { nil: undefined }),
      messages: messagesArb(f),
      maxTokens: fc.integer({ min: 1, max: 8192 }),
      temperature: fc.option(ratio, { nil: undefined }),
      topP: fc.option(ratio, { nil: undefined }),
      topK: f.topK ? fc.option(fc.integer({ min: 1, max: 100 }), { nil: undefined }) : fc.constant(undefined),
      stop: fc.option(fc.array(word, { minLength: 1, maxLength: 2 }), { nil: undefined }),
      stream: fc.boolean(),
      tools: fc.option(fc.array(tool, { minLength: 1, maxLength: 2 }), { nil: undefined }),
      toolChoice: fc.option(fc.oneof(fc.constant({ type: 'auto' as const }), fc.constant({ type: 'none' as const }), fc.constant({ type: 'required' as const }), name.map((n) => ({ type: 'tool' as const, name: n }))), { nil: undefined }),
      user: f.user ? fc.option(word, { nil: undefined }) : fc.constant(undefined),
    })
    .map((r) => JSON.parse(JSON.stringify(r)) as ChatRequest);
}

/** A request in one format, with the URL facts a Gemini body leaves out. */
function written(format: RewriteFormat, request: ChatRequest): JsonObject {
  const problems = new Untranslatable();
  const body = CODECS[format].writeRequest(request, problems);
  expect(problems.issues).toEqual([]);
  return body;
}

const callOf = (request: ChatRequest) => ({ model: request.model, stream: request.stream });

describe('request translation round trips', () => {
  it.each(PAIRS)('%s client → %s provider → back keeps every supported field', (client, provider) => {
    fc.assert(
      fc.property(requestArb(featuresOf(client, provider)), (request) => {
        const original = written(client, request);
        const there = translateRequest(client, provider, original, callOf(request));
        const back = translateRequest(provider, client, there.body, callOf(there.request));
        expect(back.body).toEqual(original);
        expect(back.request.model).toBe(request.model);
        expect(back.request.stream).toBe(request.stream);
      }),
      { numRuns: 150 },
    );
  });
});

function responseArb(): fc.Arbitrary<ChatResponse> {
  return fc
    .record({
      id: name,
      model: name,
      text: fc.option(word, { nil: undefined }),
      calls: fc.array(fc.record({ name, arguments: args }), { maxLength: 2 }),
      plainStop: fc.constantFrom('end' as const, 'max_tokens' as const, 'content_filter' as const),
      input: fc.integer({ min: 1, max: 100_000 }),
      cached: fc.option(fc.integer({ min: 1, max: 1_000 }), { nil: undefined }),
      output: fc.integer({ min: 0, max: 100_000 }),
    })
    .map((r) => {
      const parts: ResponsePart[] = r.text === undefined ? [] : [{ type: 'text', text: r.text }];
      r.calls.forEach((c, i) => parts.push({ type: 'tool_call', call: { id: `call_${r.id}_${i}`, name: c.name, arguments: c.arguments } }));
      const usage = { inputTokens: r.input + (r.cached ?? 0), outputTokens: r.output, ...(r.cached === undefined ? {} : { cachedInputTokens: r.cached }) };
      return { id: r.id, model: r.model, parts, stopReason: r.calls.length > 0 ? 'tool_calls' : r.plainStop, usage };
    });
}

describe('response translation round trips', () => {
  it.each(PAIRS)('%s client ← %s provider: a reply translated and back is the same reply', (client, provider) => {
    fc.assert(
      fc.property(responseArb(), (response) => {
        const original = CODECS[provider].writeResponse(response, CTX);
        const forClient = translateResponseBody(provider, client, 200, original, CTX);
        expect(translateResponseBody(client, provider, 200, forClient, CTX)).toEqual(original);
        expect(CODECS[client].readResponse(forClient)).toEqual(response);
      }),
      { numRuns: 150 },
    );
  });

  it.each(PAIRS)('%s client ← %s provider: an error keeps its message and kind', (client, provider) => {
    fc.assert(
      fc.property(fc.constantFrom(400, 401, 403, 404, 429, 500, 503), word, (status, message) => {
        const original = CODECS[provider].writeError({ kind: 'server', message }, status);
        const forClient = translateResponseBody(provider, client, status, original, CTX);
        expect(CODECS[client].readError(status, forClient)).toEqual(CODECS[provider].readError(status, original));
      }),
    );
  });
});

/** Everything a client can learn from a stream, folded into one answer. */
function fold(events: StreamEvent[]) {
  const calls: { id: string; name: string; args: string }[] = [];
  let text = '';
  let finish: StreamEvent | undefined;
  let usage: StreamEvent | undefined;
  let start: StreamEvent | undefined;
  for (const event of events) {
    if (event.type === 'start') start ??= event;
    if (event.type === 'text') text += event.text;
    if (event.type === 'finish') finish = event;
    if (event.type === 'usage') usage = event;
    if (event.type === 'tool_call') {
      const call = (calls[event.index] ??= { id: '', name: '', args: '' });
      call.id = event.id ?? call.id;
      call.name = event.name ?? call.name;
      call.args += event.argumentsDelta;
    }
  }
  return { start, text, finish, usage, done: events.at(-1)?.type === 'done', calls: calls.map((c) => ({ ...c, args: JSON.parse(c.args || '{}') as unknown })) };
}

/** The canonical events of a whole response, text cut into word pieces and arguments into halves. */
function eventsOf(response: ChatResponse): StreamEvent[] {
  const events: StreamEvent[] = [{ type: 'start', id: response.id, model: response.model }];
  let calls = 0;
  for (const part of response.parts) {
    if (part.type === 'text') for (const piece of part.text.split(/(?= )/)) events.push({ type: 'text', text: piece });
    if (part.type === 'tool_call') {
      const json = JSON.stringify(part.call.arguments);
      const index = calls++;
      events.push({ type: 'tool_call', index, id: part.call.id, name: part.call.name, argumentsDelta: json.slice(0, json.length >> 1) });
      events.push({ type: 'tool_call', index, argumentsDelta: json.slice(json.length >> 1) });
    }
  }
  events.push({ type: 'finish', stopReason: response.stopReason }, { type: 'usage', usage: response.usage }, { type: 'done' });
  return events;
}

function decodeAll(format: RewriteFormat, sse: string): StreamEvent[] {
  const decoder = CODECS[format].streamDecoder();
  const events: StreamEvent[] = [];
  for (const block of sse.split('\n\n')) {
    const data = block.split('\n').find((line) => line.startsWith('data: '));
    if (data) events.push(...decoder.push(data.slice(6)));
  }
  return [...events, ...decoder.end()];
}

describe('stream translation', () => {
  it.each(PAIRS)('%s client ← %s provider: any chunking of the stream tells the same answer', (client, provider) => {
    fc.assert(
      fc.property(responseArb(), fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }), (response, cuts) => {
        const encode = CODECS[provider].streamEncoder({ ...CTX, includeUsage: true });
        const providerSse = eventsOf(response).map(encode).join('');
        const translator = createStreamTranslator(provider, client, { ...CTX, includeUsage: true });
        let clientSse = '';
        let at = 0;
        for (const cut of cuts) {
          clientSse += translator.push(providerSse.slice(at, at + cut));
          at += cut;
        }
        clientSse += translator.push(providerSse.slice(at)) + translator.end();
        expect(fold(decodeAll(client, clientSse))).toEqual(fold(decodeAll(provider, providerSse)));
        expect(fold(decodeAll(client, clientSse))).toMatchObject({ text: response.parts.map((p) => (p.type === 'text' ? p.text : '')).join(''), done: true });
      }),
      { numRuns: 100 },
    );
  });
});

describe('stream decoding', () => {
  /** Event data no provider sends as an event: not JSON, or JSON that is not an object. */
  const notAnEvent = fc.constantFrom('not json', '{"unterminated": ', '[1, 2]', '42', 'null', '"text"', '');

  it.each(REWRITE_FORMATS)('%s: data that is not a JSON object is skipped, and the events around it decode as without it', (format) => {
    fc.assert(
      fc.property(responseArb(), fc.array(fc.tuple(fc.nat(), notAnEvent), { minLength: 1, maxLength: 5 }), (response, strays) => {
        const sse = eventsOf(response).map(CODECS[format].streamEncoder({ ...CTX, includeUsage: true })).join('');
        const blocks = sse.split('\n\n');
        for (const [at, data] of strays) blocks.splice(at % blocks.length, 0, `data: ${data}`);
        expect(decodeAll(format, blocks.join('\n\n'))).toEqual(decodeAll(format, sse));
      }),
      { numRuns: 50 },
    );
  });
});

describe('what cannot be translated is refused by name', () => {
  const refusal = (client: RewriteFormat, provider: RewriteFormat, body: JsonObject) => {
    try {
      translateRequest(client, provider, body, { model: 'm', stream: false });
    } catch (error) {
      expect(error).toBeInstanceOf(ApiError);
      return { code: (error as ApiError).code, message: (error as ApiError).message, issues: (error as ApiError).issues };
    }
    throw new Error('the request was translated');
  };

  it('unknown members anywhere in the body', () => {
    const refused = refusal('anthropic', 'openai', {
      model: 'm',
      max_tokens: 1,
      thinking: { type: 'enabled' },
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hi', cache_control: { type: 'ephemeral' } }] }],
    });
    expect(refused.code).toBe('untranslatable_request');
    expect(refused.message).toBe('These fields cannot be translated from anthropic to openai: thinking, messages.0.content.0.cache_control.');
    expect(refused.issues).toEqual([
      { path: ['thinking'], message: 'is not supported by the rewrite proxy' },
      { path: ['messages', '0', 'content', '0', 'cache_control'], message: 'is not supported by the rewrite proxy' },
    ]);
  });

  it("a field the provider's format cannot express", () => {
    expect(refusal('anthropic', 'openai', { model: 'm', max_tokens: 1, top_k: 3, messages: [] }).issues).toEqual([{ path: ['top_k'], message: 'OpenAI has no top_k' }]);
    expect(refusal('openai', 'google', { model: 'm', user: 'u', messages: [] }).issues).toEqual([{ path: ['user'], message: 'Gemini has no end-user identifier' }]);
    expect(refusal('openai', 'google', { model: 'm', messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://x/y.png' } }] }] }).issues).toEqual([
      { path: ['messages', '0'], message: 'Gemini takes images inline (base64), not by URL' },
    ]);
    expect(refusal('openai', 'anthropic', { model: 'm', n: 2, messages: [] }).issues).toEqual([{ path: ['n'], message: 'only 1 choice can be translated' }]);
  });

  it('a system message in the middle of a conversation', () => {
    const refused = refusal('openai', 'anthropic', {
      model: 'm',
      messages: [
        { role: 'user', content: 'a' },
        { role: 'system', content: 'b' },
      ],
    });
    expect(refused.issues).toEqual([{ path: ['messages', '1', 'role'], message: 'a system message can only come before the conversation' }]);
  });
});
