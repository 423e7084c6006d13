import { describe, expect, it } from 'vitest';
import { formatMoney, parseMoney } from '../../src/domain/money.ts';
import {
  baseCost,
  decimalToInteger,
  feeUnits,
  formatMicros,
  priceRequest,
  secondsToMicros,
  tierProblem,
  tierStartUnits,
  toSeconds,
  type MeterPricing,
  type PriceRequestInput,
  type Tier,
  type Usage,
} from '../../src/domain/pricing.ts';

// Worked examples: every expected number is derived by hand in the comment above it.

const money = parseMoney;

function tiers(...pairs: [number, string][]): Tier[] {
  return pairs.map(([start, rate]) => ({ start, rate: money(rate) }));
}

function meter(overrides: Partial<MeterPricing> = {}): MeterPricing {
  return {
    rateType: 'fixed',
    tierType: 'tokens_1m',
    tokenBasis: 'input+output',
    baseCostPayer: 'wallet',
    serviceChargePayer: 'wallet',
    tiers: tiers([0, '2']),
    ...overrides,
  };
}

function usage(overrides: Partial<Usage> = {}): Usage {
  return {
    inputTokens: 0,
    outputTokens: 0,
    inputCharacters: 0,
    outputCharacters: 0,
    inputSeconds: '0',
    outputSeconds: '0',
    ...overrides,
  };
}

function price(overrides: Partial<PriceRequestInput>) {
  return priceRequest({
    meter: meter(),
    usage: usage(),
    baseCost: { input: 0n, output: 0n },
    accumulatedUnits: 0n,
    serviceChargeRate: 0n,
    baseCostCharged: true,
    ...overrides,
  });
}

/** Breakdown as readable [units shown, cost] pairs. */
function slices(result: ReturnType<typeof priceRequest>) {
  return result.fee.breakdown.map((item) => ({
    start: item.tier.start,
    tokens: item.tokens,
    characters: item.characters,
    seconds: item.seconds,
    cost: formatMoney(item.cost),
  }));
}

describe('baseCost', () => {
  it('prices input and output per 1M tokens, cached input at its own price', () => {
    // gpt-4o-like: input 2.50, cached 1.25, output 10 per 1M.
    // input  = (800 × 2.50 + 200 × 1.25) / 1e6 = (2000 + 250) / 1e6 = 0.00225
    // output = 500 × 10 / 1e6 = 0.005 ; total = 0.00725
    const cost = baseCost(
      { input: money('2.50'), output: money('10'), cachedInput: money('1.25') },
      { inputTokens: 1000, cachedInputTokens: 200, outputTokens: 500 },
    );
    expect(formatMoney(cost.input)).toBe('0.0022500000');
    expect(formatMoney(cost.output)).toBe('0.0050000000');
    expect(formatMoney(cost.total)).toBe('0.0072500000');
  });

  it('prices cached tokens at the input price when there is no cached price', () => {
    // 1000 × 2.50 / 1e6 = 0.0025
    const cost = baseCost({ input: money('2.50'), output: 0n }, { inputTokens: 1000, cachedInputTokens: 400, outputTokens: 0 });
    expect(formatMoney(cost.input)).toBe('0.0025000000');
  });

  it('prices cache-write input tokens at the cache-write price, beside cache reads', () => {
    // claude-sonnet-4-like: input 3, cache read 0.30, cache write 3.75, output 15 per 1M.
    // input = (500 × 3 + 400 × 0.30 + 100 × 3.75) / 1e6 = (1500 + 120 + 375) / 1e6 = 0.001995
    const cost = baseCost(
      { input: money('3'), output: money('15'), cachedInput: money('0.30'), cacheWriteInput: money('3.75') },
      { inputTokens: 1000, cachedInputTokens: 400, cacheWriteInputTokens: 100, outputTokens: 10 },
    );
    expect(formatMoney(cost.input)).toBe('0.0019950000');
    expect(formatMoney(cost.total)).toBe('0.0021450000');
    // Without a cache-write price, writes pay the input price: (500 × 3 + 400 × 0.3 + 100 × 3) / 1e6.
    const plain = baseCost({ input: money('3'), output: 0n, cachedInput: money('0.30') }, { inputTokens: 1000, cachedInputTokens: 400, cacheWriteInputTokens: 100, outputTokens: 0 });
    expect(formatMoney(plain.input)).toBe('0.0019200000');
  });

  it('rounds each component half-up, and the total is their exact sum', () => {
    // price 1 unit (0.0000000001) per 1M tokens:
    // input 500,000 tokens → 0.5 unit → rounds up to 1; output 499,999 → 0.499999 unit → 0.
    const cost = baseCost({ input: 1n, output: 1n }, { inputTokens: 500_000, outputTokens: 499_999 });
    expect(cost).toEqual({ input: 1n, output: 0n, total: 1n, unit: 'tokens' });
    // 1,500,000 tokens → 1.5 units → 2 each; total 4 (not round(3.0) = 3): sum of rounded parts.
    expect(baseCost({ input: 1n, output: 1n }, { inputTokens: 1_500_000, outputTokens: 1_500_000 }).total).toBe(4n);
  });

  it('rejects impossible usage', () => {
    expect(() => baseCost({ input: 1n, output: 1n }, { inputTokens: 1, cachedInputTokens: 2, outputTokens: 0 })).toThrow(RangeError);
    expect(() => baseCost({ input: 1n, output: 1n }, { inputTokens: 3, cachedInputTokens: 2, cacheWriteInputTokens: 2, outputTokens: 0 })).toThrow(RangeError);
    expect(() => baseCost({ input: 1n, output: 1n }, { inputTokens: -1, outputTokens: 0 })).toThrow(RangeError);
    expect(() => baseCost({ input: 1n, output: 1n }, { inputTokens: 1.5, outputTokens: 0 })).toThrow(RangeError);
  });
});

describe('priceRequest — fixed rates by tier type', () => {
  it('tokens_1m: rate per 1M tokens of input+output', () => {
    // 2 per 1M; 500 + 200 = 700 tokens → 2 × 700 / 1e6 = 0.0014
    const result = price({ usage: usage({ inputTokens: 500, outputTokens: 200 }) });
    expect(slices(result)).toEqual([{ start: 0, tokens: 700, characters: 0, seconds: '0', cost: '0.0014000000' }]);
    expect(formatMoney(result.fee.amount)).toBe('0.0014000000');
    expect(result.units).toBe(700n);
    expect(result.accumulatedUnits).toBe(700n);
  });

  it('tokens_1m with token_basis output counts completion tokens only', () => {
    // 2 per 1M; output basis → 200 tokens → 2 × 200 / 1e6 = 0.0004
    const result = price({ meter: meter({ tokenBasis: 'output' }), usage: usage({ inputTokens: 500, outputTokens: 200 }) });
    expect(formatMoney(result.fee.amount)).toBe('0.0004000000');
    expect(result.accumulatedUnits).toBe(200n);
  });

  it('tokens_1m: graduated tiers, start in raw tokens (reference example: 5M tokens → 17)', () => {
    // tiers 0 → 5, 1,000,000 → 3, 10,000,000 → 1 (per 1M). 5,000,000 tokens from position 0:
    // 1M × 5 / 1M = 5 ; 4M × 3 / 1M = 12 ; fee = 17
    const result = price({
      meter: meter({ tiers: tiers([0, '5'], [1_000_000, '3'], [10_000_000, '1']) }),
      usage: usage({ inputTokens: 5_000_000 }),
    });
    expect(slices(result).map((s) => [s.start, s.tokens, s.cost])).toEqual([
      [0, 1_000_000, '5.0000000000'],
      [1_000_000, 4_000_000, '12.0000000000'],
    ]);
    expect(formatMoney(result.fee.amount)).toBe('17.0000000000');
  });

  it('a request crossing two tier boundaries is split into three slices', () => {
    // Same tiers. Already accumulated 900,000; request 9,200,000 tokens → positions 900,000..10,099,999.
    //   100,000 @ 5 → 0.5 ; 9,000,000 @ 3 → 27 ; 100,000 @ 1 → 0.1 ; fee = 27.6
    const result = price({
      meter: meter({ tiers: tiers([0, '5'], [1_000_000, '3'], [10_000_000, '1']) }),
      usage: usage({ inputTokens: 4_200_000, outputTokens: 5_000_000 }),
      accumulatedUnits: 900_000n,
    });
    expect(slices(result).map((s) => [s.start, s.tokens, s.cost])).toEqual([
      [0, 100_000, '0.5000000000'],
      [1_000_000, 9_000_000, '27.0000000000'],
      [10_000_000, 100_000, '0.1000000000'],
    ]);
    expect(formatMoney(result.fee.amount)).toBe('27.6000000000');
    expect(result.accumulatedUnits).toBe(10_100_000n);
  });

  it('the tier start is inclusive: the unit at position `start` pays the new rate', () => {
    // tiers 0 → 5, 1,000,000 → 3. Accumulated 999,999; 2 tokens: position 999,999 @ 5, 1,000,000 @ 3.
    //   1 × 5 / 1e6 = 0.000005 ; 1 × 3 / 1e6 = 0.000003
    const result = price({
      meter: meter({ tiers: tiers([0, '5'], [1_000_000, '3']) }),
      usage: usage({ outputTokens: 2 }),
      accumulatedUnits: 999_999n,
    });
    expect(slices(result).map((s) => [s.start, s.tokens, s.cost])).toEqual([
      [0, 1, '0.0000050000'],
      [1_000_000, 1, '0.0000030000'],
    ]);
  });

  it('characters_1m: rate per 1M characters of input + output, tiers in raw characters', () => {
    // tiers 0 → 15, 1,000 → 10 (per 1M characters). Accumulated 800; 1,234 characters
    // (1,000 in + 234 out): 200 @ 15 → 200 × 15 / 1e6 = 0.003 ; 1,034 @ 10 → 0.01034 ; fee 0.01334
    const result = price({
      meter: meter({ tierType: 'characters_1m', tiers: tiers([0, '15'], [1000, '10']) }),
      usage: usage({ inputCharacters: 1000, outputCharacters: 234, inputTokens: 99 }),
      accumulatedUnits: 800n,
    });
    expect(slices(result)).toEqual([
      { start: 0, tokens: 0, characters: 200, seconds: '0', cost: '0.0030000000' },
      { start: 1000, tokens: 0, characters: 1034, seconds: '0', cost: '0.0103400000' },
    ]);
    expect(formatMoney(result.fee.amount)).toBe('0.0133400000');
    expect(result.accumulatedUnits).toBe(2034n);
  });

  it('minutes: rate per minute, seconds exact, start in minutes, position in microseconds', () => {
    // tiers 0 → 0.01, 1 (minute) → 0.006 per minute. 90.5 s (60 in + 30.5 out) from position 0:
    //   60 s @ 0.01 → 0.01 ; 30.5 s @ 0.006 → 0.006 × 30.5 / 60 = 0.00305 ; fee 0.01305
    const result = price({
      meter: meter({ tierType: 'minutes', tiers: tiers([0, '0.01'], [1, '0.006']) }),
      usage: usage({ inputSeconds: '60', outputSeconds: '30.5' }),
    });
    expect(slices(result)).toEqual([
      { start: 0, tokens: 0, characters: 0, seconds: '60', cost: '0.0100000000' },
      { start: 1, tokens: 0, characters: 0, seconds: '30.5', cost: '0.0030500000' },
    ]);
    expect(formatMoney(result.fee.amount)).toBe('0.0130500000');
    expect(result.accumulatedUnits).toBe(90_500_000n); // microseconds
  });

  it('minutes: a sub-unit slice rounds half-up', () => {
    // 1 unit (0.0000000001) per minute, 30 s → 0.5 unit → 1 ; 29.999999 s → 0.49999998 unit → 0
    const m = meter({ tierType: 'minutes', tiers: [{ start: 0, rate: 1n }] });
    expect(price({ meter: m, usage: usage({ inputSeconds: '30' }) }).fee.amount).toBe(1n);
    expect(price({ meter: m, usage: usage({ inputSeconds: '29.999999' }) }).fee.amount).toBe(0n);
  });

  it('requests: one unit per request; the tier is chosen by the request count so far', () => {
    // tiers 0 → 0.01, 3 → 0.005 per request. Position 2 is the third request: 0.01; position 3: 0.005.
    const m = meter({ tierType: 'requests', tiers: tiers([0, '0.01'], [3, '0.005']) });
    const u = usage({ inputTokens: 10, outputTokens: 5, inputCharacters: 7, inputSeconds: '1.5' });
    const third = price({ meter: m, usage: u, accumulatedUnits: 2n });
    expect(slices(third)).toEqual([{ start: 0, tokens: 15, characters: 7, seconds: '1.5', cost: '0.0100000000' }]);
    expect(third.accumulatedUnits).toBe(3n);
    const fourth = price({ meter: m, usage: u, accumulatedUnits: 3n });
    expect(formatMoney(fourth.fee.amount)).toBe('0.0050000000');
  });

  it('a request with no units still shows the tier it was priced at, at zero cost', () => {
    // tokens_1m meter, accumulated 2,000,000 (second tier), request with characters only → 0 tokens.
    const result = price({
      meter: meter({ tiers: tiers([0, '5'], [1_000_000, '3']) }),
      usage: usage({ inputCharacters: 50 }),
      accumulatedUnits: 2_000_000n,
    });
    expect(slices(result)).toEqual([{ start: 1_000_000, tokens: 0, characters: 0, seconds: '0', cost: '0.0000000000' }]);
    expect(result.accumulatedUnits).toBe(2_000_000n);
  });
});

describe('priceRequest — percentage rates', () => {
  it('the reference record: 10% of base 0.0581; service charge 1.9% of the fee', () => {
    // base 0.0169 + 0.0412 = 0.0581 ; fee 10% → 0.00581 ; service 1.9% × 0.00581 = 0.00011039
    // wallet pays all: 0.0581 + 0.00581 + 0.00011039 = 0.06402039
    const result = price({
      meter: meter({ rateType: 'percentage', tiers: tiers([0, '10']) }),
      usage: usage({ inputTokens: 1690, outputTokens: 1030 }),
      baseCost: { input: money('0.0169'), output: money('0.0412') },
      serviceChargeRate: money('1.9'),
    });
    expect(formatMoney(result.baseCost.total)).toBe('0.0581000000');
    expect(formatMoney(result.fee.amount)).toBe('0.0058100000');
    expect(result.serviceCharge).toEqual({ amount: money('0.00011039'), payer: 'wallet' });
    expect(formatMoney(result.totals.request)).toBe('0.0640203900');
    expect(formatMoney(result.totals.wallet)).toBe('0.0640203900');
    expect(result.totals.merchant).toBe(0n);
  });

  it('splits the base cost pro rata across the slices of a tier crossing', () => {
    // tiers 0 → 20%, 1,000 → 10% (tokens). Accumulated 600; 300 in + 500 out = 800 tokens.
    // base 0.0003 + 0.0025 = 0.0028 ; 400 tokens in each tier → each slice's base = 0.0014
    //   0.0014 × 20% = 0.00028 ; 0.0014 × 10% = 0.00014 ; fee 0.00042
    const result = price({
      meter: meter({ rateType: 'percentage', tiers: tiers([0, '20'], [1000, '10']) }),
      usage: usage({ inputTokens: 300, outputTokens: 500 }),
      baseCost: { input: money('0.0003'), output: money('0.0025') },
      accumulatedUnits: 600n,
    });
    expect(slices(result).map((s) => [s.start, s.tokens, s.cost])).toEqual([
      [0, 400, '0.0002800000'],
      [1000, 400, '0.0001400000'],
    ]);
    expect(formatMoney(result.fee.amount)).toBe('0.0004200000');
  });

  it('token_basis output: units are output tokens and the base is the output cost only', () => {
    // Same tiers; output basis → 500 units at positions 600..1,099: 400 @ 20%, 100 @ 10%.
    // base (output only) 0.0025: 0.0025 × 400/500 × 20% = 0.0004 ; 0.0025 × 100/500 × 10% = 0.00005
    const result = price({
      meter: meter({ rateType: 'percentage', tokenBasis: 'output', tiers: tiers([0, '20'], [1000, '10']) }),
      usage: usage({ inputTokens: 300, outputTokens: 500 }),
      baseCost: { input: money('0.0003'), output: money('0.0025') },
      accumulatedUnits: 600n,
    });
    expect(slices(result).map((s) => [s.tokens, s.cost])).toEqual([
      [400, '0.0004000000'],
      [100, '0.0000500000'],
    ]);
    expect(formatMoney(result.fee.amount)).toBe('0.0004500000');
  });

  it('rounds each slice, and the fee is the sum of the rounded slices', () => {
    // 10 units of base over 3 tokens crossing 3 tiers, each 100%: every slice is 10/3 = 3.33… → 3.
    // fee = 3 + 3 + 3 = 9 units (not round(10) = 10): what the breakdown shows adds up to the fee.
    const result = price({
      meter: meter({ rateType: 'percentage', tiers: tiers([0, '100'], [1, '100'], [2, '100']) }),
      usage: usage({ outputTokens: 3 }),
      baseCost: { input: 0n, output: 10n },
    });
    expect(result.fee.breakdown.map((item) => item.cost)).toEqual([3n, 3n, 3n]);
    expect(result.fee.amount).toBe(9n);
  });

  it('a zero-unit request on a percentage meter still takes its percentage of the base cost', () => {
    // characters_1m meter, a chat request with tokens but no characters: 0 units, base 0.02 + 0.01.
    // One empty slice in the current tier carries the whole base: 10% × 0.03 = 0.003
    const result = price({
      meter: meter({ rateType: 'percentage', tierType: 'characters_1m', tiers: tiers([0, '10']) }),
      usage: usage({ inputTokens: 100 }),
      baseCost: { input: money('0.02'), output: money('0.01') },
    });
    expect(result.fee.breakdown).toHaveLength(1);
    expect(result.fee.breakdown[0]?.characters).toBe(0);
    expect(formatMoney(result.fee.amount)).toBe('0.0030000000');
  });

  it('percentage on a minutes meter takes the base cost pro rata by duration', () => {
    // tiers 0 → 10%, 1 min → 5%. 90 s, base 0.009: 60/90 × 0.009 × 10% = 0.0006 ; 30/90 × 0.009 × 5% = 0.00015
    const result = price({
      meter: meter({ rateType: 'percentage', tierType: 'minutes', tiers: tiers([0, '10'], [1, '5']) }),
      usage: usage({ inputSeconds: '90' }),
      baseCost: { input: money('0.009'), output: 0n },
    });
    expect(result.fee.breakdown.map((item) => formatMoney(item.cost))).toEqual(['0.0006000000', '0.0001500000']);
  });
});

describe('priceRequest — payers and unmanaged keys', () => {
  // Common numbers: base 0.03 (0.01 + 0.02); fixed fee 2 per 1M × 1,500 tokens = 0.003;
  // service charge 10% × 0.003 = 0.0003.
  const common = {
    usage: usage({ inputTokens: 1000, outputTokens: 500 }),
    baseCost: { input: money('0.01'), output: money('0.02') },
    serviceChargeRate: money('10'),
  };

  it('base cost paid by the merchant, service charge by the wallet', () => {
    // wallet = fee 0.003 + service 0.0003 = 0.0033 ; merchant = base 0.03 ; request = 0.0333
    const result = price({ ...common, meter: meter({ baseCostPayer: 'merchant', serviceChargePayer: 'wallet' }) });
    expect(formatMoney(result.fee.amount)).toBe('0.0030000000');
    expect(formatMoney(result.serviceCharge.amount)).toBe('0.0003000000');
    expect(result.baseCost.payer).toBe('merchant');
    expect(formatMoney(result.totals.wallet)).toBe('0.0033000000');
    expect(formatMoney(result.totals.merchant)).toBe('0.0300000000');
    expect(formatMoney(result.totals.request)).toBe('0.0333000000');
  });

  it('base cost paid by the wallet, service charge by the merchant', () => {
    // wallet = base 0.03 + fee 0.003 = 0.033 ; merchant = service 0.0003 ; request = 0.0333
    const result = price({ ...common, meter: meter({ baseCostPayer: 'wallet', serviceChargePayer: 'merchant' }) });
    expect(result.serviceCharge.payer).toBe('merchant');
    expect(formatMoney(result.totals.wallet)).toBe('0.0330000000');
    expect(formatMoney(result.totals.merchant)).toBe('0.0003000000');
    expect(formatMoney(result.totals.request)).toBe('0.0333000000');
  });

  it('the fee is paid by the wallet even when the merchant pays everything else', () => {
    // wallet = fee 0.003 ; merchant = base 0.03 + service 0.0003 = 0.0303
    const result = price({ ...common, meter: meter({ baseCostPayer: 'merchant', serviceChargePayer: 'merchant' }) });
    expect(formatMoney(result.totals.wallet)).toBe('0.0030000000');
    expect(formatMoney(result.totals.merchant)).toBe('0.0303000000');
  });

  it('unmanaged: base cost is reported but not charged to anyone', () => {
    // wallet = fee 0.003 + service 0.0003 = 0.0033 ; merchant 0 ; the base 0.03 stays informational.
    const result = price({ ...common, baseCostCharged: false, meter: meter({ baseCostPayer: 'merchant' }) });
    expect(formatMoney(result.baseCost.total)).toBe('0.0300000000');
    expect(result.baseCost.charged).toBe(false);
    expect(formatMoney(result.totals.wallet)).toBe('0.0033000000');
    expect(result.totals.merchant).toBe(0n);
    expect(formatMoney(result.totals.request)).toBe('0.0033000000');
  });

  it('unmanaged with a percentage meter: the fee is still a percentage of the (uncharged) base', () => {
    // 10% × 0.03 = 0.003 ; nothing else charged.
    const result = price({ ...common, serviceChargeRate: 0n, baseCostCharged: false, meter: meter({ rateType: 'percentage', tiers: tiers([0, '10']) }) });
    expect(formatMoney(result.fee.amount)).toBe('0.0030000000');
    expect(formatMoney(result.totals.request)).toBe('0.0030000000');
  });

  it('service charge rounds half-up', () => {
    // fee 5 units (fixed 5 units per request); 10% → 0.5 unit → 1 ; 9.9% → 0.495 → 0
    const m = meter({ tierType: 'requests', tiers: [{ start: 0, rate: 5n }] });
    expect(price({ meter: m, serviceChargeRate: money('10') }).serviceCharge.amount).toBe(1n);
    expect(price({ meter: m, serviceChargeRate: money('9.9') }).serviceCharge.amount).toBe(0n);
  });
});

describe('validation and unit helpers', () => {
  it('rejects invalid tiers, negative positions and non-canonical seconds', () => {
    expect(tierProblem([])).toMatch(/at least one/);
    expect(tierProblem(tiers([5, '1']))).toMatch(/start at 0/);
    expect(tierProblem(tiers([0, '1'], [10, '1'], [10, '1']))).toMatch(/ascending/);
    expect(tierProblem([{ start: 0, rate: -1n }])).toMatch(/negative/);
    expect(tierProblem(tiers([0, '1'], [10, '2']))).toBeNull();
    expect(() => price({ meter: meter({ tiers: [] }) })).toThrow(RangeError);
    expect(() => price({ accumulatedUnits: -1n })).toThrow(RangeError);
    expect(() => price({ usage: usage({ inputSeconds: '1.0000001' }) })).toThrow(RangeError);
    expect(() => price({ usage: usage({ inputSeconds: '-1' }) })).toThrow(RangeError);
  });

  it('converts seconds exactly from JSON numbers and strings', () => {
    expect(toSeconds(9.8)).toBe('9.8');
    expect(toSeconds(1e-7)).toBe('0'); // below a microsecond: half-up to 0
    expect(toSeconds(5e-7)).toBe('0.000001');
    expect(toSeconds('12.3450000')).toBe('12.345');
    expect(toSeconds(1e21)).toBe('1000000000000000000000');
    expect(secondsToMicros('90.5')).toBe(90_500_000n);
    expect(formatMicros(1n)).toBe('0.000001');
    expect(() => toSeconds(Number.NaN)).toThrow(RangeError);
  });

  it('reads JS numbers through their decimal text, never by float multiplication', () => {
    // 0.1 × 1e10 in floats is 1000000000.0000001; through the text "0.1" it is exactly 1e9.
    expect(decimalToInteger(0.1, 10n ** 10n, 'exact')).toBe(1_000_000_000n);
    expect(decimalToInteger(1.1e-9, 10n ** 10n, 'exact')).toBe(11n);
    expect(decimalToInteger('0.15', 10n, 'halfUp')).toBe(2n);
    expect(decimalToInteger('0.11', 10n, 'ceil')).toBe(2n);
    expect(() => decimalToInteger('0.11', 10n, 'exact')).toThrow(RangeError);
  });

  it('tier starts: raw tokens/characters/requests, minutes for minute meters', () => {
    expect(tierStartUnits(1_000_000, 'tokens_1m')).toBe(1_000_000n);
    expect(tierStartUnits(1000, 'characters_1m')).toBe(1000n);
    expect(tierStartUnits(10, 'requests')).toBe(10n);
    expect(tierStartUnits(1.5, 'minutes')).toBe(90_000_000n);
    expect(tierStartUnits(0.5, 'tokens_1m')).toBe(1n); // a fractional start covers the next whole token
  });

  it('fee units per tier type and token basis', () => {
    const u = usage({ inputTokens: 3, outputTokens: 4, inputCharacters: 5, outputCharacters: 6, inputSeconds: '1.5', outputSeconds: '0.25' });
    expect(feeUnits({ tierType: 'tokens_1m', tokenBasis: 'input+output' }, u)).toBe(7n);
    expect(feeUnits({ tierType: 'tokens_1m', tokenBasis: 'output' }, u)).toBe(4n);
    expect(feeUnits({ tierType: 'characters_1m', tokenBasis: 'output' }, u)).toBe(11n);
    expect(feeUnits({ tierType: 'minutes', tokenBasis: 'input+output' }, u)).toBe(1_750_000n);
    expect(feeUnits({ tierType: 'requests', tokenBasis: 'input+output' }, u)).toBe(1n);
  });
});
