import { estimateInputTokensFromRequest, estimateTokensFromCharacters } from './estimate.ts';
import type { MeterContext, StreamUsage, UsageReport } from './types.ts';

/** Zero usage, the starting point every module fills in. */
export function emptyUsage(): UsageReport {
  return {
    inputTokens: 0,
    outputTokens: 0,
    inputCharacters: 0,
    outputCharacters: 0,
    inputSeconds: 0,
    outputSeconds: 0,
  };
}

/** Token counts as a provider reported them so far; absent = not reported (yet). */
export type ReportedTokens = {
  inputTokens?: number | undefined;
  outputTokens?: number | undefined;
  cachedInputTokens?: number | undefined;
  cacheWriteInputTokens?: number | undefined;
  reasoningTokens?: number | undefined;
  audioInputTokens?: number | undefined;
};

/** A usage report from reported token counts; null when the provider reported neither direction. */
export function reportFromTokens(tokens: ReportedTokens): UsageReport | null {
  if (tokens.inputTokens === undefined && tokens.outputTokens === undefined) return null;
  const report = emptyUsage();
  report.inputTokens = tokens.inputTokens ?? 0;
  report.outputTokens = tokens.outputTokens ?? 0;
  if (tokens.cachedInputTokens !== undefined) report.cachedInputTokens = tokens.cachedInputTokens;
  if (tokens.cacheWriteInputTokens !== undefined) report.cacheWriteInputTokens = tokens.cacheWriteInputTokens;
  if (tokens.reasoningTokens !== undefined) report.reasoningTokens = tokens.reasoningTokens;
  if (tokens.audioInputTokens !== undefined) report.audioInputTokens = tokens.audioInputTokens;
  return report;
}

/**
 * The per-stream state every stream meter keeps: the provider's latest counts, how much output
 * text arrived after the latest output count, and whether the end marker was seen. It never keeps
 * the text itself, only its length, so metering costs no memory per token.
 */
export type UsageTally = {
  /** Merges a report; a report with an output count covers all text seen so far. */
  report(tokens: ReportedTokens): void;
  addOutputText(text: string): void;
  noteModel(model: string | undefined): void;
  noteResponseId(id: string | undefined): void;
  /** The provider's own time for the response, Unix seconds; the latest one reported wins. */
  noteCompletedAt(unixSeconds: number | undefined): void;
  markComplete(): void;
  /** True once a model and a response id were noted: later events cannot change either. */
  knowsIdentity(): boolean;
  result(): StreamUsage;
};

export function createUsageTally(ctx: MeterContext): UsageTally {
  const reported: ReportedTokens = {};
  let charactersAfterLastOutputCount = 0;
  let complete = false;
  let model: string | undefined;
  let responseId: string | undefined;
  /** Kept as milliseconds and written out once: streams report it in every chunk. */
  let completedAtMs: number | undefined;

  return {
    report(tokens) {
      for (const key of Object.keys(tokens) as (keyof ReportedTokens)[]) {
        if (tokens[key] !== undefined) reported[key] = tokens[key];
      }
      if (tokens.outputTokens !== undefined) charactersAfterLastOutputCount = 0;
    },
    addOutputText(text) {
      charactersAfterLastOutputCount += text.length;
    },
    noteModel(value) {
      model ??= value || undefined;
    },
    noteResponseId(value) {
      responseId ??= value || undefined;
    },
    noteCompletedAt(value) {
      completedAtMs = plausibleProviderMs(value, ctx.now) ?? completedAtMs;
    },
    markComplete() {
      complete = true;
    },
    knowsIdentity() {
      return model !== undefined && responseId !== undefined;
    },
    result() {
      const usage = buildStreamUsage({ ctx, reported, charactersAfterLastOutputCount, complete, model, responseId });
      if (completedAtMs !== undefined) usage.completedAt = new Date(completedAtMs).toISOString();
      return usage;
    },
  };
}

type TallyState = {
  ctx: MeterContext;
  reported: ReportedTokens;
  charactersAfterLastOutputCount: number;
  complete: boolean;
  model: string | undefined;
  responseId: string | undefined;
};

/**
 * A complete stream is billed from the provider's counts. A cut stream keeps every count the
 * provider did send and adds an estimate only for what came after it; a count that never came
 * (input of an OpenAI stream, say) is estimated from the request body.
 */
function buildStreamUsage(state: TallyState): StreamUsage {
  const { reported, complete } = state;
  const outputEstimated =
    reported.outputTokens === undefined || (!complete && state.charactersAfterLastOutputCount > 0);
  const outputTokens = outputEstimated
    ? (reported.outputTokens ?? 0) + estimateTokensFromCharacters(state.charactersAfterLastOutputCount)
    : (reported.outputTokens ?? 0);
  const inputEstimated = reported.inputTokens === undefined;
  const inputTokens = reported.inputTokens ?? estimateInputTokensFromRequest(state.ctx.requestBody);

  const usage: StreamUsage = {
    inputTokens,
    outputTokens,
    inputCharacters: 0,
    outputCharacters: 0,
    inputSeconds: 0,
    outputSeconds: 0,
    complete,
    estimated: outputEstimated || inputEstimated,
  };
  if (reported.cachedInputTokens !== undefined) usage.cachedInputTokens = reported.cachedInputTokens;
  if (reported.cacheWriteInputTokens !== undefined) usage.cacheWriteInputTokens = reported.cacheWriteInputTokens;
  if (reported.reasoningTokens !== undefined) usage.reasoningTokens = reported.reasoningTokens;
  if (reported.audioInputTokens !== undefined) usage.audioInputTokens = reported.audioInputTokens;
  if (state.model !== undefined) usage.model = state.model;
  if (state.responseId !== undefined) usage.responseId = state.responseId;
  return usage;
}

/** The earliest and latest provider times believed: a clock far off is not written on a record. */
const EARLIEST_PROVIDER_TIME_MS = Date.UTC(2015, 0, 1);
const PROVIDER_CLOCK_SKEW_MS = 24 * 60 * 60 * 1000;

/** A provider's Unix-seconds time as ISO 8601; undefined when absent or implausible. */
export function timestampFromUnixSeconds(seconds: number | undefined, now: number): string | undefined {
  const ms = plausibleProviderMs(seconds, now);
  return ms === undefined ? undefined : new Date(ms).toISOString();
}

/** A provider's Unix-seconds time in milliseconds; undefined when absent or implausible. */
export function plausibleProviderMs(seconds: number | undefined, now: number): number | undefined {
  if (seconds === undefined || !Number.isFinite(seconds)) return undefined;
  const ms = Math.round(seconds * 1000);
  if (ms < EARLIEST_PROVIDER_TIME_MS || ms > now + PROVIDER_CLOCK_SKEW_MS) return undefined;
  return ms;
}

/** Adds model and response id to a report, when known. */
export function withIdentity(usage: UsageReport, model: string | null, responseId: string | null): UsageReport {
  if (model) usage.model = model;
  if (responseId) usage.responseId = responseId;
  return usage;
}
