/**
 * The rewrite proxy's pivot: every client format is read into these shapes and every provider
 * format written from them, so three formats need one reader and one writer each rather than a
 * translator per pair. Only what every format can express, or what a writer can refuse by name,
 * lives here (decision 0022); anything else in a request is refused, never dropped.
 */
import type { Issue } from '../../http/errors.ts';

export const REWRITE_FORMATS = ['openai', 'anthropic', 'google'] as const;
export type RewriteFormat = (typeof REWRITE_FORMATS)[number];

/**
 * The API a client speaks: a format's own (`openai` is Chat Completions), or OpenAI's Responses
 * API, which clients of the `openai` format reach at `/responses` and which is read and written
 * only on the client's side (a provider is called in its format's chat API).
 */
export type ClientApi = RewriteFormat | 'responses';

export type JsonObject = Record<string, unknown>;

export type ImageSource = { kind: 'base64'; mediaType: string; data: string } | { kind: 'url'; url: string };

export type ToolCall = { id: string; name: string; arguments: JsonObject };

export type Part =
  | { type: 'text'; text: string }
  | { type: 'image'; source: ImageSource }
  | { type: 'tool_call'; call: ToolCall }
  /** A tool's answer; `content` is its text (JSON text when the format answers with an object). */
  | { type: 'tool_result'; callId: string; content: string; isError: boolean };

export type Message = { role: 'user' | 'assistant'; parts: Part[] };

export type Tool = { name: string; description?: string; parameters: JsonObject };

export type ToolChoice = { type: 'auto' } | { type: 'none' } | { type: 'required' } | { type: 'tool'; name: string };

export type ChatRequest = {
  model: string;
  system?: string;
  messages: Message[];
  maxTokens?: number;
  temperature?: number;
  topP?: number;
  topK?: number;
  stop?: string[];
  stream: boolean;
  /** OpenAI's `stream_options.include_usage`: a client-side wish, never sent to a provider as such. */
  streamUsage?: boolean;
  tools?: Tool[];
  toolChoice?: ToolChoice;
  /** OpenAI's `user`, Anthropic's `metadata.user_id`. */
  user?: string;
};

export type StopReason = 'end' | 'max_tokens' | 'stop_sequence' | 'tool_calls' | 'content_filter';

/** Token convention of UsageReport: `inputTokens` counts every input token, cached ones included. */
export type Usage = { inputTokens: number; outputTokens: number; cachedInputTokens?: number; cacheWriteInputTokens?: number };

export type ResponsePart = Extract<Part, { type: 'text' } | { type: 'tool_call' }>;

export type ChatResponse = {
  id: string;
  model: string;
  parts: ResponsePart[];
  stopReason: StopReason;
  stopSequence?: string;
  usage: Usage;
};

/**
 * A stream as a sequence of these. A tool call is announced by its first event (with id and name)
 * and its arguments arrive as JSON text in pieces; `index` counts tool calls from 0.
 */
export type StreamEvent =
  | { type: 'start'; id: string; model: string }
  | { type: 'text'; text: string }
  | { type: 'tool_call'; index: number; id?: string; name?: string; argumentsDelta: string }
  | { type: 'finish'; stopReason: StopReason; stopSequence?: string }
  | { type: 'usage'; usage: Usage }
  | { type: 'done' };

export type ErrorKind = 'invalid_request' | 'authentication' | 'permission' | 'not_found' | 'rate_limit' | 'overloaded' | 'server';

export type ProviderError = { kind: ErrorKind; message: string };

/** The SSE text of one event: `event:` line when named, then its data. */
export function sseEvent(data: unknown, event?: string): string {
  const payload = typeof data === 'string' ? data : JSON.stringify(data);
  return event ? `event: ${event}\ndata: ${payload}\n\n` : `data: ${payload}\n\n`;
}

/** Collects what a reader or writer could not translate, each named by its path in the request. */
export class Untranslatable {
  readonly issues: Issue[] = [];

  add(path: (string | number)[], message: string): void {
    this.issues.push({ path: path.map(String), message });
  }

  /** Every member of `value` whose name is not in `known`. */
  unknownMembers(value: JsonObject, known: ReadonlySet<string>, path: (string | number)[]): void {
    for (const key of Object.keys(value)) if (!known.has(key)) this.add([...path, key], 'is not supported by the rewrite proxy');
  }
}

export function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A stream event's data as a JSON object; null for anything else, which a decoder skips. */
export function streamEventObject(data: string): JsonObject | null {
  try {
    const parsed: unknown = JSON.parse(data);
    return isObject(parsed) ? parsed : null;
  } catch {
    return null;
  }
}

/** JSON text to an object; tool arguments that are not a JSON object are refused by name. */
export function parseArguments(text: string, path: (string | number)[], problems: Untranslatable): JsonObject {
  if (text.trim() === '') return {};
  try {
    const parsed: unknown = JSON.parse(text);
    if (isObject(parsed)) return parsed;
  } catch {
    // refused below
  }
  problems.add(path, 'must be a JSON object');
  return {};
}

/** A string member, or a problem named when present with another type. */
export function optionalString(value: JsonObject, key: string, path: (string | number)[], problems: Untranslatable): string | undefined {
  const member = value[key];
  if (member === undefined || member === null) return undefined;
  if (typeof member === 'string') return member;
  problems.add([...path, key], 'must be a string');
  return undefined;
}

export function optionalNumber(value: JsonObject, key: string, path: (string | number)[], problems: Untranslatable): number | undefined {
  const member = value[key];
  if (member === undefined || member === null) return undefined;
  if (typeof member === 'number' && Number.isFinite(member)) return member;
  problems.add([...path, key], 'must be a number');
  return undefined;
}

export function arrayOf(value: JsonObject, key: string, path: (string | number)[], problems: Untranslatable): unknown[] {
  const member = value[key];
  if (member === undefined || member === null) return [];
  if (Array.isArray(member)) return member;
  problems.add([...path, key], 'must be an array');
  return [];
}

/** Drops members whose value is undefined, so written bodies have no `"x": undefined` keys. */
export function compact<T extends JsonObject>(value: T): T {
  for (const key of Object.keys(value)) if (value[key] === undefined) delete value[key];
  return value;
}

/** Text parts of a message joined; the readers use it where a format takes text only. */
export function textOf(parts: readonly Part[]): string {
  return parts.map((part) => (part.type === 'text' ? part.text : '')).join('');
}

/** What a response writer needs besides the response: when it was made (Unix seconds). */
export type ResponseContext = { created: number };

/** Writes one canonical stream event as the client's SSE text ('' when the format has no such event). */
export type StreamEncoder = (event: StreamEvent) => string;

/** Reads one provider SSE event's data (and name) into canonical events. */
export type StreamDecoder = { push(data: string, event?: string): StreamEvent[]; end(): StreamEvent[] };

/**
 * A provider's error answer in the canonical shape. OpenAI, Anthropic and Gemini all put the
 * message at `error.message`; the status alone decides the kind.
 */
export function readProviderError(status: number, body: unknown): ProviderError {
  const error = isObject(body) && isObject(body.error) ? body.error : {};
  return { kind: errorKindOf(status), message: typeof error.message === 'string' ? error.message : `Provider error ${status}` };
}

/** A provider's error status, as a kind every format has a name for. */
function errorKindOf(status: number): ErrorKind {
  if (status === 401) return 'authentication';
  if (status === 403) return 'permission';
  if (status === 404) return 'not_found';
  if (status === 429) return 'rate_limit';
  if (status === 503 || status === 529) return 'overloaded';
  if (status >= 400 && status < 500) return 'invalid_request';
  return 'server';
}
