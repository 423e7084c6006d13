/**
 * Base prices per (provider, model): the operator's override table first, then the maintained
 * @pydantic/genai-prices catalog (a maintained table: prices are never copied by hand). Pure lookups over bundled
 * data; nothing is fetched. Prices come out as bigint units per 1M tokens, converted from the
 * catalog's numbers through their decimal text, never by float multiplication.
 */
import { calcPrice } from '@pydantic/genai-prices';
import { UNIT, divRoundHalfUp, parseMoney } from './money.ts';
import { decimalToInteger, type BasePrices } from './pricing.ts';

/**
 * Operator override: decimal prices per 1M tokens, e.g. { input: "2.50", output: "10" }, and for
 * media models per minute of audio, per image generated or per 1M characters spoken (e.g.
 * { perMinute: "0.006" }). Token prices absent from an override that gives a media price are 0.
 */
export interface PriceOverride {
  input?: string;
  output?: string;
  cachedInput?: string;
  cacheWriteInput?: string;
  audioInput?: string;
  perMinute?: string;
  perImage?: string;
  perMillionCharacters?: string;
}

const OPTIONAL_PRICES = ['cachedInput', 'cacheWriteInput', 'audioInput', 'perMinute', 'perImage', 'perMillionCharacters'] as const;
const MEDIA_PRICES = ['perMinute', 'perImage', 'perMillionCharacters'] as const;

/** Raw override map, keyed "provider/model" (model ids may themselves contain "/"). */
export type PriceOverrides = Readonly<Record<string, PriceOverride>>;

/** Validated overrides, keyed by the normalized "provider/model". */
export type PriceOverrideTable = ReadonlyMap<string, BasePrices>;

export interface PriceLookupOptions {
  overrides?: PriceOverrideTable;
  /**
   * The request's total input tokens. Some catalog prices are tiered by prompt size (e.g. long
   * context); the whole request then pays the tier whose start its input exceeds. Default 0.
   */
  inputTokens?: number;
  /** When the request happened, for prices that changed over time. Default: now. */
  at?: Date;
  /**
   * The provider whose account this one is another API of (Gemini's OpenAI-compatible path is
   * Google's): the operator's overrides for that provider's models apply here too, after any
   * override named for this provider itself.
   */
  account?: string;
  /** The provider's own prices for models the catalog does not know (the demo's), after the overrides. */
  ownPrices?: ((model: string) => BasePrices | null) | undefined;
}

const PRICE_TEXT = /^\d+(?:\.\d{1,10})?$/;

/**
 * Validates and converts the operator's override map once (at configuration load), so that a typo
 * fails at startup rather than on a request. Throws RangeError naming the bad entry.
 */
export function parsePriceOverrides(raw: PriceOverrides): PriceOverrideTable {
  const table = new Map<string, BasePrices>();
  for (const [key, override] of Object.entries(raw)) {
    const slash = key.indexOf('/');
    if (slash <= 0 || slash === key.length - 1) throw new RangeError(`price override "${key}": key must be "provider/model"`);
    // A media model's override may name its media price alone; a token model's names both token prices.
    const tokensOptional = MEDIA_PRICES.some((field) => override[field] !== undefined);
    const prices: BasePrices = {
      input: tokensOptional && override.input === undefined ? 0n : overridePrice(key, 'input', override.input),
      output: tokensOptional && override.output === undefined ? 0n : overridePrice(key, 'output', override.output),
    };
    for (const field of OPTIONAL_PRICES) {
      const text = override[field];
      if (text !== undefined) prices[field] = overridePrice(key, field, text);
    }
    table.set(priceKey(key.slice(0, slash), key.slice(slash + 1)), prices);
  }
  return table;
}

/**
 * Prices for (provider, model): the override when there is one (whole, never mixed with the
 * catalog), else the provider's own, else the catalog's, else null (unknown: base cost is then 0).
 */
export function lookupBasePrices(provider: string, model: string, options: PriceLookupOptions = {}): BasePrices | null {
  const { overrides, account } = options;
  return (
    overrides?.get(priceKey(provider, model)) ??
    (account === undefined ? undefined : overrides?.get(priceKey(account, model))) ??
    options.ownPrices?.(model) ??
    catalogPrices(provider, model, options)
  );
}

/** Catalog prices only, or null when the catalog does not price this model's tokens. */
export function catalogPrices(provider: string, model: string, options: Omit<PriceLookupOptions, 'overrides'> = {}): BasePrices | null {
  const inputTokens = options.inputTokens ?? 0;
  // calcPrice is the catalog's own resolver (provider aliases, model matching, dated prices);
  // the usage passed is only there to make it resolve, its computed float prices are ignored.
  const found = calcPrice({ input_tokens: inputTokens }, model, { providerId: provider, timestamp: options.at });
  if (!found) return null;
  const input = catalogPrice(found.model_price.input_mtok, inputTokens);
  const output = catalogPrice(found.model_price.output_mtok, inputTokens);
  const perMinute = perMinuteOf(found.model_price.audio_hours ?? found.model_price.input_audio_hours);
  if (input === null && output === null && perMinute === null) return null; // priced per request, image, … — by nothing we count
  const prices: BasePrices = { input: input ?? 0n, output: output ?? 0n };
  if (perMinute !== null) prices.perMinute = perMinute;
  const cachedInput = catalogPrice(found.model_price.cache_read_mtok, inputTokens);
  if (cachedInput !== null) prices.cachedInput = cachedInput;
  // The 5-minute write price: Anthropic reports 1-hour writes only inside a breakdown we do not read.
  const cacheWriteInput = catalogPrice(found.model_price.cache_write_mtok, inputTokens);
  if (cacheWriteInput !== null) prices.cacheWriteInput = cacheWriteInput;
  const audioInput = catalogPrice(found.model_price.input_audio_mtok, inputTokens);
  if (audioInput !== null) prices.audioInput = audioInput;
  return prices;
}

/** Normalized override key: the catalog matches case-insensitively, so overrides do too. */
function priceKey(provider: string, model: string): string {
  return `${provider.trim().toLowerCase()}/${model.trim().toLowerCase()}`;
}

function overridePrice(key: string, field: string, text: unknown): bigint {
  if (typeof text !== 'string' || !PRICE_TEXT.test(text.trim())) {
    throw new RangeError(`price override "${key}": ${field} must be a decimal string with at most 10 fractional digits`);
  }
  return parseMoney(text.trim());
}

interface CatalogTiers {
  base: number;
  tiers: { start: number; price: number }[];
}

/** A catalog price (plain or tiered by prompt size) in units per 1M tokens, or null if absent. */
function catalogPrice(price: unknown, inputTokens: number): bigint | null {
  if (price === undefined) return null;
  const perMillion = typeof price === 'number' ? price : tierPrice(price, inputTokens);
  // Half-up beyond 10 places: a per-1M price that fine is below any billable amount.
  return decimalToInteger(perMillion, UNIT, 'halfUp');
}

/** The catalog's price per hour of audio (whisper-1), per minute in units; null when it has none. */
function perMinuteOf(perHour: unknown): bigint | null {
  if (typeof perHour !== 'number') return null;
  return divRoundHalfUp(decimalToInteger(perHour, UNIT, 'halfUp'), 60n);
}

/** The catalog's own rule: the last tier whose start the request's input tokens exceed, else base. */
function tierPrice(price: unknown, inputTokens: number): number {
  if (!isCatalogTiers(price)) throw new TypeError(`unrecognized catalog price ${JSON.stringify(price)}`);
  const tiers = [...price.tiers].sort((a, b) => a.start - b.start);
  return tiers.filter((tier) => inputTokens > tier.start).at(-1)?.price ?? price.base;
}

function isCatalogTiers(value: unknown): value is CatalogTiers {
  if (typeof value !== 'object' || value === null) return false;
  const candidate = value as Partial<CatalogTiers>;
  return typeof candidate.base === 'number' && Array.isArray(candidate.tiers);
}
