import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  anthropicAnswer,
  chatAnswer,
  embeddingsAnswer,
  errorAnswer,
  geminiAnswer,
  json,
  modelList,
  responsesAnswer,
  imagesAnswer,
  speechAnswer,
  transcriptAnswer,
  transcriptionAnswer,
  type Answer,
  type Body,
  type Family,
  type MockToolCall,
  type Usage,
} from './mock-provider-answers.ts';
import { isProviderPath } from './mock-paths.ts';

export { AUDIO_SECONDS, AUDIO_TOKENS_PER_SECOND, IMAGE_OUTPUT_TOKENS, TRANSCRIPT_SECONDS } from './mock-provider-answers.ts';

/**
 * A fake provider for gateway tests: one plain node:http server on 127.0.0.1 that answers like
 * OpenAI, Anthropic and Gemini. It serves only the exact paths the real providers serve
 * (mock-paths.ts: OpenAI's /v1/chat/completions, Groq's /openai/v1/chat/completions, Anthropic's
 * /v1/messages, Gemini's /v1beta/models/{m}:generateContent, …) and answers any other path with
 * the provider's 404, so a wrong upstream URL fails a test. Which answer a served path gets is
 * chosen by the end of the path:
 *
 *   POST …/chat/completions   OpenAI chat, JSON or SSE (`stream: true`)
 *   POST …/responses          OpenAI Responses, JSON or SSE
 *   POST …/embeddings         OpenAI embeddings (base64 float32s when encoding_format is base64)
 *   GET  …/models             the model list, in Anthropic's shape when the request carries
 *                             anthropic-version, Gemini's when it carries x-goog-api-key, else OpenAI's
 *   POST …/audio/speech       binary audio (bytes = input characters)
 *   POST …/audio/transcriptions, …/audio/translations   OpenAI transcript of a multipart upload
 *                             (AUDIO_SECONDS of audio; see transcriptionAnswer)
 *   POST …/images/generations  `n` base64 images; gpt-image-… models report token usage
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
  /** A multipart body's text fields (files as their size in bytes), or undefined. */
  form?: Record<string, string>;
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
  /** Input tokens to report instead of the prompt's words (media the mock cannot see: a document named by id). */
  inputTokens?: number;
  /** Report this many times the input and output tokens (a provider over-reporting its usage). */
  overReport?: number;
  /** cache_creation_input_tokens to report (Anthropic only). */
  cacheWriteTokens?: number;
  /** Answer chat/responses/messages/Gemini calls with this one tool call instead of text (JSON and streams). */
  toolCall?: MockToolCall;
  /** Answer under this model name instead of the requested one (a dated version, as providers do). */
  servedModel?: string;
  /** Part of the output tokens to report as reasoning (OpenAI reasoning_tokens, Gemini thoughtsTokenCount). */
  reasoningTokens?: number;
};

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
      form: await parseForm(body, req.headers['content-type']),
    };
    requests.push(recorded);
    const behaviour = takeBehaviour(url.pathname);

    if (behaviour.hang) return;
    // Wall clock: a slow provider takes real time to answer (relay timeouts are real milliseconds).
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
    // Wall clock: a slow stream takes real time between its chunks.
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
  if (!isProviderPath(method, path)) return errorAnswer(familyOf(path), 404, undefined, `No provider serves ${method} ${path}.`);
  if (method === 'GET') return json(200, modelList(req.headers));
  // A multipart audio upload: never JSON.
  if (path.endsWith('/speech-to-text')) return transcriptAnswer(seq);
  if (/\/audio\/(transcriptions|translations)$/.test(path)) return transcriptionAnswer(req.form ?? {});
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
  if (path.endsWith('/images/generations')) return imagesAnswer(body, usage);
  if (/\/text-to-speech\/[^/]+(\/stream)?$/.test(path)) return speechAnswer({ input: body.text });
  if (path.endsWith('/messages')) return anthropicAnswer(body, usage, seq, behaviour.toolCall);
  return errorAnswer(familyOf(path), 404, undefined);
}

// ---- Deterministic usage --------------------------------------------------------------------------

function usageFor(body: Body, behaviour: Behaviour): Usage {
  const input = behaviour.inputTokens ?? countWords(promptText(body));
  const generation = (body.generationConfig ?? {}) as Body;
  const cap = [body.max_tokens, body.max_completion_tokens, body.max_output_tokens, generation.maxOutputTokens].find(
    (v): v is number => typeof v === 'number',
  );
  const output = behaviour.outputTokens ?? cap ?? DEFAULT_OUTPUT_TOKENS;
  const cached = Math.min(behaviour.cachedTokens ?? 0, input);
  const cacheWrite = Math.min(behaviour.cacheWriteTokens ?? 0, input - cached);
  const factor = behaviour.overReport ?? 1;
  const reasoning = Math.min(behaviour.reasoningTokens ?? 0, output);
  return { input: input * factor, output: output * factor, cached, cacheWrite, reasoning };
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


/** Marks the provider's own answers, so a test can tell them from Tollgate's after the relay. */
export const MOCK_UPSTREAM_HEADER = 'x-mock-upstream';

function echo(req: RecordedRequest): unknown {
  return { method: req.method, path: req.path, query: Object.fromEntries(req.query), headers: req.headers, body: req.body.toString('utf8') };
}

function parseJson(body: Buffer): unknown {
  if (body.length === 0) return undefined;
  try {
    return JSON.parse(body.toString('utf8')) as unknown;
  } catch {
    return undefined;
  }
}

/** A multipart body's fields, read with the platform's own form parser; files become their size. */
async function parseForm(body: Buffer, contentType: string | undefined): Promise<Record<string, string> | undefined> {
  if (!contentType?.startsWith('multipart/form-data')) return undefined;
  try {
    const form = await new Response(new Uint8Array(body), { headers: { 'content-type': contentType } }).formData();
    const fields: Record<string, string> = {};
    for (const [name, value] of form) fields[name] = typeof value === 'string' ? value : String(value.size);
    return fields;
  } catch {
    return undefined;
  }
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}
