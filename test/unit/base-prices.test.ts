import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { catalogPrices, lookupBasePrices, parsePriceOverrides } from '../../src/domain/base-prices.ts';
import { demo } from '../../src/providers/demo.ts';

// Catalog numbers come from the bundled @pydantic/genai-prices data; `at` pins dated prices.
const at = new Date('2025-06-01T00:00:00Z');

describe('lookupBasePrices', () => {
  it('finds a catalog model and converts its per-1M prices exactly', () => {
    // gpt-4o: input 2.5, cache read 1.25, output 10 per 1M tokens.
    expect(lookupBasePrices('openai', 'gpt-4o', { at })).toEqual({
      input: parseMoney('2.5'),
      output: parseMoney('10'),
      cachedInput: parseMoney('1.25'),
    });
  });

  it('takes the catalog cache-write price where the model has one', () => {
    // claude-sonnet-4-0: input 3, cache write 3.75, cache read 0.3, output 15 per 1M tokens.
    expect(lookupBasePrices('anthropic', 'claude-sonnet-4-0', { at })).toEqual({
      input: parseMoney('3'),
      output: parseMoney('15'),
      cachedInput: parseMoney('0.3'),
      cacheWriteInput: parseMoney('3.75'),
    });
  });

  it("prices the demo provider's model at its own price, after the operator's override", () => {
    expect(lookupBasePrices('demo', 'demo-chat', { ownPrices: demo.ownPrices })).toEqual({ input: parseMoney('1'), output: parseMoney('2') });
    const overrides = parsePriceOverrides({ 'demo/demo-chat': { input: '0.1', output: '0.2' } });
    expect(lookupBasePrices('demo', 'demo-chat', { overrides, ownPrices: demo.ownPrices })).toEqual({ input: parseMoney('0.1'), output: parseMoney('0.2') });
    expect(lookupBasePrices('demo', 'demo-unknown', { ownPrices: demo.ownPrices })).toBeNull();
  });

  it('matches provider and model case-insensitively, as the catalog does', () => {
    expect(lookupBasePrices('OpenAI', 'GPT-4o', { at })).toEqual(lookupBasePrices('openai', 'gpt-4o', { at }));
  });

  it('picks the prompt-size tier the request falls in', () => {
    // gemini-2.5-pro: base input 1.25 per 1M; above 200k prompt tokens the whole request pays 2.5.
    const small = catalogPrices('google', 'gemini-2.5-pro', { at, inputTokens: 1000 });
    const large = catalogPrices('google', 'gemini-2.5-pro', { at, inputTokens: 300_000 });
    expect(small?.input).toBe(parseMoney('1.25'));
    expect(large?.input).toBe(parseMoney('2.5'));
  });

  it('returns null for an unknown model or provider', () => {
    expect(lookupBasePrices('openai', 'no-such-model-xyz', { at })).toBeNull();
    expect(lookupBasePrices('no-such-provider', 'gpt-4o', { at })).toBeNull();
  });

  it('an operator override wins over the catalog, whole', () => {
    const overrides = parsePriceOverrides({ 'openai/gpt-4o': { input: '1.0000000001', output: '3' } });
    // No cachedInput in the override: the catalog's 1.25 is not mixed in.
    expect(lookupBasePrices('openai', 'gpt-4o', { at, overrides })).toEqual({ input: 10_000_000_001n, output: parseMoney('3') });
    expect(lookupBasePrices('OPENAI', 'GPT-4O', { at, overrides })?.output).toBe(parseMoney('3'));
  });

  it('an override prices a model the catalog does not know, including models with a slash', () => {
    const overrides = parsePriceOverrides({
      'acme/llama/3-70b': { input: '0.5', output: '0.75', cachedInput: '0.1' },
    });
    expect(lookupBasePrices('acme', 'llama/3-70b', { overrides })).toEqual({
      input: parseMoney('0.5'),
      output: parseMoney('0.75'),
      cachedInput: parseMoney('0.1'),
    });
    expect(lookupBasePrices('acme', 'other', { overrides })).toBeNull();
  });

  it('rejects malformed overrides at parse time', () => {
    expect(() => parsePriceOverrides({ 'gpt-4o': { input: '1', output: '1' } })).toThrow(/provider\/model/);
    expect(() => parsePriceOverrides({ 'openai/x': { input: '-1', output: '1' } })).toThrow(RangeError);
    expect(() => parsePriceOverrides({ 'openai/x': { input: '1.00000000001', output: '1' } })).toThrow(RangeError);
    expect(() => parsePriceOverrides({ 'openai/x': { input: '1e3', output: '1' } })).toThrow(RangeError);
  });
});
