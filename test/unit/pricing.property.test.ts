import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { UNIT } from '../../src/domain/money.ts';
import {
  formatMicros,
  priceRequest,
  type MeterPricing,
  type Payer,
  type PricedRequest,
  type RateType,
  type Tier,
  type TierType,
  type TokenBasis,
  type Usage,
} from '../../src/domain/pricing.ts';

// The reference is written independently of src/domain: positions and tier shares in the meter's
// display units (tokens, characters, minutes, requests) as exact rationals, each amount rounded
// half-up once at the end.

const PERCENT = 100n * UNIT;

/** An exact non-negative rational, kept in lowest terms; only what the reference needs. */
class Rational {
  readonly n: bigint;
  readonly d: bigint;
  constructor(n: bigint, d = 1n) {
    if (d === 0n) throw new RangeError('zero denominator');
    const g = gcd(n < 0n ? -n : n, d < 0n ? -d : d) || 1n;
    const sign = d < 0n ? -1n : 1n;
    this.n = (sign * n) / g;
    this.d = (sign * d) / g;
  }
  static decimal(text: string): Rational {
    const [whole = '0', fraction = ''] = text.split('.');
    return new Rational(BigInt(whole + fraction), 10n ** BigInt(fraction.length));
  }
  add(o: Rational): Rational {
    return new Rational(this.n * o.d + o.n * this.d, this.d * o.d);
  }
  sub(o: Rational): Rational {
    return this.add(new Rational(-o.n, o.d));
  }
  mul(o: Rational): Rational {
    return new Rational(this.n * o.n, this.d * o.d);
  }
  div(o: Rational): Rational {
    return new Rational(this.n * o.d, this.d * o.n);
  }
  cmp(o: Rational): number {
    const diff = this.n * o.d - o.n * this.d;
    return diff < 0n ? -1 : diff > 0n ? 1 : 0;
  }
  isZero(): boolean {
    return this.n === 0n;
  }
  /** Half-up to an integer (non-negative values only), written independently of money.ts. */
  roundHalfUp(): bigint {
    return (2n * this.n + this.d) / (2n * this.d);
  }
}

function gcd(a: bigint, b: bigint): bigint {
  return b === 0n ? a : gcd(b, a % b);
}

const min = (a: Rational, b: Rational) => (a.cmp(b) <= 0 ? a : b);
const max = (a: Rational, b: Rational) => (a.cmp(b) >= 0 ? a : b);
const r = (n: bigint | number, d: bigint | number = 1n) => new Rational(BigInt(n), BigInt(d));

interface ReferenceSlice {
  tierIndex: number;
  /** The slice's usage in the meter's display unit: tokens, characters, minutes or requests. */
  quantity: Rational;
  cost: bigint;
}

interface ReferencePrice {
  slices: ReferenceSlice[];
  fee: bigint;
  serviceCharge: bigint;
  totals: { request: bigint; wallet: bigint; merchant: bigint };
}

/**
 * The whole price, in the meter's display units with exact rationals: the request covers
 * [from, from + quantity) of the period's usage; each tier's share of that interval is costed at
 * its rate (per 1M tokens or characters, per minute, per request, or rate % of the basis base
 * cost pro rata) and rounded half-up once; the service charge is its rate % of the fee, rounded
 * once; every total is a plain sum.
 */
function referencePrice(args: {
  meter: MeterPricing;
  from: Rational;
  quantity: Rational;
  basisBase: bigint;
  chargedBase: bigint;
  serviceChargeRate: bigint;
}): ReferencePrice {
  const { meter, from, quantity } = args;
  const perRateUnit = { tokens_1m: r(1_000_000), characters_1m: r(1_000_000), minutes: r(1), requests: r(1) }[meter.tierType];
  const percent = (rate: bigint) => r(rate, PERCENT);
  const end = from.add(quantity);
  const starts = meter.tiers.map((tier) => Rational.decimal(String(tier.start)));
  const slices: ReferenceSlice[] = [];
  meter.tiers.forEach((tier, index) => {
    const low = max(starts[index]!, from);
    const high = index + 1 < starts.length ? min(starts[index + 1]!, end) : end;
    if (high.cmp(low) <= 0) return;
    const share = high.sub(low);
    const cost =
      meter.rateType === 'fixed'
        ? r(tier.rate).mul(share).div(perRateUnit)
        : percent(tier.rate).mul(r(args.basisBase)).mul(share.div(quantity));
    slices.push({ tierIndex: index, quantity: share, cost: cost.roundHalfUp() });
  });
  if (quantity.isZero()) {
    // No usage: one empty slice at the tier holding `from`; a percentage meter still takes its rate of the base.
    let index = 0;
    starts.forEach((start, i) => {
      if (start.cmp(from) <= 0) index = i;
    });
    const rate = meter.tiers[index]!.rate;
    const cost = meter.rateType === 'fixed' ? 0n : percent(rate).mul(r(args.basisBase)).roundHalfUp();
    slices.push({ tierIndex: index, quantity: r(0), cost });
  }
  const fee = slices.reduce((sum, slice) => sum + slice.cost, 0n);
  const serviceCharge = percent(args.serviceChargeRate).mul(r(fee)).roundHalfUp();
  const parts: [bigint, Payer][] = [
    [args.chargedBase, meter.baseCostPayer],
    [fee, 'wallet'],
    [serviceCharge, meter.serviceChargePayer],
  ];
  const paidBy = (who: Payer) => parts.filter(([, payer]) => payer === who).reduce((sum, [amount]) => sum + amount, 0n);
  const totals = { wallet: paidBy('wallet'), merchant: paidBy('merchant'), request: args.chargedBase + fee + serviceCharge };
  return { slices, fee, serviceCharge, totals };
}

/** The request's usage in the meter's display unit, and where the period's usage stands in it. */
function referenceQuantity(meter: MeterPricing, usage: Usage): Rational {
  switch (meter.tierType) {
    case 'tokens_1m':
      return r((meter.tokenBasis === 'output' ? 0 : usage.inputTokens) + usage.outputTokens);
    case 'characters_1m':
      return r(usage.inputCharacters + usage.outputCharacters);
    case 'minutes':
      return Rational.decimal(usage.inputSeconds).add(Rational.decimal(usage.outputSeconds)).div(r(60));
    case 'requests':
      return r(1);
  }
}

// ---------------------------------------------------------------------------------------------
// Arbitraries

const payer = fc.constantFrom<Payer>('wallet', 'merchant');
const tokenBasis = fc.constantFrom<TokenBasis>('input+output', 'output');

/** Ascending starts beginning at 0, in the meter's display unit; `step` 0.01 gives fractional minutes. */
const starts = (max: number, step = 1) =>
  fc
    .uniqueArray(fc.integer({ min: 1, max }), { maxLength: 4 })
    .map((rest) => [0, ...rest.sort((a, b) => a - b).map((k) => (step === 1 ? k : Number((k * step).toFixed(2))))]);

function tiersFrom(startList: number[], rates: bigint[]): Tier[] {
  return startList.map((start, i) => ({ start, rate: rates[i % rates.length]! }));
}

const rates = (type: RateType) =>
  fc.array(type === 'fixed' ? fc.bigInt({ min: 0n, max: 50n * UNIT }) : fc.bigInt({ min: 0n, max: 200n * UNIT }), {
    minLength: 1,
    maxLength: 5,
  });

const usageArb = fc.record({
  inputTokens: fc.integer({ min: 0, max: 2000 }),
  outputTokens: fc.integer({ min: 0, max: 2000 }),
  inputCharacters: fc.integer({ min: 0, max: 2000 }),
  outputCharacters: fc.integer({ min: 0, max: 2000 }),
  inputSeconds: fc.integer({ min: 0, max: 300_000_000 }).map((micros) => formatMicros(BigInt(micros))),
  outputSeconds: fc.integer({ min: 0, max: 300_000_000 }).map((micros) => formatMicros(BigInt(micros))),
});

const baseCostArb = fc.record({ input: fc.bigInt({ min: 0n, max: 10n ** 9n }), output: fc.bigInt({ min: 0n, max: 10n ** 9n }) });

function meterArb(tierTypes: TierType[], rateTypes: RateType[], maxStart: number): fc.Arbitrary<MeterPricing> {
  return fc
    .record({
      rateType: fc.constantFrom(...rateTypes),
      tierType: fc.constantFrom(...tierTypes),
      tokenBasis,
      baseCostPayer: payer,
      serviceChargePayer: payer,
      starts: starts(maxStart),
    })
    .chain(({ starts: startList, ...rest }) =>
      rates(rest.rateType).map((rateList) => ({ ...rest, tiers: tiersFrom(startList, rateList) })),
    );
}

function basisBase(meter: MeterPricing, base: { input: bigint; output: bigint }): bigint {
  return meter.tokenBasis === 'output' ? base.output : base.input + base.output;
}

/** A breakdown item's usage, in the same display unit as the reference's quantity. */
function shownQuantity(item: PricedRequest['fee']['breakdown'][number], tierType: TierType): Rational {
  if (tierType === 'tokens_1m') return r(item.tokens);
  if (tierType === 'characters_1m') return r(item.characters);
  return Rational.decimal(item.seconds).div(r(60));
}

// ---------------------------------------------------------------------------------------------

describe('pricing properties', () => {
  const ALL_TIER_TYPES: TierType[] = ['tokens_1m', 'characters_1m', 'minutes', 'requests'];
  const ALL_RATE_TYPES: RateType[] = ['fixed', 'percentage'];

  /** Where tiers start and how far the period has got, per tier type: both cross tiers often. */
  const SCALE: Record<TierType, { starts: fc.Arbitrary<number[]>; accumulated: fc.Arbitrary<bigint> }> = {
    tokens_1m: { starts: starts(5000), accumulated: fc.bigInt({ min: 0n, max: 6000n }) },
    characters_1m: { starts: starts(5000), accumulated: fc.bigInt({ min: 0n, max: 6000n }) },
    // Hundredths of a minute up to 10 minutes; the position in microseconds, up to 15 minutes.
    minutes: { starts: starts(1000, 0.01), accumulated: fc.bigInt({ min: 0n, max: 900_000_000n }) },
    requests: { starts: starts(20), accumulated: fc.bigInt({ min: 0n, max: 30n }) },
  };

  const pricedCase = fc
    .record({
      tierType: fc.constantFrom(...ALL_TIER_TYPES),
      rateType: fc.constantFrom(...ALL_RATE_TYPES),
      tokenBasis,
      baseCostPayer: payer,
      serviceChargePayer: payer,
    })
    .chain((kind) =>
      fc.record({
        meter: fc
          .tuple(SCALE[kind.tierType].starts, rates(kind.rateType))
          .map(([startList, rateList]): MeterPricing => ({ ...kind, tiers: tiersFrom(startList, rateList) })),
        accumulated: SCALE[kind.tierType].accumulated,
        usage: usageArb,
        base: baseCostArb,
        // Up to 100 %, with fractional percents (1.9 % is 1.9 × UNIT).
        serviceChargeRate: fc.oneof(fc.constant(0n), fc.bigInt({ min: 1n, max: 100n * UNIT })),
        baseCostCharged: fc.boolean(),
      }),
    );

  it('the whole price equals an exact-rational reference, for every tier type × rate type, with a service charge', () => {
    const seen = new Set<string>();
    fc.assert(
      fc.property(pricedCase, ({ meter, accumulated, usage, base, serviceChargeRate, baseCostCharged }) => {
        seen.add(`${meter.tierType} ${meter.rateType}`);
        const result = priceRequest({ meter, usage, baseCost: base, accumulatedUnits: accumulated, serviceChargeRate, baseCostCharged });
        // Minutes accumulate in microseconds; every other type in its own count.
        const from = meter.tierType === 'minutes' ? r(accumulated, 60_000_000n) : r(accumulated);
        const quantity = referenceQuantity(meter, usage);
        const expected = referencePrice({
          meter,
          from,
          quantity,
          basisBase: basisBase(meter, base),
          chargedBase: baseCostCharged ? base.input + base.output : 0n,
          serviceChargeRate,
        });

        expect(result.fee.breakdown.map((item) => item.tier.start)).toEqual(expected.slices.map((slice) => meter.tiers[slice.tierIndex]!.start));
        expect(result.fee.breakdown.map((item) => item.cost)).toEqual(expected.slices.map((slice) => slice.cost));
        if (meter.tierType !== 'requests') {
          expect(result.fee.breakdown.map((item) => shownQuantity(item, meter.tierType))).toEqual(expected.slices.map((slice) => slice.quantity));
        }
        expect(result.fee.amount).toBe(expected.fee);
        expect(result.serviceCharge.amount).toBe(expected.serviceCharge);
        expect(result.totals).toEqual(expected.totals);
        const position = meter.tierType === 'minutes' ? from.add(quantity).mul(r(60_000_000)) : from.add(quantity);
        expect(r(result.accumulatedUnits)).toEqual(position);
      }),
      { numRuns: 1500 },
    );
    // Every combination was exercised, not just generated in principle.
    expect(seen.size).toBe(ALL_TIER_TYPES.length * ALL_RATE_TYPES.length);
  });

  it('pricing many requests one after another matches pricing their sum, within a unit per slice', () => {
    fc.assert(
      fc.property(
        meterArb(['tokens_1m', 'characters_1m', 'minutes'], ['fixed', 'percentage'], 3000),
        fc.array(usageArb, { minLength: 1, maxLength: 6 }),
        fc.bigInt({ min: 0n, max: 10n ** 6n }),
        fc.integer({ min: 0, max: 3000 }),
        (generated, parts, perTokenBase, accumulated) => {
          // Percentage fees split pro rata, so the property holds when base cost is proportional
          // to the meter's units: a token meter whose base cost is a fixed price per token.
          const meter = generated.tierType === 'tokens_1m' ? generated : { ...generated, rateType: 'fixed' as const };
          const baseOf = (u: Pick<Usage, 'inputTokens' | 'outputTokens'>) => ({
            input: perTokenBase * BigInt(u.inputTokens),
            output: perTokenBase * BigInt(u.outputTokens),
          });
          let position = BigInt(accumulated);
          let feeOfParts = 0n;
          let slicesOfParts = 0;
          for (const usage of parts) {
            const result = priceRequest({
              meter,
              usage,
              baseCost: baseOf(usage),
              accumulatedUnits: position,
              serviceChargeRate: 0n,
              baseCostCharged: true,
            });
            feeOfParts += result.fee.amount;
            slicesOfParts += result.fee.breakdown.length;
            position = result.accumulatedUnits;
          }
          const whole = parts.reduce((sum, u) => sumUsage(sum, u));
          const wholeResult = priceRequest({
            meter,
            usage: whole,
            baseCost: baseOf(whole),
            accumulatedUnits: BigInt(accumulated),
            serviceChargeRate: 0n,
            baseCostCharged: true,
          });
          expect(wholeResult.accumulatedUnits).toBe(position);
          const difference = feeOfParts - wholeResult.fee.amount;
          const tolerance = BigInt(slicesOfParts);
          expect(difference <= tolerance && difference >= -tolerance).toBe(true);
        },
      ),
      { numRuns: 300 },
    );
  });

  it('wallet + merchant = request total, and no amount is negative', () => {
    fc.assert(
      fc.property(
        meterArb(['tokens_1m', 'characters_1m', 'minutes', 'requests'], ['fixed', 'percentage'], 5000),
        usageArb,
        baseCostArb,
        fc.bigInt({ min: 0n, max: 10n ** 7n }),
        fc.bigInt({ min: 0n, max: 100n * UNIT }),
        fc.boolean(),
        (meter, usage, base, accumulated, serviceChargeRate, baseCostCharged) => {
          const result = priceRequest({ meter, usage, baseCost: base, accumulatedUnits: accumulated, serviceChargeRate, baseCostCharged });
          const { wallet, merchant, request } = result.totals;
          expect(wallet + merchant).toBe(request);
          const charged = baseCostCharged ? result.baseCost.total : 0n;
          expect(request).toBe(charged + result.fee.amount + result.serviceCharge.amount);
          expect(result.fee.amount).toBe(result.fee.breakdown.reduce((sum, item) => sum + item.cost, 0n));
          expect(result.baseCost.total).toBe(result.baseCost.input + result.baseCost.output);
          const amounts = [wallet, merchant, request, result.fee.amount, result.serviceCharge.amount, ...result.fee.breakdown.map((i) => i.cost)];
          expect(amounts.every((amount) => amount >= 0n)).toBe(true);
          expect(wallet >= result.fee.amount).toBe(true); // the fee is always the wallet's
        },
      ),
      { numRuns: 400 },
    );
  });
});

function sumUsage(a: Usage, b: Usage): Usage {
  const seconds = (x: string, y: string) => formatMicros(toMicros(x) + toMicros(y));
  return {
    inputTokens: a.inputTokens + b.inputTokens,
    outputTokens: a.outputTokens + b.outputTokens,
    inputCharacters: a.inputCharacters + b.inputCharacters,
    outputCharacters: a.outputCharacters + b.outputCharacters,
    inputSeconds: seconds(a.inputSeconds, b.inputSeconds),
    outputSeconds: seconds(a.outputSeconds, b.outputSeconds),
  };
}

function toMicros(seconds: string): bigint {
  const [whole = '0', fraction = ''] = seconds.split('.');
  return BigInt(whole) * 1_000_000n + BigInt(fraction.padEnd(6, '0'));
}
