import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { catalogPrices, lookupBasePrices, parsePriceOverrides } from '../../src/domain/base-prices.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { baseCost, formatMicros, priceUnitOf } from '../../src/domain/pricing.ts';
import { google } from '../../src/providers/google.ts';

/** Exact half-up of a non-negative rational n / d, as the reference for every rounding here. */
const halfUp = (n: bigint, d: bigint) => (2n * n + d) / (2n * d);

describe('media prices', () => {
  it('the bundled catalog prices whisper-1 per minute of audio (0.36 an hour = 0.006 a minute)', () => {
    expect(catalogPrices('openai', 'whisper-1')).toEqual({ input: 0n, output: 0n, perMinute: parseMoney('0.006') });
  });

  it('PRICE_OVERRIDES_FILE takes per-minute, per-image and per-1M-character prices, alone or beside token prices', () => {
    const table = parsePriceOverrides({
      'openai/whisper-1': { perMinute: '0.01' },
      'openai/dall-e-3': { perImage: '0.04' },
      'openai/tts-1': { perMillionCharacters: '15' },
      'openai/gpt-image-1': { input: '5', output: '40', perImage: '0.011' },
    });
    expect(lookupBasePrices('openai', 'whisper-1', { overrides: table })).toEqual({ input: 0n, output: 0n, perMinute: parseMoney('0.01') });
    expect(lookupBasePrices('openai', 'dall-e-3', { overrides: table })).toEqual({ input: 0n, output: 0n, perImage: parseMoney('0.04') });
    expect(lookupBasePrices('openai', 'tts-1', { overrides: table })).toEqual({ input: 0n, output: 0n, perMillionCharacters: parseMoney('15') });
    expect(lookupBasePrices('openai', 'gpt-image-1', { overrides: table })).toMatchObject({ input: parseMoney('5'), perImage: parseMoney('0.011') });
  });

  it('an override with no price at all, or a malformed media price, fails at load', () => {
    expect(() => parsePriceOverrides({ 'openai/x': {} })).toThrow(/input must be a decimal/);
    expect(() => parsePriceOverrides({ 'openai/x': { perMinute: '0.0060000000001' } })).toThrow(/perMinute/);
    expect(() => parsePriceOverrides({ 'openai/x': { perImage: '-1' } })).toThrow(/perImage/);
  });

  it('a request pays by the media unit its model has a price for and it used, else by tokens', () => {
    const prices = { input: 1n, output: 1n, perMinute: 1n, perImage: 1n, perMillionCharacters: 1n };
    const none = { inputTokens: 5, outputTokens: 5 };
    expect(priceUnitOf(prices, { ...none, inputSeconds: '1.5' })).toBe('minutes');
    expect(priceUnitOf(prices, { ...none, outputImages: 2 })).toBe('images');
    expect(priceUnitOf(prices, { ...none, inputCharacters: 11 })).toBe('characters');
    expect(priceUnitOf(prices, none)).toBe('tokens');
    // Seconds of audio with no per-minute price (gpt-4o-transcribe, priced per token): tokens.
    expect(priceUnitOf({ input: 1n, output: 1n }, { ...none, inputSeconds: '42' })).toBe('tokens');
  });

  it('per-minute, per-image and per-character costs are exact, rounded half-up once per side', () => {
    const price = fc.bigInt({ min: 0n, max: 10n ** 14n });
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 10n ** 12n }), fc.bigInt({ min: 0n, max: 10n ** 12n }), price, (inMicros, outMicros, perMinute) => {
        const cost = baseCost({ input: 0n, output: 0n, perMinute }, { inputTokens: 0, outputTokens: 0, inputSeconds: formatMicros(inMicros), outputSeconds: formatMicros(outMicros) });
        if (inMicros + outMicros === 0n) return expect(cost.unit).toBe('tokens');
        expect(cost).toEqual({ input: halfUp(inMicros * perMinute, 60_000_000n), output: halfUp(outMicros * perMinute, 60_000_000n), total: cost.input + cost.output, unit: 'minutes' });
      }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 10_000 }), price, (images, perImage) => {
        expect(baseCost({ input: 0n, output: 0n, perImage }, { inputTokens: 0, outputTokens: 0, outputImages: images })).toEqual({
          input: 0n,
          output: BigInt(images) * perImage,
          total: BigInt(images) * perImage,
          unit: 'images',
        });
      }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 10_000_000 }), price, (characters, perMillion) => {
        const cost = baseCost({ input: 0n, output: 0n, perMillionCharacters: perMillion }, { inputTokens: 0, outputTokens: 0, inputCharacters: characters });
        expect(cost).toEqual({ input: halfUp(BigInt(characters) * perMillion, 1_000_000n), output: 0n, total: cost.input, unit: 'characters' });
      }),
    );
  });
});

describe('audio input tokens', () => {
  it('are priced at the audio input price, the rest of the input at the plain one', () => {
    const prices = { input: parseMoney('2.5'), output: parseMoney('10'), audioInput: parseMoney('6') };
    // 100 text + 400 audio input tokens, 10 output: (100 × 2.5 + 400 × 6 + 10 × 10) per 1M.
    expect(baseCost(prices, { inputTokens: 500, audioInputTokens: 400, outputTokens: 10 })).toEqual({
      input: parseMoney('0.00265'),
      output: parseMoney('0.0001'),
      total: parseMoney('0.00275'),
      unit: 'tokens',
    });
    expect(() => baseCost(prices, { inputTokens: 5, audioInputTokens: 4, cachedInputTokens: 2, outputTokens: 0 })).toThrow(RangeError);
  });

  it('the catalog gives gpt-4o-transcribe and gemini-2.5-flash their audio input prices', () => {
    expect(catalogPrices('openai', 'gpt-4o-transcribe')?.audioInput).toBe(parseMoney('6'));
    expect(catalogPrices('google', 'gemini-2.5-flash')?.audioInput).toBe(parseMoney('1'));
  });

  it('Gemini reports them in promptTokensDetails by modality', () => {
    const url = new URL('https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent');
    const usage = google.usageFromJson(
      { usageMetadata: { promptTokenCount: 130, candidatesTokenCount: 5, promptTokensDetails: [{ modality: 'TEXT', tokenCount: 10 }, { modality: 'AUDIO', tokenCount: 120 }] } },
      { now: Date.now(), url, requestBody: {} },
    );
    expect(usage).toMatchObject({ inputTokens: 130, audioInputTokens: 120, outputTokens: 5 });
  });
});
