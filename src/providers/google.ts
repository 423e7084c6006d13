import { applyKey } from './auth.ts';
import { arrayAt, countAt, firstString, isObject, objectAt, parseJson, stringAt, type JsonObject } from './json.ts';
import { collapseDoubledVersion, routeFromBaseUrl } from './route.ts';
import { createSseMeter } from './sse.ts';
import { tokenCount } from './estimate.ts';
import { reportFromTokens, withIdentity, type ReportedTokens, type UsageTally } from './usage.ts';
import type { MeterContext, ProviderModule, SseEvent, UsageReport } from './types.ts';

/**
 * Gemini native API (generativelanguage.googleapis.com). Quirks kept here: the model is named in
 * the URL (`models/<model>:generateContent`), usage is `usageMetadata`, and thinking tokens are
 * reported apart from candidate tokens although both are billed as output.
 *
 * It claims the whole host (every API version, uploads included); the OpenAI-compatible path
 * /v1beta/openai is claimed by the more specific `google-openai` provider.
 */
export const google: ProviderModule = {
  id: 'google',
  displayName: 'Google Gemini',
  family: 'google',
  baseUrl: 'https://generativelanguage.googleapis.com/v1beta',
  ...routeFromBaseUrl('https://generativelanguage.googleapis.com/v1beta', ['/']),
  authStyle: 'x-goog-api-key',
  custom: false,
  applyAuth: (headers, key) => applyKey(headers, 'x-goog-api-key', key),
  usageFromJson,
  usageFromRequest: () => null,
  createStreamMeter: (ctx) => createSseMeter(ctx, meterGeminiEvent, modelFrom(ctx.requestBody, ctx.url)),
  modelFrom,
  responseId: (body) => stringAt(lastUsageCarrier(body), 'responseId') ?? null,
  // Gemini streams (`:streamGenerateContent?alt=sse`) always carry usageMetadata.
  prepareStreamRequest: (body) => ({ body, injectedUsage: false }),
  isInjectedUsageEvent: () => false,
  // @google/genai appends /<apiVersion>/models/… to its base URL, whose published form ends in /v1beta.
  canonicalPath: (pathname) => collapseDoubledVersion(pathname, GEMINI_API_VERSIONS),
  // The method says it, not the body: `:streamGenerateContent` streams (SSE with alt=sse, else a JSON array).
  requestsStream: (_body, url) => url.pathname.endsWith(':streamGenerateContent'),
  holdRules: {
    outputCapFrom: (body) => tokenCount(objectAt(body, 'generationConfig')?.maxOutputTokens),
    maxOutputTokens: geminiMaxOutputTokens,
    // 258 tokens per 768 × 768 tile (or per image at media resolution high, up to 1,120): a 4K
    // image tiles into 15. Audio 32 tokens a second; video 263 (frames) + 32 (sound); a PDF page 258.
    media: { perImage: 4_000, perAudioSecond: 32, perVideoSecond: 300, perFileByte: 1 },
    // Cached content is counted as input of every request that names it.
    contextReferences: (body) => {
      const name = cachedContentOf(body);
      return name ? [`google:cachedContent:${name}`] : [];
    },
  },
};

/** The cached content a request names (`cachedContent`, or `cached_content` in REST's snake case). */
function cachedContentOf(body: unknown): string | undefined {
  if (typeof body !== 'object' || body === null) return undefined;
  const { cachedContent, cached_content: snake } = body as Record<string, unknown>;
  const name = cachedContent ?? snake;
  return typeof name === 'string' && name.length > 0 ? name : undefined;
}

/** Gemini 2.5 and later produce up to 65,536 output tokens, earlier models 8,192. */
function geminiMaxOutputTokens(model: string | null): number | undefined {
  if (!model) return undefined;
  if (/^gemini-(1\.|2\.0)/.test(model)) return 8_192;
  return /^gemini-/.test(model) ? 65_536 : undefined;
}

const GEMINI_API_VERSIONS = ['v1', 'v1beta', 'v1alpha'] as const;

/** `modelVersion` of the response when given, else the model named in the URL path. */
function modelFrom(_requestBody: unknown, url: URL, responseBody?: unknown): string | null {
  return firstString(stringAt(lastUsageCarrier(responseBody), 'modelVersion'), modelFromPath(url.pathname) ?? undefined);
}

/** `/v1beta/models/gemini-2.5-flash:generateContent` → `gemini-2.5-flash`. */
export function modelFromPath(pathname: string): string | null {
  const match = /\/(?:tunedModels|models)\/([^/:]+)(?::[^/]*)?$/.exec(pathname);
  if (!match?.[1]) return null;
  try {
    return decodeURIComponent(match[1]);
  } catch {
    return match[1];
  }
}

/**
 * A plain `:streamGenerateContent` (without alt=sse) answers with a JSON array of responses; the
 * last one carrying usageMetadata has the final counts.
 */
function lastUsageCarrier(body: unknown): unknown {
  if (!Array.isArray(body)) return body;
  for (let i = body.length - 1; i >= 0; i--) if (objectAt(body[i], 'usageMetadata')) return body[i];
  return body[body.length - 1];
}

function usageFromJson(body: unknown, ctx: MeterContext): UsageReport | null {
  const carrier = lastUsageCarrier(body);
  const metadata = objectAt(carrier, 'usageMetadata');
  if (!metadata) return null;
  const report = reportFromTokens(tokensFromMetadata(metadata));
  if (!report) return null;
  return withIdentity(report, modelFrom(ctx.requestBody, ctx.url, body), stringAt(carrier, 'responseId') ?? null);
}

/**
 * promptTokenCount already includes cached content; tool-use prompt tokens are extra input;
 * thoughtsTokenCount is extra output (candidatesTokenCount excludes it).
 */
function tokensFromMetadata(metadata: JsonObject): ReportedTokens {
  return {
    inputTokens: sumOfPresent(countAt(metadata, 'promptTokenCount'), countAt(metadata, 'toolUsePromptTokenCount')),
    outputTokens: sumOfPresent(countAt(metadata, 'candidatesTokenCount'), countAt(metadata, 'thoughtsTokenCount')),
    cachedInputTokens: countAt(metadata, 'cachedContentTokenCount'),
    reasoningTokens: countAt(metadata, 'thoughtsTokenCount'),
    audioInputTokens: audioPromptTokens(metadata),
  };
}

/** The prompt's audio tokens, from `promptTokensDetails: [{modality: "AUDIO", tokenCount}]`; undefined when not broken down. */
function audioPromptTokens(metadata: JsonObject): number | undefined {
  const details = arrayAt(metadata, 'promptTokensDetails');
  if (!details) return undefined;
  const audio = details.find((detail) => stringAt(detail, 'modality') === 'AUDIO');
  return audio === undefined ? 0 : countAt(audio, 'tokenCount');
}

/** Sum of the counts that are present; undefined when none is. */
function sumOfPresent(...counts: (number | undefined)[]): number | undefined {
  const present = counts.filter((count): count is number => count !== undefined);
  return present.length === 0 ? undefined : present.reduce((sum, count) => sum + count, 0);
}

/** Every event is a whole GenerateContentResponse; the last usageMetadata seen is the total. */
function meterGeminiEvent(event: SseEvent, tally: UsageTally): void {
  const chunk = parseJson(event.data);
  if (!isObject(chunk)) return;
  tally.noteModel(stringAt(chunk, 'modelVersion'));
  tally.noteResponseId(stringAt(chunk, 'responseId'));
  const candidates = arrayAt(chunk, 'candidates') ?? [];
  for (const candidate of candidates) tally.addOutputText(candidateText(candidate));
  const metadata = objectAt(chunk, 'usageMetadata');
  if (metadata) tally.report(tokensFromMetadata(metadata));
  if (isFinalChunk(chunk, candidates)) tally.markComplete();
}

/** A finishReason ends a candidate; a blocked prompt ends the stream with no candidate at all. */
function isFinalChunk(chunk: JsonObject, candidates: unknown[]): boolean {
  if (stringAt(objectAt(chunk, 'promptFeedback'), 'blockReason')) return true;
  return candidates.some((candidate) => Boolean(stringAt(candidate, 'finishReason')));
}

/** Text parts (thoughts included) and function-call arguments. */
function candidateText(candidate: unknown): string {
  const parts = arrayAt(objectAt(candidate, 'content'), 'parts') ?? [];
  return parts
    .map((part) => {
      const text = stringAt(part, 'text');
      if (text !== undefined) return text;
      const call = objectAt(part, 'functionCall');
      return call ? JSON.stringify(call.args ?? {}) : '';
    })
    .join('');
}
