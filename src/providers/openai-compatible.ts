import { applyKey } from './auth.ts';
import { arrayAt, countAt, firstString, isObject, objectAt, parseJson, streamFlagSet, stringAt, type JsonObject } from './json.ts';
import { routeFromBaseUrl } from './route.ts';
import { createSseMeter } from './sse.ts';
import { emptyUsage, plausibleProviderMs, reportFromTokens, timestampFromUnixSeconds, withIdentity, type ReportedTokens, type UsageTally } from './usage.ts';
import type { AuthStyle, MeterContext, PreparedStreamRequest, ProviderModule, SseEvent, UsageReport } from './types.ts';

/**
 * The OpenAI wire format, spoken by OpenAI itself and by most hosted inference services. One
 * factory serves all of them; a provider's differences are options here, not code elsewhere.
 */
export type OpenAICompatibleOptions = {
  id: string;
  displayName: string;
  /** Documented base URL, e.g. https://api.groq.com/openai/v1. */
  baseUrl: string;
  /** Path prefixes on the base's host; defaults to the base URL's own path. */
  basePaths?: readonly string[];
  authStyle?: AuthStyle;
  custom?: boolean;
  /**
   * Whether the provider accepts `stream_options.include_usage`. Without it, streams can only be
   * metered from the text deltas (estimated), so turn this off only for a provider that rejects it.
   */
  acceptsStreamOptions?: boolean;
  /** See ProviderModule.modelNames. */
  modelNames?: RegExp;
  /** See ProviderModule.sharesAccountWith. */
  sharesAccountWith?: string;
};

export function createOpenAICompatibleProvider(options: OpenAICompatibleOptions): ProviderModule {
  const authStyle = options.authStyle ?? 'bearer';
  const acceptsStreamOptions = options.acceptsStreamOptions ?? true;
  return {
    id: options.id,
    displayName: options.displayName,
    family: 'openai-compatible',
    baseUrl: options.baseUrl,
    ...routeFromBaseUrl(options.baseUrl, options.basePaths),
    authStyle,
    custom: options.custom ?? false,
    applyAuth: (headers, key) => applyKey(headers, authStyle, key),
    usageFromJson,
    usageFromRequest,
    createStreamMeter: (ctx) => createOpenAIStreamMeter(ctx),
    modelFrom,
    responseId: (body) => stringAt(body, 'id') ?? null,
    prepareStreamRequest: (body, url) =>
      acceptsStreamOptions ? requestStreamUsage(body, url) : { body, injectedUsage: false },
    isInjectedUsageEvent: isInjectedUsageChunk,
    stripInjectedUsageFields: stripNullUsage,
    requestsStream: streamFlagSet,
    ...(options.modelNames ? { modelNames: options.modelNames } : {}),
    ...(options.sharesAccountWith ? { sharesAccountWith: options.sharesAccountWith } : {}),
  };
}

function modelFrom(requestBody: unknown, _url: URL, responseBody?: unknown): string | null {
  return firstString(stringAt(responseBody, 'model'), stringAt(requestBody, 'model'));
}

// ---- JSON responses -------------------------------------------------------------------------

function usageFromJson(body: unknown, ctx: MeterContext): UsageReport | null {
  const usage = usageObjectOf(body);
  const report = withMediaUsage(usage ? reportFromUsageObject(usage) : null, body, ctx.url);
  if (!report) return null;
  const completedAt = timestampFromUnixSeconds(responseTime(body), ctx.now);
  if (completedAt !== undefined) report.completedAt = completedAt;
  return withIdentity(report, modelFrom(ctx.requestBody, ctx.url, body), stringAt(body, 'id') ?? null);
}

const IMAGE_PATH = /\/images\/(generations|edits|variations)$/;
const AUDIO_TO_TEXT_PATH = /\/audio\/(transcriptions|translations)$/;

/**
 * What media answers count besides their `usage`: the images an image call made (`data`, one item
 * per image), and a transcription's seconds of audio from `duration` (verbose_json) when its usage
 * gave neither seconds nor tokens (whisper answers carry `usage: {type: "duration"}`, or nothing).
 */
function withMediaUsage(report: UsageReport | null, body: unknown, url: URL): UsageReport | null {
  if (IMAGE_PATH.test(url.pathname)) {
    const images = arrayAt(body, 'data')?.length;
    if (images === undefined) return report;
    const withImages = report ?? emptyUsage();
    withImages.outputImages = images;
    return withImages;
  }
  if (AUDIO_TO_TEXT_PATH.test(url.pathname) && (report === null || (report.inputSeconds === 0 && report.inputTokens === 0))) {
    const duration = countAt(body, 'duration');
    if (duration === undefined) return report;
    const withSeconds = report ?? emptyUsage();
    withSeconds.inputSeconds = duration;
    return withSeconds;
  }
  return report;
}

/** Unix seconds: a Response's `completed_at` (else `created_at`), a completion's `created`. */
function responseTime(body: unknown): number | undefined {
  return countAt(body, 'completed_at') ?? countAt(body, 'created') ?? countAt(body, 'created_at');
}

/** Groq puts streaming usage under `x_groq.usage`; everyone else under `usage`. */
function usageObjectOf(body: unknown): JsonObject | undefined {
  return objectAt(body, 'usage') ?? objectAt(objectAt(body, 'x_groq'), 'usage');
}

/**
 * Reads the three usage vocabularies of the OpenAI API: chat/completions/embeddings
 * (prompt_tokens, completion_tokens), Responses and gpt-image/transcription token usage
 * (input_tokens, output_tokens), and whisper's `{type: "duration", seconds}`.
 */
function reportFromUsageObject(usage: JsonObject): UsageReport | null {
  const seconds = stringAt(usage, 'type') === 'duration' ? countAt(usage, 'seconds') : undefined;
  if (seconds !== undefined) return { ...emptyUsage(), inputSeconds: seconds };
  return reportFromTokens(tokensFromUsageObject(usage));
}

function tokensFromUsageObject(usage: JsonObject): ReportedTokens {
  const inputTokens = countAt(usage, 'prompt_tokens') ?? countAt(usage, 'input_tokens');
  // Embeddings report prompt tokens only: their output is zero tokens, not unknown.
  const outputTokens =
    countAt(usage, 'completion_tokens') ?? countAt(usage, 'output_tokens') ?? (inputTokens === undefined ? undefined : 0);
  const cachedInputTokens =
    countAt(objectAt(usage, 'prompt_tokens_details'), 'cached_tokens') ??
    countAt(objectAt(usage, 'input_tokens_details'), 'cached_tokens');
  const reasoningTokens =
    countAt(objectAt(usage, 'completion_tokens_details'), 'reasoning_tokens') ??
    countAt(objectAt(usage, 'output_tokens_details'), 'reasoning_tokens');
  // Transcriptions report `input_token_details`; chat `prompt_tokens_details` (0 without audio).
  const audioInputTokens =
    countAt(objectAt(usage, 'input_token_details'), 'audio_tokens') ?? countAt(objectAt(usage, 'prompt_tokens_details'), 'audio_tokens');
  return { inputTokens, outputTokens, cachedInputTokens, reasoningTokens, audioInputTokens };
}

/** OpenAI's text-to-speech returns audio; its billable unit is the input text. */
function usageFromRequest(ctx: MeterContext): UsageReport | null {
  if (!ctx.url.pathname.endsWith('/audio/speech')) return null;
  const input = stringAt(ctx.requestBody, 'input');
  if (input === undefined) return null;
  return withIdentity({ ...emptyUsage(), inputCharacters: [...input].length }, stringAt(ctx.requestBody, 'model') ?? null, null);
}

// ---- Streams --------------------------------------------------------------------------------

/** Typed stream events (Responses API, streaming transcription) that end the stream. */
const TERMINAL_EVENT_TYPES = new Set([
  'response.completed',
  'response.incomplete',
  'response.failed',
  'transcript.text.done',
]);

/** Once this many characters are put aside, the next event meters them: a long stream holds about this much at most. */
const MAX_ASIDE_CHARACTERS = 1024 * 1024;

/**
 * Meters a stream of the OpenAI format without parsing most of its events. Once the model and the
 * response id are known, a chat chunk without usage can change only the response time (the latest
 * wins) and the count of text after the last output count; a later chunk that reports an output
 * count and a time overrides both. So such chunks are put aside unparsed, and dropped when that
 * chunk comes (the usage chunk `include_usage` adds at the end); anything else (another event, or
 * the end of a stream that never reported usage) first meters them, in order, as if each had been
 * metered on arrival.
 */
function createOpenAIStreamMeter(ctx: MeterContext) {
  const aside: string[] = [];
  let asideCharacters = 0;
  const dropAside = () => {
    aside.length = 0;
    asideCharacters = 0;
  };
  const meterAside = (tally: UsageTally) => {
    for (const data of aside) meterEventData(data, tally);
    dropAside();
  };
  const onEvent = (event: SseEvent, tally: UsageTally) => {
    const { data } = event;
    if (asideCharacters < MAX_ASIDE_CHARACTERS && tally.knowsIdentity() && mayBePutAside(data)) {
      aside.push(data);
      asideCharacters += data.length;
      return;
    }
    // [DONE] only marks the stream complete, which nothing put aside can change.
    if (aside.length === 0 || data.trim() === '[DONE]') return meterEventData(data, tally);
    const chunk = parseJson(data);
    if (isObject(chunk) && overridesChunksBefore(chunk, ctx.now)) dropAside();
    else meterAside(tally);
    meterChunk(chunk, tally);
  };
  return createSseMeter(ctx, onEvent, modelFrom(ctx.requestBody, ctx.url), meterAside);
}

/** A chat chunk with no usage in it: an object, no `type` member, every `usage` null. */
function mayBePutAside(data: string): boolean {
  if (data.charCodeAt(0) !== 0x7b /* { */ || data.includes('"type"')) return false;
  for (let at = data.indexOf('"usage"'); at >= 0; at = data.indexOf('"usage"', at + 1)) {
    if (!data.startsWith('"usage":null', at)) return false;
  }
  return true;
}

/** A chat chunk that reports an output count and a believable time: what came before it no longer counts. */
function overridesChunksBefore(chunk: JsonObject, now: number): boolean {
  if (isTypedEvent(chunk)) return false;
  const usage = usageObjectOf(chunk);
  return usage !== undefined && tokensFromUsageObject(usage).outputTokens !== undefined && plausibleProviderMs(countAt(chunk, 'created'), now) !== undefined;
}

/** Meters one event's data on arrival: what the stream meter does, as if it put nothing aside. */
export function meterEventData(data: string, tally: UsageTally): void {
  if (data.trim() === '[DONE]') tally.markComplete();
  else meterChunk(parseJson(data), tally);
}

function meterChunk(chunk: unknown, tally: UsageTally): void {
  if (!isObject(chunk)) return;
  if (isTypedEvent(chunk)) meterTypedEvent(stringAt(chunk, 'type')!, chunk, tally);
  else meterChatChunk(chunk, tally);
}

/** A Responses API or transcription event (a `type`, no `choices`), not a chat chunk. */
function isTypedEvent(chunk: JsonObject): boolean {
  return stringAt(chunk, 'type') !== undefined && !Array.isArray(chunk.choices);
}

/** Responses API: text arrives in `*.delta` events, usage in `response.completed`. */
function meterTypedEvent(type: string, chunk: JsonObject, tally: UsageTally): void {
  const delta = stringAt(chunk, 'delta');
  if (type.endsWith('.delta') && delta !== undefined) tally.addOutputText(delta);
  const response = objectAt(chunk, 'response');
  tally.noteModel(stringAt(response, 'model'));
  tally.noteResponseId(stringAt(response, 'id'));
  tally.noteCompletedAt(responseTime(response));
  const usage = objectAt(response, 'usage') ?? objectAt(chunk, 'usage');
  if (usage) tally.report(tokensFromUsageObject(usage));
  if (TERMINAL_EVENT_TYPES.has(type)) tally.markComplete();
}

/** Chat and legacy completions: text in `choices[].delta` / `choices[].text`, usage at the end. */
function meterChatChunk(chunk: JsonObject, tally: UsageTally): void {
  tally.noteModel(stringAt(chunk, 'model'));
  tally.noteResponseId(stringAt(chunk, 'id'));
  tally.noteCompletedAt(countAt(chunk, 'created'));
  for (const choice of arrayAt(chunk, 'choices') ?? []) tally.addOutputText(choiceText(choice));
  // Text first, then usage: a chunk that carries both has its usage covering its own text.
  const usage = usageObjectOf(chunk);
  if (usage) tally.report(tokensFromUsageObject(usage));
}

/** Every generated string of one streamed choice: content, reasoning, refusals, tool arguments. */
function choiceText(choice: unknown): string {
  const delta = objectAt(choice, 'delta');
  // Concatenated as it goes: this runs for every chunk of every stream.
  let text = textOf(stringAt(choice, 'text')) + textOf(delta?.content) + textOf(delta?.reasoning_content) + textOf(delta?.reasoning) + textOf(delta?.refusal);
  for (const call of arrayAt(delta, 'tool_calls') ?? []) text += textOf(objectAt(call, 'function')?.arguments);
  return text;
}

/** Content is a string, or (Mistral, some reasoning models) a list of `{text}` parts. */
function textOf(value: unknown): string {
  if (typeof value === 'string') return value;
  if (!Array.isArray(value)) return '';
  return value.map((part) => (typeof part === 'string' ? part : (stringAt(part, 'text') ?? ''))).join('');
}

// ---- Asking for, and hiding, stream usage ---------------------------------------------------

/**
 * Chat and legacy completions only stream usage when asked to. The gateway asks on the client's
 * behalf (without touching the caller's object) and remembers that it did, so the relay can hide
 * the extra chunk from a client that never expected one.
 */
export function requestStreamUsage(body: unknown, url: URL): PreparedStreamRequest {
  if (!isObject(body) || body.stream !== true || !url.pathname.endsWith('/completions')) {
    return { body, injectedUsage: false };
  }
  const streamOptions = objectAt(body, 'stream_options');
  if (streamOptions?.include_usage === true) return { body, injectedUsage: false };
  // Copies, then set: `{ ...body, stream_options }` takes V8's slow path; the members keep their order.
  const withUsage: JsonObject = Object.assign({}, body);
  withUsage.stream_options = Object.assign({}, streamOptions, { include_usage: true });
  return { body: withUsage, injectedUsage: true };
}

const EMPTY_CHOICES = /"choices"\s*:\s*\[\s*\]/;

/** The usage-only chunk include_usage adds: empty `choices` and a `usage` object. */
export function isInjectedUsageChunk(event: SseEvent): boolean {
  // Cheap tests first: the relay calls this for every event of the stream, and once the gateway
  // asked for usage every chunk carries a `"usage":null`; only the usage chunk has empty choices.
  if (!event.data.includes('"usage"') || !EMPTY_CHOICES.test(event.data)) return false;
  const chunk = parseJson(event.data);
  return isObject(chunk) && Array.isArray(chunk.choices) && chunk.choices.length === 0 && isObject(chunk.usage);
}

/**
 * With include_usage on, OpenAI adds `"usage":null` to every chunk before the usage-only one. When
 * the gateway turned it on, a client that did not ask must not see that member either: it is cut
 * out of the event's text (with its comma), leaving every other byte as the provider sent it.
 * Only a `usage` member of the chunk object itself is removed, never one nested deeper.
 */
export function stripNullUsage(raw: string): string {
  // Every chunk of an OpenAI stream: one `data:` line ending in the member, then the blank line.
  if (raw.endsWith(TRAILING_NULL_USAGE_EVENT) && raw.startsWith('data:') && raw.indexOf('\n') === raw.length - 2) {
    return `${raw.slice(0, raw.length - TRAILING_NULL_USAGE_EVENT.length)}}\n\n`;
  }
  if (!raw.includes('"usage"')) return raw;
  // Lines at even places, each line end (CRLF, LF or a lone CR) kept at the odd place after it.
  const lines = raw.split(/(\r\n|\r|\n)/);
  let changed = false;
  for (let i = 0; i < lines.length; i += 2) {
    const line = lines[i]!;
    if (!line.startsWith('data:')) continue;
    const start = line.startsWith('data: ') ? 6 : 5;
    // OpenAI's own layout: the member comes last, right before the closing brace of the chunk.
    const stripped = line.endsWith(TRAILING_NULL_USAGE)
      ? `${line.slice(start, -TRAILING_NULL_USAGE.length)}}`
      : removeTopLevelNullUsage(line.slice(start));
    if (stripped !== null) {
      lines[i] = line.slice(0, start) + stripped;
      changed = true;
    }
  }
  return changed ? lines.join('') : raw;
}

const NULL_USAGE = /^"usage"\s*:\s*null\s*/;
const TRAILING_NULL_USAGE = ',"usage":null}';
const TRAILING_NULL_USAGE_EVENT = `${TRAILING_NULL_USAGE}\n\n`;

/** The JSON object text without its top-level `"usage": null` member, or null when it has none. */
function removeTopLevelNullUsage(json: string): string | null {
  let depth = 0;
  let inString = false;
  let lastComma = -1;
  for (let i = 0; i < json.length; i++) {
    const c = json.charCodeAt(i);
    if (inString) {
      if (c === 0x5c /* \ */) i++;
      else if (c === 0x22 /* " */) inString = false;
      continue;
    }
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) depth++;
    else if (c === 0x7d /* } */ || c === 0x5d /* ] */) depth--;
    else if (c === 0x2c /* , */ && depth === 1) lastComma = i;
    else if (c === 0x22) {
      if (depth === 1 && json.startsWith('"usage"', i)) {
        const match = NULL_USAGE.exec(json.slice(i));
        const end = match ? i + match[0].length : -1;
        const next = end >= 0 ? json[end] : undefined;
        if (match && (next === ',' || next === '}')) {
          // `…,"usage":null}` loses its leading comma; `{"usage":null,…` its trailing one.
          if (next === '}' && lastComma >= 0) return json.slice(0, lastComma) + json.slice(end);
          if (next === ',') return json.slice(0, i) + json.slice(end + 1).replace(/^\s*/, '');
          return json.slice(0, i) + json.slice(end);
        }
      }
      inString = true;
    }
  }
  return null;
}
