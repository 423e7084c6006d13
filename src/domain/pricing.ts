/**
 * Pricing: turns one request's usage into money, exactly (rules in docs/decisions/0002-pricing.md).
 *
 * Pure: no I/O, no clock. Money is a bigint count of 1e-10 units (money.ts). Counts (tokens,
 * characters) are integers; durations arrive as decimal-second strings and are handled as integer
 * microseconds, so every quantity here is an integer and every division is a single, explicit
 * half-up rounding. See docs/decisions/0002-pricing.md for the unit and rounding choices.
 */
import { UNIT, divRoundHalfUp } from './money.ts';

export type RateType = 'fixed' | 'percentage';
export type TierType = 'tokens_1m' | 'characters_1m' | 'minutes' | 'requests';
export type TokenBasis = 'input+output' | 'output';
export type Payer = 'wallet' | 'merchant';

/**
 * One graduated tier. `start` is the inclusive lower bound on the accumulated usage, in the meter's
 * display unit: raw tokens (tokens_1m), raw characters (characters_1m), minutes, requests.
 * `rate` is in 1e-10 units: per 1M tokens / 1M characters / minute / request for `fixed`,
 * percent for `percentage` (10% = 10 * UNIT).
 */
export interface Tier {
  start: number;
  rate: bigint;
}

export interface MeterPricing {
  rateType: RateType;
  tierType: TierType;
  tokenBasis: TokenBasis;
  baseCostPayer: Payer;
  serviceChargePayer: Payer;
  tiers: readonly Tier[];
}

/** Decimal seconds ("12.345"), at most 6 fractional digits; build one with `toSeconds`. */
export type Seconds = string;

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  inputCharacters: number;
  outputCharacters: number;
  inputSeconds: Seconds;
  outputSeconds: Seconds;
  /** Part of `inputTokens` read from a prompt cache (absent = 0). */
  cachedInputTokens?: number;
  /** Part of `inputTokens` written to a prompt cache (absent = 0). */
  cacheWriteInputTokens?: number;
  /** Part of `inputTokens` that is audio, not read from a cache; priced at the audio input price (absent = 0). */
  audioInputTokens?: number;
  /** Part of `outputTokens` spent reasoning (thinking); shown on the record, priced as output (absent = 0). */
  reasoningTokens?: number;
  /** Images an image generation made (absent = 0). */
  outputImages?: number;
}

/**
 * Provider prices in units per 1M tokens. `cachedInput` prices cache-read input tokens and
 * `cacheWriteInput` cache-write ones; absent = the plain input price. Media models are priced by
 * another unit: `perMinute` (of audio, transcribed or spoken), `perImage` (generated) and
 * `perMillionCharacters` (of text spoken); see priceUnitOf for which one a request pays by.
 */
export interface BasePrices {
  input: bigint;
  output: bigint;
  cachedInput?: bigint;
  cacheWriteInput?: bigint;
  /** Audio input tokens (gpt-4o-transcribe, Gemini audio); absent = the plain input price. */
  audioInput?: bigint;
  perMinute?: bigint;
  perImage?: bigint;
  perMillionCharacters?: bigint;
}

/** The unit a request's base cost was priced by. */
export type PriceUnit = 'tokens' | 'minutes' | 'images' | 'characters';

/** What base cost is computed from: tokens, and the media units a model may be priced by. */
export interface BaseUsage extends TokenUsage {
  inputSeconds?: Seconds;
  outputSeconds?: Seconds;
  inputCharacters?: number;
  outputCharacters?: number;
  outputImages?: number | undefined;
}

/**
 * Token counts for base cost. `inputTokens` is ALL input; `cachedInputTokens` (read from cache)
 * and `cacheWriteInputTokens` (written to it) are parts of it.
 */
export interface TokenUsage {
  inputTokens: number;
  outputTokens: number;
  cachedInputTokens?: number | undefined;
  cacheWriteInputTokens?: number | undefined;
  /** Part of inputTokens that is audio and not read from a cache. */
  audioInputTokens?: number | undefined;
}

export interface BaseCost {
  input: bigint;
  output: bigint;
  total: bigint;
  unit: PriceUnit;
}

export interface BreakdownItem {
  tier: { start: number; rate: bigint; type: TierType };
  tokens: number;
  characters: number;
  seconds: Seconds;
  cost: bigint;
}

export interface PriceRequestInput {
  meter: MeterPricing;
  usage: Usage;
  /** Base cost of this request (from `baseCost`), charged or not; `unit` absent when no provider price was known. */
  baseCost: { input: bigint; output: bigint; unit?: PriceUnit };
  /** Usage of this (meter, connection) already accumulated in the period, in accumulation units. */
  accumulatedUnits: bigint;
  /** Service-charge rate in percent, as units (1.9% = parseMoney("1.9")). */
  serviceChargeRate: bigint;
  /** False when the caller used its own provider key: base cost is shown but nobody pays it to us. */
  baseCostCharged: boolean;
}

export interface PricedRequest {
  baseCost: Omit<BaseCost, 'unit'> & { unit: PriceUnit | null; charged: boolean; payer: Payer };
  fee: { amount: bigint; rateType: RateType; tokenBasis: TokenBasis; breakdown: BreakdownItem[] };
  serviceCharge: { amount: bigint; payer: Payer };
  totals: { request: bigint; wallet: bigint; merchant: bigint };
  /** This request's fee units, in accumulation units. */
  units: bigint;
  /** The accumulated position after this request: accumulatedUnits + units. */
  accumulatedUnits: bigint;
}

const TOKENS_PER_PRICE_UNIT = 1_000_000n;
const MICROS_PER_SECOND = 1_000_000n;
const MICROS_PER_MINUTE = 60n * MICROS_PER_SECOND;
const SECONDS_SCALE = 6;
const PERCENT = 100n * UNIT;

/**
 * Accumulation units covered by one unit of `rate` (fixed): tokens and characters accumulate as
 * raw counts and are priced per million; durations accumulate in microseconds, priced per minute.
 */
const RATE_DENOMINATOR: Record<TierType, bigint> = {
  tokens_1m: TOKENS_PER_PRICE_UNIT,
  characters_1m: TOKENS_PER_PRICE_UNIT,
  minutes: MICROS_PER_MINUTE,
  requests: 1n,
};

/** Accumulation units per unit of tier `start`: only minutes differ from the raw count. */
const START_MULTIPLIER: Record<TierType, bigint> = {
  tokens_1m: 1n,
  characters_1m: 1n,
  minutes: MICROS_PER_MINUTE,
  requests: 1n,
};

// ---------------------------------------------------------------------------------------------
// Exact decimals

export type Rounding = 'exact' | 'ceil' | 'halfUp';

const DECIMAL_TEXT = /^(\d+)(?:\.(\d*))?(?:e([+-]?\d+))?$/i;
/** Guards BigInt exponentiation against absurd exponents ("1e999999") from configuration. */
const MAX_DECIMAL_SHIFT = 400;

/**
 * Converts a non-negative decimal to an integer: value × multiplier, rounded as asked.
 * A JS number is read through its shortest round-trip text (String(2.5) = "2.5"), which is the
 * literal it was written as, so no float multiplication ever touches the value.
 */
export function decimalToInteger(value: number | string, multiplier: bigint, rounding: Rounding): bigint {
  const text = typeof value === 'number' ? numberText(value) : value.trim();
  const match = DECIMAL_TEXT.exec(text);
  if (!match) throw new RangeError(`"${text}" is not a non-negative decimal number`);
  const [, whole = '0', fraction = '', exponentText = '0'] = match;
  const shift = Number(exponentText) - fraction.length;
  if (Math.abs(shift) > MAX_DECIMAL_SHIFT) throw new RangeError(`"${text}" is out of range`);
  const scaled = BigInt(whole + fraction) * multiplier;
  if (shift >= 0) return scaled * 10n ** BigInt(shift);
  return divideRounded(scaled, 10n ** BigInt(-shift), rounding, text);
}

function numberText(value: number): string {
  if (!Number.isFinite(value) || value < 0) throw new RangeError(`${value} is not a finite non-negative number`);
  return String(value);
}

function divideRounded(numerator: bigint, denominator: bigint, rounding: Rounding, text: string): bigint {
  if (rounding === 'halfUp') return divRoundHalfUp(numerator, denominator);
  if (rounding === 'ceil') return (numerator + denominator - 1n) / denominator;
  if (numerator % denominator !== 0n) throw new RangeError(`"${text}" has too many fractional digits`);
  return numerator / denominator;
}

// ---------------------------------------------------------------------------------------------
// Seconds

/**
 * Canonical `Seconds` from a JSON number or decimal string, rounded half-up to the microsecond
 * (no provider reports finer; the accumulated position must be an integer).
 */
export function toSeconds(value: number | string): Seconds {
  return formatMicros(decimalToInteger(value, MICROS_PER_SECOND, 'halfUp'));
}

/** Exact microseconds of a `Seconds` string; more than 6 fractional digits is an error. */
export function secondsToMicros(seconds: Seconds): bigint {
  // Most usage has no duration: "0" needs no parsing.
  if (seconds === '0') return 0n;
  return decimalToInteger(seconds, MICROS_PER_SECOND, 'exact');
}

/** Microseconds as canonical decimal seconds: "90.5", "0", "0.000001". */
export function formatMicros(micros: bigint): Seconds {
  if (micros < 0n) throw new RangeError('negative duration');
  const whole = micros / MICROS_PER_SECOND;
  const fraction = (micros % MICROS_PER_SECOND).toString().padStart(SECONDS_SCALE, '0').replace(/0+$/, '');
  return fraction ? `${whole}.${fraction}` : `${whole}`;
}

// ---------------------------------------------------------------------------------------------
// Base cost

/**
 * The unit a request pays its provider by: a media price the model has, for usage in that unit
 * (seconds of audio, images, characters), else tokens. A transcription model priced per token
 * (gpt-4o-transcribe) reports tokens and pays by them.
 */
export function priceUnitOf(prices: BasePrices, usage: BaseUsage): PriceUnit {
  if (prices.perMinute !== undefined && secondsOf(usage) > 0n) return 'minutes';
  if (prices.perImage !== undefined && (usage.outputImages ?? 0) > 0) return 'images';
  if (prices.perMillionCharacters !== undefined && (usage.inputCharacters ?? 0) + (usage.outputCharacters ?? 0) > 0) return 'characters';
  return 'tokens';
}

function secondsOf(usage: BaseUsage): bigint {
  return secondsToMicros(usage.inputSeconds ?? '0') + secondsToMicros(usage.outputSeconds ?? '0');
}

/**
 * Provider cost of the usage, in the unit priceUnitOf picks: each component (input, output)
 * rounded half-up once; total is the exact sum, so input + output always equals total on screen.
 * Audio seconds and characters are priced on the side they were on; images are output.
 */
export function baseCost(prices: BasePrices, usage: BaseUsage): BaseCost {
  const unit = priceUnitOf(prices, usage);
  switch (unit) {
    case 'minutes':
      return sides(
        divRoundHalfUp(secondsToMicros(usage.inputSeconds ?? '0') * prices.perMinute!, MICROS_PER_MINUTE),
        divRoundHalfUp(secondsToMicros(usage.outputSeconds ?? '0') * prices.perMinute!, MICROS_PER_MINUTE),
        unit,
      );
    case 'images':
      return sides(0n, count('outputImages', usage.outputImages ?? 0) * prices.perImage!, unit);
    case 'characters':
      return sides(
        divRoundHalfUp(count('inputCharacters', usage.inputCharacters ?? 0) * prices.perMillionCharacters!, TOKENS_PER_PRICE_UNIT),
        divRoundHalfUp(count('outputCharacters', usage.outputCharacters ?? 0) * prices.perMillionCharacters!, TOKENS_PER_PRICE_UNIT),
        unit,
      );
    case 'tokens':
      return tokenCost(prices, usage);
  }
}

function sides(input: bigint, output: bigint, unit: PriceUnit): BaseCost {
  return { input, output, total: input + output, unit };
}

function tokenCost(prices: BasePrices, usage: TokenUsage): BaseCost {
  const inputTokens = count('inputTokens', usage.inputTokens);
  const cachedTokens = count('cachedInputTokens', usage.cachedInputTokens ?? 0);
  const cacheWriteTokens = count('cacheWriteInputTokens', usage.cacheWriteInputTokens ?? 0);
  const audioTokens = count('audioInputTokens', usage.audioInputTokens ?? 0);
  const outputTokens = count('outputTokens', usage.outputTokens);
  if (cachedTokens + cacheWriteTokens + audioTokens > inputTokens) {
    throw new RangeError('cachedInputTokens, cacheWriteInputTokens and audioInputTokens cannot exceed inputTokens');
  }
  const plainTokens = inputTokens - cachedTokens - cacheWriteTokens - audioTokens;
  const inputValue =
    plainTokens * prices.input +
    cachedTokens * (prices.cachedInput ?? prices.input) +
    cacheWriteTokens * (prices.cacheWriteInput ?? prices.input) +
    audioTokens * (prices.audioInput ?? prices.input);
  const input = divRoundHalfUp(inputValue, TOKENS_PER_PRICE_UNIT);
  const output = divRoundHalfUp(outputTokens * prices.output, TOKENS_PER_PRICE_UNIT);
  return { input, output, total: input + output, unit: 'tokens' };
}

// ---------------------------------------------------------------------------------------------
// Fee units and tiers

/**
 * The request's units for the meter, in accumulation units: tokens of the token basis, characters,
 * microseconds (input + output), or one request.
 */
export function feeUnits(meter: Pick<MeterPricing, 'tierType' | 'tokenBasis'>, usage: Usage): bigint {
  switch (meter.tierType) {
    case 'tokens_1m':
      return basisTokens(meter.tokenBasis, usage);
    case 'characters_1m':
      return count('inputCharacters', usage.inputCharacters) + count('outputCharacters', usage.outputCharacters);
    case 'minutes':
      return totalMicros(usage);
    case 'requests':
      return 1n;
  }
}

/** A tier's `start` in accumulation units; rounded up, because the first unit it covers is whole. */
export function tierStartUnits(start: number, tierType: TierType): bigint {
  // Every request prices its meter's tiers: whole starts (most) need no decimal parsing.
  if (Number.isSafeInteger(start) && start >= 0) return BigInt(start) * START_MULTIPLIER[tierType];
  return decimalToInteger(start, START_MULTIPLIER[tierType], 'ceil');
}

/** Why these tiers cannot price anything, or null when they are valid. */
export function tierProblem(tiers: readonly Tier[]): string | null {
  const first = tiers[0];
  if (!first) return 'at least one tier is required';
  if (first.start !== 0) return 'the first tier must start at 0';
  for (const [index, tier] of tiers.entries()) {
    if (!Number.isFinite(tier.start) || tier.start < 0) return `tier ${index}: start must be a non-negative number`;
    if (tier.rate < 0n) return `tier ${index}: rate must not be negative`;
    const previous = tiers[index - 1];
    if (previous && tier.start <= previous.start) return `tier ${index}: starts must be strictly ascending`;
  }
  return null;
}

interface Slice {
  tier: Tier;
  units: bigint;
}

/**
 * Splits the units at positions [from, from + units) among graduated tiers. A request with no
 * units still gets one empty slice in the tier at `from`, so that a percentage meter charges its
 * base cost and every record shows the tier it was priced at.
 */
function sliceByTiers(meter: MeterPricing, from: bigint, units: bigint): Slice[] {
  const starts = meter.tiers.map((tier) => tierStartUnits(tier.start, meter.tierType));
  const end = from + units;
  const slices: Slice[] = [];
  meter.tiers.forEach((tier, index) => {
    const lower = maxOf(starts[index] ?? 0n, from);
    const next = starts[index + 1];
    const upper = next === undefined ? end : minOf(next, end);
    if (upper > lower) slices.push({ tier, units: upper - lower });
  });
  return slices.length > 0 ? slices : [{ tier: tierAt(meter.tiers, starts, from), units: 0n }];
}

function tierAt(tiers: readonly Tier[], starts: readonly bigint[], position: bigint): Tier {
  let found = tiers[0];
  tiers.forEach((tier, index) => {
    if ((starts[index] ?? 0n) <= position) found = tier;
  });
  if (!found) throw new RangeError('meter has no tiers');
  return found;
}

/**
 * One slice's cost, rounded half-up once. fixed: rate × units / rate denominator. percentage:
 * rate% × the basis base cost × (slice units / request units) — the base cost shared pro rata.
 */
function sliceCost(meter: MeterPricing, slice: Slice, requestUnits: bigint, basisCost: bigint): bigint {
  if (meter.rateType === 'fixed') {
    return divRoundHalfUp(slice.tier.rate * slice.units, RATE_DENOMINATOR[meter.tierType]);
  }
  if (requestUnits === 0n) return divRoundHalfUp(slice.tier.rate * basisCost, PERCENT);
  return divRoundHalfUp(slice.tier.rate * basisCost * slice.units, PERCENT * requestUnits);
}

/** The base cost a percentage fee is taken from: the side(s) the token basis bills. */
function basisBaseCost(tokenBasis: TokenBasis, base: { input: bigint; output: bigint }): bigint {
  return tokenBasis === 'output' ? base.output : base.input + base.output;
}

/**
 * What a breakdown item shows besides its cost: the slice's units in the meter's own dimension.
 * A `requests` slice is the whole request, so it shows all of the request's usage.
 */
function sliceUsage(meter: MeterPricing, slice: Slice, usage: Usage): Omit<BreakdownItem, 'tier' | 'cost'> {
  switch (meter.tierType) {
    case 'tokens_1m':
      return { tokens: Number(slice.units), characters: 0, seconds: '0' };
    case 'characters_1m':
      return { tokens: 0, characters: Number(slice.units), seconds: '0' };
    case 'minutes':
      return { tokens: 0, characters: 0, seconds: formatMicros(slice.units) };
    case 'requests':
      return {
        tokens: Number(basisTokens(meter.tokenBasis, usage)),
        characters: usage.inputCharacters + usage.outputCharacters,
        seconds: formatMicros(totalMicros(usage)),
      };
  }
}

// ---------------------------------------------------------------------------------------------
// Request pricing

/**
 * Prices one request: base cost, graduated fee, service charge, who pays what, and the new
 * accumulated position. Every component is rounded once; every total is an exact sum.
 */
export function priceRequest(input: PriceRequestInput): PricedRequest {
  const { meter, usage, accumulatedUnits, serviceChargeRate, baseCostCharged } = input;
  assertPricingInput(input);
  // Built member by member: V8 builds a spread with further members through a slow path (decision 0008).
  const base = { input: input.baseCost.input, output: input.baseCost.output, total: input.baseCost.input + input.baseCost.output };
  const units = feeUnits(meter, usage);
  const basisCost = basisBaseCost(meter.tokenBasis, base);
  const breakdown = sliceByTiers(meter, accumulatedUnits, units).map((slice): BreakdownItem => {
    const shown = sliceUsage(meter, slice, usage);
    return {
      tier: { start: slice.tier.start, rate: slice.tier.rate, type: meter.tierType },
      tokens: shown.tokens,
      characters: shown.characters,
      seconds: shown.seconds,
      cost: sliceCost(meter, slice, units, basisCost),
    };
  });
  let fee = 0n;
  for (const item of breakdown) fee += item.cost;
  const serviceCharge = divRoundHalfUp(serviceChargeRate * fee, PERCENT);
  const charged = baseCostCharged ? base.total : 0n;
  const totals = totalsByPayer([
    { amount: charged, payer: meter.baseCostPayer },
    { amount: fee, payer: 'wallet' }, // the fee is the merchant's revenue: the wallet always pays it
    { amount: serviceCharge, payer: meter.serviceChargePayer },
  ]);
  return {
    baseCost: { input: base.input, output: base.output, total: base.total, unit: input.baseCost.unit ?? null, charged: baseCostCharged, payer: meter.baseCostPayer },
    fee: { amount: fee, rateType: meter.rateType, tokenBasis: meter.tokenBasis, breakdown },
    serviceCharge: { amount: serviceCharge, payer: meter.serviceChargePayer },
    totals,
    units,
    accumulatedUnits: accumulatedUnits + units,
  };
}

function totalsByPayer(parts: { amount: bigint; payer: Payer }[]): PricedRequest['totals'] {
  let wallet = 0n;
  let merchant = 0n;
  for (const part of parts) {
    if (part.payer === 'wallet') wallet += part.amount;
    else merchant += part.amount;
  }
  return { request: wallet + merchant, wallet, merchant };
}

/**
 * Tier lists already found valid, by identity: a meter's tiers are checked when it is priced
 * first, not again for every request it prices (tier lists are never changed in place).
 */
const validTiers = new WeakSet<readonly Tier[]>();

function assertPricingInput(input: PriceRequestInput): void {
  if (!validTiers.has(input.meter.tiers)) {
    const problem = tierProblem(input.meter.tiers);
    if (problem) throw new RangeError(`invalid meter tiers: ${problem}`);
    validTiers.add(input.meter.tiers);
  }
  if (input.accumulatedUnits < 0n) throw new RangeError('accumulatedUnits must not be negative');
  if (input.serviceChargeRate < 0n) throw new RangeError('serviceChargeRate must not be negative');
  if (input.baseCost.input < 0n || input.baseCost.output < 0n) throw new RangeError('baseCost must not be negative');
  validateUsage(input.usage);
}

/** Checks every usage field, so that a bad count fails here rather than as a wrong price. */
function validateUsage(usage: Usage): void {
  count('inputTokens', usage.inputTokens);
  count('outputTokens', usage.outputTokens);
  const cached = count('cachedInputTokens', usage.cachedInputTokens ?? 0) + count('cacheWriteInputTokens', usage.cacheWriteInputTokens ?? 0);
  if (cached > BigInt(usage.inputTokens)) throw new RangeError('cached input tokens cannot exceed inputTokens');
  if (count('reasoningTokens', usage.reasoningTokens ?? 0) > BigInt(usage.outputTokens)) throw new RangeError('reasoningTokens cannot exceed outputTokens');
  count('outputImages', usage.outputImages ?? 0);
  count('inputCharacters', usage.inputCharacters);
  count('outputCharacters', usage.outputCharacters);
  secondsToMicros(usage.inputSeconds);
  secondsToMicros(usage.outputSeconds);
}

function basisTokens(tokenBasis: TokenBasis, usage: Usage): bigint {
  const output = count('outputTokens', usage.outputTokens);
  return tokenBasis === 'output' ? output : count('inputTokens', usage.inputTokens) + output;
}

function totalMicros(usage: Usage): bigint {
  return secondsToMicros(usage.inputSeconds) + secondsToMicros(usage.outputSeconds);
}

function count(name: string, value: number): bigint {
  if (!Number.isSafeInteger(value) || value < 0) throw new RangeError(`${name} must be a non-negative integer`);
  return BigInt(value);
}

function maxOf(a: bigint, b: bigint): bigint {
  return a > b ? a : b;
}

function minOf(a: bigint, b: bigint): bigint {
  return a < b ? a : b;
}
