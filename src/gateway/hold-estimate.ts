/**
 * What to hold before forwarding: an upper bound of what the request can cost (decision 0019).
 * Pure.
 *
 * Input tokens: the UTF-8 bytes of the body without its inline media (inputTokenBound), plus what
 * its media can count for by the provider's rules (images at the provider's per-image maximum,
 * audio and video by the longest duration their bytes can hold, documents by size; audio, video
 * and documents named by reference at the operator's allowance, MEDIA_REFERENCE_HOLD_TOKENS), plus
 * the provider-side context it names (a previous response, cached content: decision 0025). Output tokens:
 * the request's own cap where its provider puts it, else its model's maximum output when known,
 * else DEFAULT_MAX_OUTPUT_TOKENS. The estimate is priced with the same pricing code as the real
 * charge, at the meter's first-tier position, so a request that cannot pay for its bound is refused
 * before any provider is called.
 */
import { DEFAULT_HOLD_RULES, estimateInputTokensFromRequest, mediaInputTokens } from '../providers/estimate.ts';
import type { HoldRules } from '../providers/types.ts';
import { estimatedChargeOf, type EstimatedCharge } from '../ledger/settlement/recover.ts';
import { baseCost, priceRequest, type BasePrices, type MeterPricing, type Usage } from '../domain/pricing.ts';

const DEFAULT_OUTPUT_CAP = 4096;

/** The output tokens held for: the request's cap, else the model's maximum, else the operator's default. */
function outputCapOf(body: unknown, rules: HoldRules, model: string | null, fallback = DEFAULT_OUTPUT_CAP): number {
  return rules.outputCapFrom(body) ?? rules.maxOutputTokens(model) ?? fallback;
}

/** Characters a text-to-speech request will be billed for. */
function inputCharactersOf(body: unknown): number {
  if (typeof body !== 'object' || body === null) return 0;
  const { text, input } = body as Record<string, unknown>;
  return typeof text === 'string' ? text.length : typeof input === 'string' ? input.length : 0;
}

/** Members holding inline media (base64), billed as image or audio tokens rather than as text bytes. */
const MEDIA_KEYS = new Set(['data', 'file_data']);
/** A media key, or a string starting with `data:`, as JSON text shows them. */
const MAY_HOLD_MEDIA = /"(?:file_)?data"|"data:/;

/**
 * An upper bound on a JSON request's text input tokens: the UTF-8 bytes of the body without its
 * inline media (a byte-level tokenizer never makes more tokens than bytes, and the JSON around
 * each message outweighs a chat template's per-message tokens). Undefined for a body that is not
 * JSON: nothing is known about it.
 */
function inputTokenBound(requestJson: unknown): number | undefined {
  if (typeof requestJson !== 'object' || requestJson === null) return undefined;
  // Most bodies carry no media: written plainly (no replacer called back for every value) they
  // are the same text, and a media key or a data: URL shows in it.
  const plain = JSON.stringify(requestJson);
  if (!MAY_HOLD_MEDIA.test(plain)) return Buffer.byteLength(plain, 'utf8');
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
  /** Input tokens held for each audio, video or document named by reference (MEDIA_REFERENCE_HOLD_TOKENS). */
  referenceTokens?: number;
  /** Input tokens of provider-side context the request names (ProviderContextSizes; decision 0025). */
  contextTokens?: number;
  /** The provider's rules (ProviderModule.holdRules); the OpenAI shapes' when absent. */
  rules?: HoldRules;
  model?: string | null;
}): HoldEstimate {
  const rules = input.rules ?? DEFAULT_HOLD_RULES;
  const textTokens = Math.max(estimateInputTokensFromRequest(input.requestBody), inputTokenBound(input.requestBody) ?? 0);
  const usage: Usage = {
    inputTokens: textTokens + mediaInputTokens(input.requestBody, rules.media, input.referenceTokens) + (input.contextTokens ?? 0),
    outputTokens: outputCapOf(input.requestBody, rules, input.model ?? modelOf(input.requestBody), input.defaultOutputCap),
    inputCharacters: inputCharactersOf(input.requestBody),
    outputCharacters: 0,
    inputSeconds: '0',
    outputSeconds: '0',
  };
  const base = input.prices ? baseCost(input.prices, usage) : { input: 0n, output: 0n, total: 0n };
  const priced = priceRequest({
    meter: atHighestTierRate(input.pricing),
    usage,
    baseCost: base,
    accumulatedUnits: 0n,
    serviceChargeRate: input.serviceChargeRate,
    baseCostCharged: input.baseCostCharged,
  });
  return { wallet: priced.totals.wallet, merchant: priced.totals.merchant, charge: estimatedChargeOf(usage, priced) };
}

const highestRateMeters = new WeakMap<MeterPricing, MeterPricing>();

/**
 * The meter as a hold prices it: every unit at its highest tier rate. Where a request falls in its
 * tiers is known only when it settles (others settle first), and with rates that rise with use a
 * first-tier price would be less than the request can cost; with falling rates, the usual, the
 * highest is the first tier's and only a request crossing into a cheaper tier is held for more.
 */
function atHighestTierRate(meter: MeterPricing): MeterPricing {
  if (meter.tiers.length <= 1) return meter;
  let flat = highestRateMeters.get(meter);
  if (!flat) {
    const rate = meter.tiers.reduce((highest, tier) => (tier.rate > highest ? tier.rate : highest), 0n);
    flat = { ...meter, tiers: [{ start: 0, rate }] };
    highestRateMeters.set(meter, flat);
  }
  return flat;
}

/** The `model` member of a JSON body, when the caller did not say which model is served. */
function modelOf(body: unknown): string | null {
  const model = typeof body === 'object' && body !== null ? (body as { model?: unknown }).model : undefined;
  return typeof model === 'string' ? model : null;
}
