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

// Reference computations are deliberately naive: they walk usage one unit at a time (or intersect
// intervals) and keep exact rationals until the single rounding per tier.

const PERCENT = 100n * UNIT;

/** Half-up for non-negative rationals, written independently of money.ts. */
function roundHalfUp(numerator: bigint, denominator: bigint): bigint {
  return (2n * numerator + denominator) / (2n * denominator);
}

function tierIndexAt(starts: readonly bigint[], position: bigint): number {
  let index = 0;
  starts.forEach((start, i) => {
    if (start <= position) index = i;
  });
  return index;
}

interface ReferenceSlice {
  tierIndex: number;
  units: bigint;
  cost: bigint;
}

/**
 * Reference fee: count units per tier one position at a time, then cost each tier's count.
 * fixed: rate × count / denominator. percentage: rate% × basis base × count / request units.
 */
function referenceSlices(args: {
  rateType: RateType;
  tiers: readonly Tier[];
  starts: readonly bigint[];
  from: bigint;
  units: bigint;
  denominator: bigint;
  basisBase: bigint;
}): ReferenceSlice[] {
  const counts = new Map<number, bigint>();
  if (args.units === 0n) counts.set(tierIndexAt(args.starts, args.from), 0n);
  for (let position = args.from; position < args.from + args.units; position++) {
    const index = tierIndexAt(args.starts, position);
    counts.set(index, (counts.get(index) ?? 0n) + 1n);
  }
  return [...counts.entries()].map(([tierIndex, units]) => {
    const rate = args.tiers[tierIndex]!.rate;
    const cost =
      args.rateType === 'fixed'
        ? roundHalfUp(rate * units, args.denominator)
        : args.units === 0n
          ? roundHalfUp(rate * args.basisBase, PERCENT)
          : roundHalfUp(rate * args.basisBase * units, PERCENT * args.units);
    return { tierIndex, units, cost };
  });
}

/** Reference by interval intersection, for microsecond positions too many to walk one by one. */
function referenceSlicesByOverlap(args: {
  tiers: readonly Tier[];
  starts: readonly bigint[];
  from: bigint;
  units: bigint;
  denominator: bigint;
}): ReferenceSlice[] {
  const end = args.from + args.units;
  const slices: ReferenceSlice[] = [];
  args.tiers.forEach((tier, tierIndex) => {
    const low = args.starts[tierIndex]!;
    const high = args.starts[tierIndex + 1] ?? end;
    const overlap = (high < end ? high : end) - (low > args.from ? low : args.from);
    if (overlap > 0n) slices.push({ tierIndex, units: overlap, cost: roundHalfUp(tier.rate * overlap, args.denominator) });
  });
  return slices;
}

// ---------------------------------------------------------------------------------------------
// Arbitraries

const payer = fc.constantFrom<Payer>('wallet', 'merchant');
const tokenBasis = fc.constantFrom<TokenBasis>('input+output', 'output');

/** Ascending integer starts beginning at 0 (in the meter's display unit). */
const starts = (max: number) =>
  fc.uniqueArray(fc.integer({ min: 1, max }), { maxLength: 4 }).map((rest) => [0, ...rest.sort((a, b) => a - b)]);

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

function breakdownUnits(result: PricedRequest, tierType: TierType): bigint[] {
  return result.fee.breakdown.map((item) => {
    if (tierType === 'tokens_1m') return BigInt(item.tokens);
    if (tierType === 'characters_1m') return BigInt(item.characters);
    return 0n;
  });
}

// ---------------------------------------------------------------------------------------------

describe('pricing properties', () => {
  it('the fee equals a unit-by-unit reference (tokens, characters, requests)', () => {
    fc.assert(
      fc.property(
        meterArb(['tokens_1m', 'characters_1m', 'requests'], ['fixed', 'percentage'], 5000),
        usageArb,
        baseCostArb,
        fc.integer({ min: 0, max: 6000 }),
        (meter, usage, base, accumulated) => {
          const result = priceRequest({
            meter,
            usage,
            baseCost: base,
            accumulatedUnits: BigInt(accumulated),
            serviceChargeRate: 0n,
            baseCostCharged: true,
          });
          const units =
            meter.tierType === 'requests'
              ? 1n
              : meter.tierType === 'characters_1m'
                ? BigInt(usage.inputCharacters + usage.outputCharacters)
                : BigInt((meter.tokenBasis === 'output' ? 0 : usage.inputTokens) + usage.outputTokens);
          const expected = referenceSlices({
            rateType: meter.rateType,
            tiers: meter.tiers,
            starts: meter.tiers.map((tier) => BigInt(tier.start)),
            from: BigInt(accumulated),
            units,
            denominator: meter.tierType === 'requests' ? 1n : 1_000_000n,
            basisBase: basisBase(meter, base),
          });
          expect(result.fee.breakdown.map((item) => item.cost)).toEqual(expected.map((slice) => slice.cost));
          expect(result.fee.breakdown.map((item) => item.tier.start)).toEqual(
            expected.map((slice) => meter.tiers[slice.tierIndex]!.start),
          );
          if (meter.tierType !== 'requests') {
            expect(breakdownUnits(result, meter.tierType)).toEqual(expected.map((slice) => slice.units));
          }
          expect(result.fee.amount).toBe(expected.reduce((sum, slice) => sum + slice.cost, 0n));
          expect(result.accumulatedUnits).toBe(BigInt(accumulated) + units);
        },
      ),
      { numRuns: 400 },
    );
  });

  it('the fee equals an interval-overlap reference for minute meters (microsecond positions)', () => {
    fc.assert(
      fc.property(
        meterArb(['minutes'], ['fixed'], 10),
        usageArb,
        fc.integer({ min: 0, max: 900_000_000 }),
        (meter, usage, accumulated) => {
          const result = priceRequest({
            meter,
            usage,
            baseCost: { input: 0n, output: 0n },
            accumulatedUnits: BigInt(accumulated),
            serviceChargeRate: 0n,
            baseCostCharged: true,
          });
          const units = toMicros(usage.inputSeconds) + toMicros(usage.outputSeconds);
          const expected = referenceSlicesByOverlap({
            tiers: meter.tiers,
            starts: meter.tiers.map((tier) => BigInt(tier.start) * 60_000_000n),
            from: BigInt(accumulated),
            units,
            denominator: 60_000_000n,
          });
          if (units > 0n) {
            expect(result.fee.breakdown.map((item) => item.cost)).toEqual(expected.map((slice) => slice.cost));
            expect(result.fee.breakdown.map((item) => toMicros(item.seconds))).toEqual(expected.map((slice) => slice.units));
          } else {
            expect(result.fee.amount).toBe(0n);
          }
        },
      ),
      { numRuns: 300 },
    );
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
