import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * A fake provider for gateway tests: one plain node:http server on 127.0.0.1 that answers like
 * OpenAI, Anthropic and Gemini, chosen by the END of the path (so it serves any base path an
 * UPSTREAM_OVERRIDES mapping sends it, e.g. Groq's /openai/v1/chat/completions):
 *
 *   POST …/chat/completions   OpenAI chat, JSON or SSE (`stream: true`)
 *   POST …/responses          OpenAI Responses, JSON or SSE
 *   POST …/embeddings         OpenAI embeddings (base64 float32s when encoding_format is base64)
 *   GET  …/models             the model list, in Anthropic's shape when the request carries
 *                             anthropic-version, Gemini's when it carries x-goog-api-key, else OpenAI's
 *   POST …/audio/speech       binary audio (bytes = input characters)
 *   POST …/messages           Anthropic Messages, JSON or SSE
 *   POST …/messages/count_tokens   Anthropic token count (`input_tokens`: words of the prompt)
 *   POST …/models/{m}:countTokens  Gemini token count ({totalTokens})
 *   POST …/text-to-speech/{voice}[/stream]   ElevenLabs audio (bytes = characters of `text`)
 *   POST …/speech-to-text     ElevenLabs transcript of any upload; its last word ends at TRANSCRIPT_SECONDS
 *   POST …/models/{m}:generateContent, …:streamGenerateContent[?alt=sse]   Gemini
 *   any  …/echo               200 {method, path, query, headers, body} (for verb tests)
 *
 * Usage is deterministic, so tests can assert exact costs:
 * - input tokens  = number of whitespace-separated words in the prompt text (messages, system,
 *   input, contents) — see `countWords`;
 * - output tokens = the request's output cap (`max_tokens`, `max_completion_tokens`,
 *   `max_output_tokens`, `generationConfig.maxOutputTokens`) or DEFAULT_OUTPUT_TOKENS;
 *   the text generated is that many words "tok", one stream chunk per word;
 * - cached input tokens = Behaviour.cachedTokens (default 0; capped at the input count);
 *   Anthropic cache writes = Behaviour.cacheWriteTokens (default 0; capped at what is left).
 *
 * Every request is recorded (method, url, headers, raw body bytes) in `requests`, so tests can
 * check that bodies and unknown fields arrived byte for byte.
 */

export const DEFAULT_OUTPUT_TOKENS = 5;
/** Where the last word of every ElevenLabs transcript ends, in seconds. */
export const TRANSCRIPT_SECONDS = 90.25;

export type RecordedRequest = {
  method: string;
  /** Path and query as received. */
  url: string;
  path: string;
  query: URLSearchParams;
  headers: IncomingHttpHeaders;
  /** The raw body bytes. */
  body: Buffer;
  /** The body parsed as JSON, or undefined when it is empty or not JSON. */
  json: unknown;
};

/** What the next matching request gets instead of (or on top of) the normal answer. */
export type Behaviour = {
  /** Only requests whose path ends with this string (e.g. '/chat/completions'); default any. */
  path?: string;
  /** How many requests this applies to; default 1. Use Infinity for "from now on". */
  times?: number;
  /** Answer with this status and a provider-shaped error body (OpenAI, Anthropic or Gemini by path). */
  status?: number;
  /** With `status`: the exact JSON body to send instead of the provider-shaped error. */
  errorBody?: unknown;
  /** Extra response headers. */
  headers?: Record<string, string>;
  /** Wait this long before sending anything (slow first byte). */
  delayMs?: number;
  /** Wait this long before each body chunk (SSE: one event per chunk; JSON: one chunk). */
  chunkDelayMs?: number;
  /** Write this many body chunks, then destroy the socket (a stream cut mid-way). */
  cutAfterChunks?: number;
  /** Answer 302 with this Location. */
  redirectTo?: string;
  /** Never answer; the socket stays open until the client gives up or the mock closes. */
  hang?: boolean;
  /** Answer only once this settles: the test decides when the provider answers. */
  releasedBy?: Promise<unknown>;
  /** cached_tokens / cache_read_input_tokens / cachedContentTokenCount to report. */
  cachedTokens?: number;
  /** Output tokens to produce instead of the request's cap (a provider overshooting max_tokens). */
  outputTokens?: number;
  /** Report this many times the input and output tokens (a provider over-reporting its usage). */
  overReport?: number;
  /** cache_creation_input_tokens to report (Anthropic only). */
  cacheWriteTokens?: number;
  /** Answer chat/responses/messages/Gemini calls with this one tool call instead of text (JSON and streams). */
  toolCall?: MockToolCall;
  /** Answer under this model name instead of the requested one (a dated version, as providers do). */
  servedModel?: string;
};

export type MockToolCall = { name: string; arguments: Record<string, unknown> };

export type MockUpstream = {
  /** Base URL, e.g. http://127.0.0.1:PORT (no trailing slash). */
  url: string;
  /** Host and port, e.g. 127.0.0.1:PORT. */
  host: string;
  requests: RecordedRequest[];
  /** Queues a behaviour for the next request(s) it matches; first queued, first used. */
  setNext(behaviour: Behaviour): void;
  /** Forgets queued behaviours and recorded requests. */
  reset(): void;
  close(): Promise<void>;
};

type Answer = { status: number; headers: Record<string, string>; chunks: (string | Buffer)[] };
type Family = 'openai' | 'anthropic' | 'gemini';

export async function startMockUpstream(): Promise<MockUpstream> {
  const requests: RecordedRequest[] = [];
  let rules: (Behaviour & { remaining: number })[] = [];
  let sequence = 0;

  const takeBehaviour = (path: string): Behaviour => {
    const rule = rules.find((r) => r.path === undefined || path.endsWith(r.path));
    if (!rule) return {};
    rule.remaining -= 1;
    if (rule.remaining <= 0) rules = rules.filter((r) => r !== rule);
    return rule;
  };

  const server = createServer((req, res) => {
    void handle(req, res).catch(() => res.destroy());
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    res.on('error', () => {});
    const body = await readBody(req);
    const url = new URL(req.url ?? '/', 'http://mock');
    const recorded: RecordedRequest = {
      method: req.method ?? 'GET',
      url: req.url ?? '/',
      path: url.pathname,
      query: url.searchParams,
      headers: req.headers,
      body,
      json: parseJson(body),
    };
    requests.push(recorded);
    const behaviour = takeBehaviour(url.pathname);

    if (behaviour.hang) return;
    if (behaviour.delayMs) await sleep(behaviour.delayMs);
    if (behaviour.releasedBy) await behaviour.releasedBy;
    if (res.destroyed) return;

    const answer = behaviour.redirectTo
      ? { status: 302, headers: { location: behaviour.redirectTo }, chunks: [] }
      : behaviour.status !== undefined
        ? errorAnswer(familyOf(url.pathname), behaviour.status, behaviour.errorBody)
        : route(recorded, behaviour, ++sequence);
    await send(res, answer, behaviour);
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    host: `127.0.0.1:${port}`,
    requests,
    setNext(behaviour) {
      rules.push({ ...behaviour, remaining: behaviour.times ?? 1 });
    },
    reset() {
      rules = [];
      requests.length = 0;
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
}

async function send(res: ServerResponse, answer: Answer, behaviour: Behaviour): Promise<void> {
  const streamed = answer.headers['content-type'] === 'text/event-stream';
  // Marks the provider's own answers, so a test can tell them from Tollgate's after the relay.
  const headers: Record<string, string> = { ...answer.headers, [MOCK_UPSTREAM_HEADER]: '1', ...behaviour.headers };
  if (!streamed) {
    const length = answer.chunks.reduce((sum, chunk) => sum + Buffer.byteLength(chunk), 0);
    headers['content-length'] = String(length);
  }
  res.writeHead(answer.status, headers);
  res.flushHeaders();
  let written = 0;
  for (const chunk of answer.chunks) {
    if (behaviour.cutAfterChunks !== undefined && written >= behaviour.cutAfterChunks) break;
    if (behaviour.chunkDelayMs) await sleep(behaviour.chunkDelayMs);
    if (res.destroyed) return;
    // Waiting for each write to reach the socket keeps chunks apart and lets a cut follow them.
    await new Promise<void>((resolve) => res.write(chunk, () => resolve()));
    written += 1;
  }
  if (behaviour.cutAfterChunks !== undefined) {
    res.socket?.destroy();
    return;
  }
  res.end();
}

// ---- Routing ------------------------------------------------------------------------------------

function familyOf(path: string): Family {
  if (path.includes('/openai/')) return 'openai';
  if (path.endsWith('/messages') || path.endsWith('/messages/count_tokens')) return 'anthropic';
  if (/:(stream)?generateContent$/i.test(path) || path.startsWith('/v1beta/')) return 'gemini';
  return 'openai';
}

function route(req: RecordedRequest, behaviour: Behaviour, seq: number): Answer {
  const { method, path } = req;
  if (path.endsWith('/echo')) return json(200, echo(req));
  if (method === 'GET' && path.endsWith('/models')) return json(200, modelList(req.headers));
  if (method !== 'POST') return errorAnswer(familyOf(path), 404, undefined);
  // A multipart audio upload: never JSON.
  if (path.endsWith('/speech-to-text')) return transcriptAnswer(seq);
  if (req.json === undefined && !path.endsWith('/audio/speech')) {
    return errorAnswer(familyOf(path), 400, undefined, 'The request body is not valid JSON.');
  }
  const body: Body = { ...((req.json ?? {}) as Body), ...(behaviour.servedModel ? { model: behaviour.servedModel } : {}) };
  const usage = usageFor(body, behaviour);
  if (path.endsWith('/messages/count_tokens')) return json(200, { input_tokens: usage.input });
  if (/\/models\/[^/:]+:countTokens$/.test(path)) return json(200, { totalTokens: usage.input });
  const gemini = /\/models\/([^/:]+):(generateContent|streamGenerateContent)$/.exec(path);
  if (gemini) return geminiAnswer(behaviour.servedModel ?? gemini[1]!, gemini[2] === 'streamGenerateContent', req.query.get('alt') === 'sse', usage, seq, behaviour.toolCall);
  if (path.endsWith('/chat/completions')) return chatAnswer(body, usage, seq, behaviour.toolCall);
  if (path.endsWith('/responses')) return responsesAnswer(body, usage, seq, behaviour.toolCall);
  if (path.endsWith('/embeddings')) return embeddingsAnswer(body, usage);
  if (path.endsWith('/audio/speech')) return speechAnswer(body);
  if (/\/text-to-speech\/[^/]+(\/stream)?$/.test(path)) return speechAnswer({ input: body.text });
  if (path.endsWith('/messages')) return anthropicAnswer(body, usage, seq, behaviour.toolCall);
  return errorAnswer(familyOf(path), 404, undefined);
}

// ---- Deterministic usage --------------------------------------------------------------------------

type Body = Record<string, unknown>;
type Usage = { input: number; output: number; cached: number; cacheWrite: number };

function usageFor(body: Body, behaviour: Behaviour): Usage {
  const input = countWords(promptText(body));
  const generation = (body.generationConfig ?? {}) as Body;
  const cap = [body.max_tokens, body.max_completion_tokens, body.max_output_tokens, generation.maxOutputTokens].find(
    (v): v is number => typeof v === 'number',
  );
  const output = behaviour.outputTokens ?? cap ?? DEFAULT_OUTPUT_TOKENS;
  const cached = Math.min(behaviour.cachedTokens ?? 0, input);
  const cacheWrite = Math.min(behaviour.cacheWriteTokens ?? 0, input - cached);
  const factor = behaviour.overReport ?? 1;
  return { input: input * factor, output: output * factor, cached, cacheWrite };
}

export function countWords(text: string): number {
  const trimmed = text.trim();
  return trimmed === '' ? 0 : trimmed.split(/\s+/).length;
}

/** Every prompt string of an OpenAI, Anthropic or Gemini request, joined by spaces. */
export function promptText(body: Body): string {
  const texts: string[] = [];
  const collect = (value: unknown): void => {
    if (typeof value === 'string') texts.push(value);
    else if (Array.isArray(value)) value.forEach(collect);
    else if (value && typeof value === 'object') {
      const part = value as Body;
      if (typeof part.text === 'string') texts.push(part.text);
      collect(part.content);
      collect(part.parts);
    }
  };
  collect(body.system);
  collect(body.messages);
  collect(body.input);
  collect(body.prompt);
  collect(body.contents);
  collect((body.systemInstruction as Body | undefined)?.parts);
  return texts.join(' ');
}

const words = (n: number): string[] => Array.from({ length: n }, (_, i) => (i === 0 ? 'tok' : ' tok'));

// ---- OpenAI ---------------------------------------------------------------------------------------

/** A tool call's arguments as JSON text, in two pieces (streams send them split). */
function argumentPieces(call: MockToolCall): [string, string] {
  const text = JSON.stringify(call.arguments);
  const half = Math.floor(text.length / 2);
  return [text.slice(0, half), text.slice(half)];
}

function chatAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  const id = `chatcmpl-mock${seq}`;
  const model = typeof body.model === 'string' ? body.model : 'gpt-4o-mini';
  const created = 1_700_000_000;
  const openaiUsage = {
    prompt_tokens: usage.input,
    completion_tokens: usage.output,
    total_tokens: usage.input + usage.output,
    prompt_tokens_details: { cached_tokens: usage.cached, audio_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: 0 },
  };
  const callId = `call_mock${seq}`;
  if (body.stream !== true) {
    const message = toolCall
      ? { role: 'assistant', content: null, refusal: null, tool_calls: [{ id: callId, type: 'function', function: { name: toolCall.name, arguments: JSON.stringify(toolCall.arguments) } }] }
      : { role: 'assistant', content: words(usage.output).join(''), refusal: null };
    return json(200, {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message, finish_reason: toolCall ? 'tool_calls' : 'stop' }],
      usage: openaiUsage,
    });
  }
  const includeUsage = (body.stream_options as Body | undefined)?.include_usage === true;
  const chunk = (choices: unknown[], extra: Body = {}) =>
    sse({ id, object: 'chat.completion.chunk', created, model, choices, ...(includeUsage ? { usage: null } : {}), ...extra });
  const delta = (d: Body, finish: string | null = null) => [{ index: 0, delta: d, logprobs: null, finish_reason: finish }];
  const content = toolCall
    ? [
        chunk(delta({ tool_calls: [{ index: 0, id: callId, type: 'function', function: { name: toolCall.name, arguments: '' } }] })),
        ...argumentPieces(toolCall).map((piece) => chunk(delta({ tool_calls: [{ index: 0, function: { arguments: piece } }] }))),
      ]
    : words(usage.output).map((w) => chunk(delta({ content: w })));
  return stream([
    chunk(delta({ role: 'assistant', content: '' })),
    ...content,
    chunk(delta({}, toolCall ? 'tool_calls' : 'stop')),
    ...(includeUsage ? [chunk([], { usage: openaiUsage })] : []),
    'data: [DONE]\n\n',
  ]);
}

function responsesAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  const model = typeof body.model === 'string' ? body.model : 'gpt-4.1';
  const text = words(usage.output).join('');
  const itemId = toolCall ? `fc_mock${seq}` : `msg_mock${seq}`;
  const part = { type: 'output_text', text, annotations: [] };
  const item = (done: boolean) =>
    toolCall
      ? { id: itemId, type: 'function_call', status: done ? 'completed' : 'in_progress', call_id: `call_mock${seq}`, name: toolCall.name, arguments: done ? JSON.stringify(toolCall.arguments) : '' }
      : { id: itemId, type: 'message', status: done ? 'completed' : 'in_progress', role: 'assistant', content: done ? [part] : [] };
  const response = (status: string, withOutput: boolean) => ({
    id: `resp_mock${seq}`,
    object: 'response',
    created_at: 1_700_000_000,
    status,
    model,
    output: withOutput ? [item(true)] : [],
    usage: withOutput
      ? {
          input_tokens: usage.input,
          input_tokens_details: { cached_tokens: usage.cached },
          output_tokens: usage.output,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: usage.input + usage.output,
        }
      : null,
  });
  if (body.stream !== true) return json(200, response('completed', true));
  let n = 0;
  const event = (type: string, data: Body) => sse({ type, sequence_number: n++, ...data }, type);
  const at = { item_id: itemId, output_index: 0 };
  // The events OpenAI sends, in its order: the item opens, its content grows, the item closes.
  const content = toolCall
    ? [
        ...argumentPieces(toolCall).map((delta) => event('response.function_call_arguments.delta', { ...at, delta })),
        event('response.function_call_arguments.done', { ...at, arguments: JSON.stringify(toolCall.arguments) }),
      ]
    : [
        event('response.content_part.added', { ...at, content_index: 0, part: { ...part, text: '' } }),
        ...words(usage.output).map((delta) => event('response.output_text.delta', { ...at, content_index: 0, delta, logprobs: [] })),
        event('response.output_text.done', { ...at, content_index: 0, text, logprobs: [] }),
        event('response.content_part.done', { ...at, content_index: 0, part }),
      ];
  return stream([
    event('response.created', { response: response('in_progress', false) }),
    event('response.in_progress', { response: response('in_progress', false) }),
    event('response.output_item.added', { output_index: 0, item: item(false) }),
    ...content,
    event('response.output_item.done', { output_index: 0, item: item(true) }),
    event('response.completed', { response: response('completed', true) }),
  ]);
}

/** The vector as OpenAI sends it for `encoding_format: 'base64'`: little-endian float32s, base64. */
const base64Vector = Buffer.from(new Float32Array([0.1, 0.2, 0.3]).buffer).toString('base64');

function embeddingsAnswer(body: Body, usage: Usage): Answer {
  const inputs = Array.isArray(body.input) ? body.input : [body.input];
  return json(200, {
    object: 'list',
    data: inputs.map((_, index) => ({ object: 'embedding', index, embedding: body.encoding_format === 'base64' ? base64Vector : [0.1, 0.2, 0.3] })),
    model: typeof body.model === 'string' ? body.model : 'text-embedding-3-small',
    usage: { prompt_tokens: usage.input, total_tokens: usage.input },
  });
}

/** The model list in the shape of the provider the request's headers name. */
function modelList(headers: IncomingHttpHeaders): unknown {
  if (headers['anthropic-version']) {
    const data = ['claude-haiku-4-5', 'claude-sonnet-4-5'].map((id) => ({ type: 'model', id, display_name: id, created_at: '2025-10-01T00:00:00Z' }));
    return { data, has_more: false, first_id: data[0]!.id, last_id: data.at(-1)!.id };
  }
  if (headers['x-goog-api-key']) {
    return {
      models: ['gemini-2.0-flash', 'gemini-2.5-pro'].map((id) => ({
        name: `models/${id}`,
        displayName: id,
        supportedGenerationMethods: ['generateContent', 'countTokens'],
      })),
    };
  }
  return {
    object: 'list',
    data: ['gpt-4o-mini', 'gpt-4.1'].map((id) => ({ id, object: 'model', created: 1_700_000_000, owned_by: 'mock' })),
  };
}

/** Audio bytes: one byte per input character (code point), so tests can check binary relays. */
function speechAnswer(body: Body): Answer {
  const input = typeof body.input === 'string' ? body.input : '';
  const audio = Buffer.from(Array.from({ length: [...input].length }, (_, i) => i % 256));
  return { status: 200, headers: { 'content-type': 'audio/mpeg' }, chunks: [audio] };
}

/** An ElevenLabs transcript, timed word by word (it documents no duration field). */
function transcriptAnswer(seq: number): Answer {
  return json(200, {
    language_code: 'en',
    language_probability: 0.99,
    text: 'hello world',
    words: [
      { text: 'hello', start: 0.1, end: 0.5, type: 'word' },
      { text: ' ', start: 0.5, end: 0.6, type: 'spacing' },
      { text: 'world', start: 0.6, end: TRANSCRIPT_SECONDS, type: 'word' },
    ],
    transcription_id: `transcript-mock${seq}`,
  });
}

// ---- Anthropic ------------------------------------------------------------------------------------

function anthropicAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  const id = `msg_mock${seq}`;
  const model = typeof body.model === 'string' ? body.model : 'claude-sonnet-4-5';
  const stopReason = toolCall ? 'tool_use' : typeof body.max_tokens === 'number' ? 'max_tokens' : 'end_turn';
  const toolUse = toolCall && { type: 'tool_use', id: `toolu_mock${seq}`, name: toolCall.name, input: toolCall.arguments };
  // Anthropic's input_tokens excludes cache reads and writes.
  const inputUsage = {
    input_tokens: usage.input - usage.cached - usage.cacheWrite,
    cache_creation_input_tokens: usage.cacheWrite,
    cache_read_input_tokens: usage.cached,
  };
  if (body.stream !== true) {
    return json(200, {
      id,
      type: 'message',
      role: 'assistant',
      model,
      content: toolUse ? [toolUse] : [{ type: 'text', text: words(usage.output).join('') }],
      stop_reason: stopReason,
      stop_sequence: null,
      usage: { ...inputUsage, output_tokens: usage.output },
    });
  }
  const event = (type: string, data: Body) => sse({ type, ...data }, type);
  return stream([
    event('message_start', {
      message: { id, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { ...inputUsage, output_tokens: 1 } },
    }),
    event('content_block_start', { index: 0, content_block: toolUse ? { ...toolUse, input: {} } : { type: 'text', text: '' } }),
    event('ping', {}),
    ...(toolCall
      ? argumentPieces(toolCall).map((partial_json) => event('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json } }))
      : words(usage.output).map((text) => event('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }))),
    event('content_block_stop', { index: 0 }),
    event('message_delta', { delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: usage.output } }),
    event('message_stop', {}),
  ]);
}

// ---- Gemini ---------------------------------------------------------------------------------------

function geminiAnswer(model: string, streaming: boolean, alt: boolean, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  const usageMetadata = (output: number) => ({
    promptTokenCount: usage.input,
    candidatesTokenCount: output,
    totalTokenCount: usage.input + output,
    ...(usage.cached > 0 ? { cachedContentTokenCount: usage.cached } : {}),
  });
  const piece = (text: string, output: number, last: boolean) => ({
    candidates: [{ content: { parts: [{ text }], role: 'model' }, index: 0, ...(last ? { finishReason: 'STOP' } : {}) }],
    usageMetadata: usageMetadata(output),
    modelVersion: model,
    responseId: `gemini-mock${seq}`,
  });
  if (toolCall) {
    const called = piece('', usage.output, true);
    called.candidates[0]!.content.parts = [{ functionCall: { name: toolCall.name, args: toolCall.arguments } }] as never;
    if (!streaming) return json(200, called);
    return alt ? stream([sse(called)]) : json(200, [called]);
  }
  const all = words(usage.output);
  if (!streaming) return json(200, piece(all.join(''), usage.output, true));
  // Gemini repeats usageMetadata on every chunk; the counts grow to the final ones.
  const pieces = all.length === 0 ? [piece('', 0, true)] : all.map((w, i) => piece(w, i + 1, i === all.length - 1));
  if (!alt) return json(200, pieces);
  return stream(pieces.map((p) => sse(p)));
}

// ---- Errors and framing ---------------------------------------------------------------------------

const OPENAI_ERROR_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  404: 'invalid_request_error',
  429: 'rate_limit_error',
};
const ANTHROPIC_ERROR_TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  404: 'not_found_error',
  429: 'rate_limit_error',
  529: 'overloaded_error',
};
const GEMINI_STATUSES: Record<number, string> = {
  400: 'INVALID_ARGUMENT',
  401: 'UNAUTHENTICATED',
  404: 'NOT_FOUND',
  429: 'RESOURCE_EXHAUSTED',
  503: 'UNAVAILABLE',
};

/** The error body each provider really sends; 429 also carries retry-after. */
export const MOCK_UPSTREAM_HEADER = 'x-mock-upstream';

export function providerError(family: Family, status: number, message = `Mock upstream error ${status}.`): unknown {
  switch (family) {
    case 'openai':
      return { error: { message, type: OPENAI_ERROR_TYPES[status] ?? 'server_error', param: null, code: null } };
    case 'anthropic':
      return { type: 'error', error: { type: ANTHROPIC_ERROR_TYPES[status] ?? 'api_error', message } };
    case 'gemini':
      return { error: { code: status, message, status: GEMINI_STATUSES[status] ?? 'INTERNAL' } };
  }
}

function errorAnswer(family: Family, status: number, body: unknown, message?: string): Answer {
  const answer = json(status, body ?? providerError(family, status, message));
  if (status === 429) answer.headers['retry-after'] = '1';
  return answer;
}

function echo(req: RecordedRequest): unknown {
  return { method: req.method, path: req.path, query: Object.fromEntries(req.query), headers: req.headers, body: req.body.toString('utf8') };
}

function json(status: number, body: unknown): Answer {
  return { status, headers: { 'content-type': 'application/json' }, chunks: [JSON.stringify(body)] };
}

function stream(chunks: string[]): Answer {
  return { status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }, chunks };
}

function sse(data: unknown, event?: string): string {
  return `${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;
}

function parseJson(body: Buffer): unknown {
  if (body.length === 0) return undefined;
  try {
    return JSON.parse(body.toString('utf8')) as unknown;
  } catch {
    return undefined;
  }
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}
