import { applyKey } from './auth.ts';
import { countAt, firstString, isObject, objectAt, parseJson, streamFlagSet, stringAt, type JsonObject } from './json.ts';
import { collapseDoubledVersion, routeFromBaseUrl } from './route.ts';
import { createSseMeter } from './sse.ts';
import { topLevelOutputCap } from './estimate.ts';
import { reportFromTokens, withIdentity, type ReportedTokens, type UsageTally } from './usage.ts';
import type { MeterContext, ProviderModule, SseEvent, StreamMeter, UsageReport } from './types.ts';

/**
 * Anthropic Messages API. Quirks kept here: the key goes in x-api-key (anthropic-version and
 * anthropic-beta are the client's and pass through untouched), and `input_tokens` EXCLUDES
 * prompt-cache reads and writes, so they are added back to fit the UsageReport convention.
 */
export const anthropic: ProviderModule = {
  id: 'anthropic',
  displayName: 'Anthropic',
  family: 'anthropic',
  baseUrl: 'https://api.anthropic.com/v1',
  ...routeFromBaseUrl('https://api.anthropic.com/v1'),
  authStyle: 'x-api-key',
  custom: false,
  applyAuth: (headers, key) => applyKey(headers, 'x-api-key', key),
  usageFromJson,
  usageFromRequest: () => null,
  createStreamMeter,
  modelFrom,
  responseId: (body) => stringAt(body, 'id') ?? null,
  // Anthropic streams always carry usage; nothing to ask for, nothing to hide.
  prepareStreamRequest: (body) => ({ body, injectedUsage: false }),
  isInjectedUsageEvent: () => false,
  // The client's paths start with /v1/, and so does the published client's Anthropic base URL.
  canonicalPath: (pathname) => collapseDoubledVersion(pathname, ['v1']),
  requestsStream: streamFlagSet,
  modelNames: /^claude-/,
  holdRules: {
    // max_tokens is required by the Messages API.
    outputCapFrom: topLevelOutputCap,
    maxOutputTokens: () => undefined,
    // An image counts (width × height) / 750 tokens after being resized to ~1.15 megapixels: ~1,600
    // at most. A PDF page counts its text and its page image (1,500–3,000 a page).
    media: { perImage: 1_600, perAudioSecond: 25, perVideoSecond: 300, perFileByte: 2 },
  },
};

function modelFrom(requestBody: unknown, _url: URL, responseBody?: unknown): string | null {
  return firstString(stringAt(responseBody, 'model'), stringAt(requestBody, 'model'));
}

/** Reads `usage` only, so count_tokens responses (a bare input_tokens) are not billed. */
function usageFromJson(body: unknown, ctx: MeterContext): UsageReport | null {
  const usage = objectAt(body, 'usage');
  if (!usage) return null;
  const report = reportFromTokens(normaliseUsage(usage));
  if (!report) return null;
  return withIdentity(report, modelFrom(ctx.requestBody, ctx.url, body), stringAt(body, 'id') ?? null);
}

/** Anthropic's counts, with cache reads and writes folded into the input total. */
function normaliseUsage(usage: JsonObject): ReportedTokens {
  const uncached = countAt(usage, 'input_tokens');
  const cacheRead = countAt(usage, 'cache_read_input_tokens');
  const cacheWrite = countAt(usage, 'cache_creation_input_tokens');
  const inputTokens = uncached === undefined ? undefined : uncached + (cacheRead ?? 0) + (cacheWrite ?? 0);
  return {
    inputTokens,
    outputTokens: countAt(usage, 'output_tokens'),
    cachedInputTokens: cacheRead,
    cacheWriteInputTokens: cacheWrite,
  };
}

/**
 * message_start carries input and cache counts, message_delta the running output count (and, in
 * newer API versions, input counts again); message_stop ends the stream. The raw fields are merged
 * before normalising, because a message_delta may repeat some of them and not others.
 */
function createStreamMeter(ctx: MeterContext): StreamMeter {
  const rawUsage: JsonObject = {};
  return createSseMeter(
    ctx,
    (event, tally) => meterAnthropicEvent(event, tally, rawUsage),
    modelFrom(ctx.requestBody, ctx.url),
  );
}

function meterAnthropicEvent(event: SseEvent, tally: UsageTally, rawUsage: JsonObject): void {
  const data = parseJson(event.data);
  if (!isObject(data)) return;
  // `type` in the data repeats the SSE event name; it also works when a proxy dropped `event:`.
  switch (stringAt(data, 'type')) {
    case 'message_start': {
      const message = objectAt(data, 'message');
      tally.noteModel(stringAt(message, 'model'));
      tally.noteResponseId(stringAt(message, 'id'));
      mergeUsage(rawUsage, objectAt(message, 'usage'), tally);
      break;
    }
    case 'content_block_delta':
      tally.addOutputText(deltaText(objectAt(data, 'delta')));
      break;
    case 'message_delta':
      mergeUsage(rawUsage, objectAt(data, 'usage'), tally);
      break;
    case 'message_stop':
      tally.markComplete();
      break;
  }
}

function mergeUsage(rawUsage: JsonObject, usage: JsonObject | undefined, tally: UsageTally): void {
  if (!usage) return;
  for (const [key, value] of Object.entries(usage)) if (value !== null) rawUsage[key] = value;
  const tokens = normaliseUsage(rawUsage);
  // Only a count present in THIS event resets the "text after the last output count" estimate.
  tally.report({
    inputTokens: tokens.inputTokens,
    outputTokens: countAt(usage, 'output_tokens'),
    cachedInputTokens: tokens.cachedInputTokens,
    cacheWriteInputTokens: tokens.cacheWriteInputTokens,
  });
}

/** Text, tool-input JSON and thinking deltas all become output tokens. */
function deltaText(delta: JsonObject | undefined): string {
  return stringAt(delta, 'text') ?? stringAt(delta, 'partial_json') ?? stringAt(delta, 'thinking') ?? '';
}
