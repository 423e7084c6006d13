/**
 * What to hold before forwarding: the most the request can plausibly cost. Pure.
 *
 * Input tokens are estimated from the prompt text; output tokens are the request's own cap
 * (max_tokens and its cousins) or a default. The estimate is priced with the same pricing code
 * as the real charge, at the meter's first-tier position, so a request that cannot pay for its
 * own cap is refused before any provider is called.
 */
import { estimateInputTokensFromRequest } from '../providers/estimate.ts';
import { estimatedChargeOf, type EstimatedCharge } from '../ledger/settlement/recover.ts';
import { baseCost, priceRequest, type BasePrices, type MeterPricing, type Usage } from '../domain/pricing.ts';

export const DEFAULT_OUTPUT_CAP = 4096;

const OUTPUT_CAP_FIELDS = ['max_tokens', 'max_completion_tokens', 'max_output_tokens'] as const;

/** The output-token cap the request sets, wherever its provider puts it. */
export function outputCapOf(body: unknown, fallback = DEFAULT_OUTPUT_CAP): number {
  if (typeof body !== 'object' || body === null) return fallback;
  const record = body as Record<string, unknown>;
  for (const field of OUTPUT_CAP_FIELDS) {
    const value = record[field];
    if (typeof value === 'number' && Number.isSafeInteger(value) && value > 0) return value;
  }
  const gemini = (record.generationConfig as Record<string, unknown> | undefined)?.maxOutputTokens;
  if (typeof gemini === 'number' && Number.isSafeInteger(gemini) && gemini > 0) return gemini;
  return fallback;
}

/** Characters a text-to-speech request will be billed for. */
function inputCharactersOf(body: unknown): number {
  if (typeof body !== 'object' || body === null) return 0;
  const { text, input } = body as Record<string, unknown>;
  return typeof text === 'string' ? text.length : typeof input === 'string' ? input.length : 0;
}

/** Members holding inline media (base64), billed as image or audio tokens rather than as text bytes. */
const MEDIA_KEYS = new Set(['data', 'file_data']);

/**
 * An upper bound on a JSON request's text input tokens: the UTF-8 bytes of the body without its
 * inline media (a byte-level tokenizer never makes more tokens than bytes, and the JSON around
 * each message outweighs a chat template's per-message tokens). Undefined for a body that is not
 * JSON: nothing is known about it.
 */
export function inputTokenBound(requestJson: unknown): number | undefined {
  if (typeof requestJson !== 'object' || requestJson === null) return undefined;
  const text = JSON.stringify(requestJson, (key, value: unknown) =>
    MEDIA_KEYS.has(key) || (typeof value === 'string' && value.startsWith('data:')) ? undefined : value,
  );
  return Buffer.byteLength(text, 'utf8');
}

/** The hold's parts, and what they were priced from (kept on the pending record for crash recovery). */
export type HoldEstimate = { wallet: bigint; merchant: bigint; charge: EstimatedCharge };

export function estimateHold(input: {
  requestBody: unknown;
  pricing: MeterPricing;
  prices: BasePrices | null;
  baseCostCharged: boolean;
  serviceChargeRate: bigint;
  defaultOutputCap?: number;
  /** An upper bound on input tokens (inputTokenBound) to hold for instead of the estimate. */
  inputTokensAtMost?: number | undefined;
}): HoldEstimate {
  const usage: Usage = {
    inputTokens: Math.max(estimateInputTokensFromRequest(input.requestBody), input.inputTokensAtMost ?? 0),
    outputTokens: outputCapOf(input.requestBody, input.defaultOutputCap),
    inputCharacters: inputCharactersOf(input.requestBody),
    outputCharacters: 0,
    inputSeconds: '0',
    outputSeconds: '0',
  };
  const base = input.prices ? baseCost(input.prices, usage) : { input: 0n, output: 0n, total: 0n };
  const priced = priceRequest({
    meter: input.pricing,
    usage,
    baseCost: base,
    accumulatedUnits: 0n,
    serviceChargeRate: input.serviceChargeRate,
    baseCostCharged: input.baseCostCharged,
  });
  return { wallet: priced.totals.wallet, merchant: priced.totals.merchant, charge: estimatedChargeOf(usage, priced) };
}
