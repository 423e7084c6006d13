import { randomBytes } from 'node:crypto';
import { estimateTokensFromCharacters } from './estimate.ts';
import { createOpenAICompatibleProvider } from './openai-compatible.ts';
import type { LocalAnswer, LocalRequest, ProviderModule } from './types.ts';

/**
 * The built-in demo provider: answers like OpenAI's chat completions API (JSON and event streams,
 * with usage), in process, with no key and no network, so a first billed call can be tried
 * offline. Its answer is fixed text around the last user message, so a test can predict it.
 *
 * Its quirks: token counts are the "4 characters a token" estimate of the text it read and wrote
 * (it has no tokenizer); it serves one choice whatever `n` asks; tools, images and audio are
 * accepted and ignored.
 */

export const DEMO_MODEL = 'demo-chat';
const MODELS = [DEMO_MODEL];

/** Per 1M tokens, in 1e-10 units: $1 input, $2 output — small, but never free. */
const DEMO_PRICES = { input: 10_000_000_000n, output: 20_000_000_000n };

/** Longest echo of the user's message in the answer, in characters. */
const ECHO_LIMIT = 200;
/** Characters per streamed content chunk. */
const STREAM_PIECE = 16;

type Message = { role?: unknown; content?: unknown };
type Usage = { prompt_tokens: number; completion_tokens: number; total_tokens: number };

const base = createOpenAICompatibleProvider({
  id: 'demo',
  displayName: 'Tollgate demo (offline)',
  // `.invalid` never resolves: nothing is ever sent there, the module answers itself.
  baseUrl: 'https://demo.tollgate.invalid/v1',
  modelNames: /^demo-/,
});

export const demo: ProviderModule = {
  ...base,
  answerLocally: answerDemoRequest,
  ownPrices: (model) => (MODELS.includes(model) ? DEMO_PRICES : null),
  ownModels: MODELS,
};

export function answerDemoRequest(request: LocalRequest): LocalAnswer {
  const path = request.url.pathname.replace(/^\/v1/, '');
  if (request.method === 'GET' && path === '/models') return json(200, { object: 'list', data: MODELS.map((id) => modelObject(id, request.now)) });
  if (request.method === 'GET' && path.startsWith('/models/')) {
    const id = decodeURIComponent(path.slice('/models/'.length));
    return MODELS.includes(id) ? json(200, modelObject(id, request.now)) : modelNotFound(id);
  }
  if (request.method === 'POST' && path === '/chat/completions') return chatCompletion(request);
  return openaiError(404, `Unknown request URL: ${request.method} ${request.url.pathname}. The demo provider serves POST /v1/chat/completions and GET /v1/models.`, 'invalid_request_error', 'unknown_url');
}

function chatCompletion(request: LocalRequest): LocalAnswer {
  const body = request.body;
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return openaiError(400, 'The body must be a JSON object.', 'invalid_request_error', 'invalid_json');
  }
  const { model, messages, stream } = body as Record<string, unknown>;
  if (typeof model !== 'string') return openaiError(400, "Missing required parameter: 'model'.", 'invalid_request_error', 'missing_required_parameter');
  if (!MODELS.includes(model)) return modelNotFound(model);
  if (!Array.isArray(messages) || messages.length === 0) {
    return openaiError(400, "'messages' must be a non-empty array.", 'invalid_request_error', 'invalid_value');
  }
  const cap = outputCap(body as Record<string, unknown>);
  const full = replyTo(messages as Message[]);
  const text = cap === undefined ? full : full.slice(0, cap * 4);
  const finishReason = text.length < full.length ? 'length' : 'stop';
  const promptTokens = Math.max(1, estimateTokensFromCharacters(messagesText(messages as Message[]).length));
  const completionTokens = estimateTokensFromCharacters(text.length);
  const usage: Usage = { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
  const id = `chatcmpl-demo${randomBytes(9).toString('hex')}`;
  const created = Math.floor(request.now / 1000);
  if (stream === true) {
    const includeUsage = (body as { stream_options?: { include_usage?: unknown } }).stream_options?.include_usage === true;
    return streamed({ id, created, model, text, finishReason, usage: includeUsage ? usage : null });
  }
  return json(200, {
    id,
    object: 'chat.completion',
    created,
    model,
    choices: [{ index: 0, message: { role: 'assistant', content: text, refusal: null }, logprobs: null, finish_reason: finishReason }],
    usage,
  });
}

/** The text the demo answers with: a fixed greeting around the last user message. */
export function replyTo(messages: Message[]): string {
  const lastUser = [...messages].reverse().find((m) => m.role === 'user');
  const said = lastUser ? contentText(lastUser.content).trim() : '';
  const echo = said.length > ECHO_LIMIT ? `${said.slice(0, ECHO_LIMIT)}…` : said;
  return echo
    ? `Hello from Tollgate's demo provider. You said: "${echo}"`
    : "Hello from Tollgate's demo provider.";
}

function messagesText(messages: Message[]): string {
  return messages.map((m) => contentText(m.content)).join('\n');
}

/** A message's text: the string, or its text parts joined (other parts are ignored). */
function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((part: unknown) => (typeof part === 'object' && part !== null && typeof (part as { text?: unknown }).text === 'string' ? (part as { text: string }).text : ''))
    .join('');
}

/** The output cap the request sets (`max_completion_tokens` wins over the older `max_tokens`). */
function outputCap(body: Record<string, unknown>): number | undefined {
  for (const name of ['max_completion_tokens', 'max_tokens']) {
    const value = body[name];
    if (typeof value === 'number' && Number.isInteger(value) && value > 0) return value;
  }
  return undefined;
}

type StreamParts = { id: string; created: number; model: string; text: string; finishReason: string; usage: Usage | null };

/**
 * OpenAI's stream: a role chunk, content chunks, a finish chunk, and with `include_usage` a last
 * chunk with no choices and the usage, every earlier chunk then carrying `"usage": null`.
 */
function streamed({ id, created, model, text, finishReason, usage }: StreamParts): LocalAnswer {
  const chunk = (choices: unknown[], extra: object = {}) =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model, choices, ...(usage ? { usage: null } : {}), ...extra })}\n\n`;
  const delta = (d: object, finish: string | null = null) => [{ index: 0, delta: d, logprobs: null, finish_reason: finish }];
  const chunks = [chunk(delta({ role: 'assistant', content: '', refusal: null }))];
  for (let at = 0; at < text.length; at += STREAM_PIECE) chunks.push(chunk(delta({ content: text.slice(at, at + STREAM_PIECE) })));
  chunks.push(chunk(delta({}, finishReason)));
  if (usage) chunks.push(chunk([], { usage }));
  chunks.push('data: [DONE]\n\n');
  return { status: 200, headers: { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' }, chunks };
}

function modelObject(id: string, now: number) {
  return { id, object: 'model', created: Math.floor(now / 1000), owned_by: 'tollgate-demo' };
}

function modelNotFound(model: string): LocalAnswer {
  return openaiError(404, `The model \`${model}\` does not exist. The demo provider serves ${MODELS.join(', ')}.`, 'invalid_request_error', 'model_not_found');
}

function openaiError(status: number, message: string, type: string, code: string): LocalAnswer {
  return json(status, { error: { message, type, param: null, code } });
}

function json(status: number, body: unknown): LocalAnswer {
  return { status, headers: { 'content-type': 'application/json' }, chunks: [JSON.stringify(body)] };
}
