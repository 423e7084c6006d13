import type { IncomingHttpHeaders } from 'node:http';

/**
 * The mock provider's answers (mock-upstream.ts routes to them): OpenAI, Anthropic, Gemini and
 * ElevenLabs bodies and event streams built from a request and its deterministic usage, and each
 * provider's error body.
 */

export type Answer = { status: number; headers: Record<string, string>; chunks: (string | Buffer)[] };
export type Family = 'openai' | 'anthropic' | 'gemini';
export type Body = Record<string, unknown>;
/** `reasoning`: the part of `output` spent reasoning (reported by OpenAI and Gemini; absent = 0). */
export type Usage = { input: number; output: number; cached: number; cacheWrite: number; reasoning?: number };
export type MockToolCall = { name: string; arguments: Record<string, unknown> };

/** Where the last word of every ElevenLabs transcript ends, in seconds. */
export const TRANSCRIPT_SECONDS = 90.25;

const words = (n: number): string[] => Array.from({ length: n }, (_, i) => (i === 0 ? 'tok' : ' tok'));

// ---- OpenAI ---------------------------------------------------------------------------------------

/** A tool call's arguments as JSON text, in two pieces (streams send them split). */
function argumentPieces(call: MockToolCall): [string, string] {
  const text = JSON.stringify(call.arguments);
  const half = Math.floor(text.length / 2);
  return [text.slice(0, half), text.slice(half)];
}

export function chatAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  const id = `chatcmpl-mock${seq}`;
  const model = typeof body.model === 'string' ? body.model : 'gpt-4o-mini';
  const created = 1_700_000_000;
  const openaiUsage = {
    prompt_tokens: usage.input,
    completion_tokens: usage.output,
    total_tokens: usage.input + usage.output,
    prompt_tokens_details: { cached_tokens: usage.cached, audio_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: usage.reasoning ?? 0 },
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

export function responsesAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
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
          output_tokens_details: { reasoning_tokens: usage.reasoning ?? 0 },
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

export function embeddingsAnswer(body: Body, usage: Usage): Answer {
  const inputs = Array.isArray(body.input) ? body.input : [body.input];
  return json(200, {
    object: 'list',
    data: inputs.map((_, index) => ({ object: 'embedding', index, embedding: body.encoding_format === 'base64' ? base64Vector : [0.1, 0.2, 0.3] })),
    model: typeof body.model === 'string' ? body.model : 'text-embedding-3-small',
    usage: { prompt_tokens: usage.input, total_tokens: usage.input },
  });
}

/** The model list in the shape of the provider the request's headers name. */
export function modelList(headers: IncomingHttpHeaders): unknown {
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
export function speechAnswer(body: Body): Answer {
  const input = typeof body.input === 'string' ? body.input : '';
  const audio = Buffer.from(Array.from({ length: [...input].length }, (_, i) => i % 256));
  return { status: 200, headers: { 'content-type': 'audio/mpeg' }, chunks: [audio] };
}

/** An ElevenLabs transcript, timed word by word (it documents no duration field). */
export function transcriptAnswer(seq: number): Answer {
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

/** Seconds of audio in every upload the mock transcribes. */
export const AUDIO_SECONDS = 42;
/** gpt-4o-transcribe's audio tokens per second of upload, as the mock counts them. */
export const AUDIO_TOKENS_PER_SECOND = 10;

/**
 * OpenAI transcription or translation of an upload (its form fields given): whisper-1 answers with
 * `usage: {type: "duration"}` (json) or `duration` (verbose_json); token-priced models
 * (gpt-4o-transcribe) with token usage.
 */
export function transcriptionAnswer(fields: Record<string, string>): Answer {
  const text = 'hello world';
  const format = fields.response_format ?? 'json';
  if (format === 'text') return { status: 200, headers: { 'content-type': 'text/plain; charset=utf-8' }, chunks: [text] };
  if (format === 'verbose_json') {
    return json(200, { task: 'transcribe', language: 'english', duration: AUDIO_SECONDS, text, segments: [], usage: { type: 'duration', seconds: AUDIO_SECONDS } });
  }
  if (fields.model?.startsWith('whisper')) return json(200, { text, usage: { type: 'duration', seconds: AUDIO_SECONDS } });
  const audioTokens = AUDIO_SECONDS * AUDIO_TOKENS_PER_SECOND;
  return json(200, {
    text,
    usage: { type: 'tokens', input_tokens: audioTokens, input_token_details: { text_tokens: 0, audio_tokens: audioTokens }, output_tokens: 2, total_tokens: audioTokens + 2 },
  });
}

/** Output tokens gpt-image-1 reports per image (a 1024 × 1024 image at low quality, say). */
export const IMAGE_OUTPUT_TOKENS = 272;

/** An image generation: `n` images (default 1) as base64; gpt-image-… models also report token usage. */
export function imagesAnswer(body: Body, usage: Usage): Answer {
  const n = typeof body.n === 'number' ? body.n : 1;
  const data = Array.from({ length: n }, () => ({ b64_json: Buffer.from('mock image').toString('base64') }));
  const tokenUsage =
    typeof body.model === 'string' && body.model.startsWith('gpt-image')
      ? { usage: { input_tokens: usage.input, input_tokens_details: { text_tokens: usage.input, image_tokens: 0 }, output_tokens: IMAGE_OUTPUT_TOKENS * n, total_tokens: usage.input + IMAGE_OUTPUT_TOKENS * n } }
      : {};
  return json(200, { created: 1_700_000_000, data, ...tokenUsage });
}

// ---- Anthropic ------------------------------------------------------------------------------------

export function anthropicAnswer(body: Body, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
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

export function geminiAnswer(model: string, streaming: boolean, alt: boolean, usage: Usage, seq: number, toolCall?: MockToolCall): Answer {
  // Gemini counts thoughts apart: candidatesTokenCount excludes them.
  const thoughts = usage.reasoning ?? 0;
  const usageMetadata = (output: number) => ({
    promptTokenCount: usage.input,
    candidatesTokenCount: Math.max(0, output - thoughts),
    totalTokenCount: usage.input + Math.max(output, thoughts),
    ...(usage.cached > 0 ? { cachedContentTokenCount: usage.cached } : {}),
    ...(thoughts > 0 ? { thoughtsTokenCount: thoughts } : {}),
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

function providerError(family: Family, status: number, message = `Mock upstream error ${status}.`): unknown {
  switch (family) {
    case 'openai':
      return { error: { message, type: OPENAI_ERROR_TYPES[status] ?? 'server_error', param: null, code: null } };
    case 'anthropic':
      return { type: 'error', error: { type: ANTHROPIC_ERROR_TYPES[status] ?? 'api_error', message } };
    case 'gemini':
      return { error: { code: status, message, status: GEMINI_STATUSES[status] ?? 'INTERNAL' } };
  }
}

export function errorAnswer(family: Family, status: number, body: unknown, message?: string): Answer {
  const answer = json(status, body ?? providerError(family, status, message));
  if (status === 429) answer.headers['retry-after'] = '1';
  return answer;
}


export function json(status: number, body: unknown): Answer {
  return { status, headers: { 'content-type': 'application/json' }, chunks: [JSON.stringify(body)] };
}

function stream(chunks: string[]): Answer {
  return { status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' }, chunks };
}

function sse(data: unknown, event?: string): string {
  return `${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;
}
