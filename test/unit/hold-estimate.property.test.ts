import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { UNIT } from '../../src/domain/money.ts';
import { baseCost, priceRequest, type MeterPricing, type RateType, type TierType, type Usage } from '../../src/domain/pricing.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';

/**
 * A hold is an upper bound of what its request can cost (decision 0019) wherever the request falls
 * in its meter's tiers when it settles, including tiers whose rates rise with use.
 */
const PRICES = lookupBasePrices('openai', 'gpt-4o');

const meterArb = fc
  .record({
    tierType: fc.constantFrom<TierType>('tokens_1m', 'requests'),
    rateType: fc.constantFrom<RateType>('fixed', 'percentage'),
    tokenBasis: fc.constantFrom('input+output' as const, 'output' as const),
    baseCostPayer: fc.constantFrom('wallet' as const, 'merchant' as const),
    serviceChargePayer: fc.constantFrom('wallet' as const, 'merchant' as const),
    starts: fc.uniqueArray(fc.integer({ min: 1, max: 5000 }), { maxLength: 4 }),
    rates: fc.array(fc.bigInt({ min: 0n, max: 50n * UNIT }), { minLength: 5, maxLength: 5 }),
  })
  .map(({ starts, rates, ...kind }): MeterPricing => ({
    ...kind,
    tiers: [0, ...starts.sort((a, b) => a - b)].map((start, i) => ({ start, rate: rates[i]! })),
  }));

describe('hold estimates over tiered meters', () => {
  it('hold at least what the usage they were estimated for costs at any tier position', () => {
    fc.assert(
      fc.property(
        meterArb,
        fc.integer({ min: 0, max: 300 }),
        fc.integer({ min: 1, max: 4000 }),
        fc.bigInt({ min: 0n, max: 10_000n }),
        fc.bigInt({ min: 0n, max: 30n * UNIT }),
        (meter, words, maxTokens, accumulated, serviceChargeRate) => {
          const requestBody = { model: 'gpt-4o', max_tokens: maxTokens, messages: [{ role: 'user', content: 'word '.repeat(words) }] };
          const hold = estimateHold({ requestBody, pricing: meter, prices: PRICES, baseCostCharged: true, serviceChargeRate });
          const usage: Usage = {
            inputTokens: hold.charge.input_tokens,
            outputTokens: hold.charge.output_tokens,
            inputCharacters: hold.charge.input_characters,
            outputCharacters: 0,
            inputSeconds: '0',
            outputSeconds: '0',
          };
          const settled = priceRequest({ meter, usage, baseCost: baseCost(PRICES!, usage), accumulatedUnits: accumulated, serviceChargeRate, baseCostCharged: true });
          expect(settled.totals.wallet).toBeLessThanOrEqual(hold.wallet);
          expect(settled.totals.merchant).toBeLessThanOrEqual(hold.merchant);
        },
      ),
      { numRuns: 500 },
    );
  });

  it('hold a request on a meter whose rate rises after the first request at the higher rate', () => {
    const rising: MeterPricing = {
      rateType: 'fixed',
      tierType: 'requests',
      tokenBasis: 'input+output',
      baseCostPayer: 'merchant',
      serviceChargePayer: 'merchant',
      tiers: [
        { start: 0, rate: UNIT / 10n },
        { start: 1, rate: UNIT },
      ],
    };
    const hold = estimateHold({ requestBody: { model: 'gpt-4o', max_tokens: 10, messages: [] }, pricing: rising, prices: PRICES, baseCostCharged: true, serviceChargeRate: 0n });
    expect(hold.wallet).toBe(UNIT);
  });
});
