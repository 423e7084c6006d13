import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../src/config.ts';
import { estimateHold } from '../../src/gateway/hold-estimate.ts';
import { MERCHANT_ONLY_PRICING } from '../../src/ledger/decide/charge.ts';
import { lookupBasePrices } from '../../src/domain/base-prices.ts';
import { DEFAULT_HOLD_RULES, DEFAULT_REFERENCE_HOLD_TOKENS, mediaInputTokens } from '../../src/providers/estimate.ts';
import { BUILTIN_PROVIDERS } from '../../src/providers/builtin.ts';

/**
 * What a request's media are held for (decision 0019): images at their provider's per-image
 * maximum, inline audio, video and documents by their size, and audio, video and documents named
 * by reference at the operator's allowance (MEDIA_REFERENCE_HOLD_TOKENS).
 */
const rulesOf = (id: string) => BUILTIN_PROVIDERS.find((p) => p.id === id)?.holdRules?.media ?? DEFAULT_HOLD_RULES.media;
const user = (content: unknown[]) => ({ messages: [{ role: 'user', content }] });

describe('media held by their provider\'s rules', () => {
  it('holds an image at the per-image maximum decision 0019 states: OpenAI 2,700, Anthropic 1,600, Gemini 4,000, by URL or inline', () => {
    expect(mediaInputTokens(user([{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }]), rulesOf('openai'))).toBe(2_700);
    expect(mediaInputTokens(user([{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }]), rulesOf('anthropic'))).toBe(1_600);
    const gemini = { contents: [{ parts: [{ fileData: { mimeType: 'image/png', fileUri: 'https://generativelanguage.googleapis.com/v1beta/files/a' } }, { inlineData: { mimeType: 'image/jpeg', data: 'AAAA' } }] }] };
    expect(mediaInputTokens(gemini, rulesOf('google'))).toBe(8_000);
  });

  it('holds inline audio, video and documents by what their bytes can hold: 4 kbit/s audio, 50 kbit/s video, a token a byte (two on Anthropic)', () => {
    const bytes = (n: number) => Buffer.alloc(n).toString('base64');
    // 999 bytes of audio: under 2 s at 4 kbit/s, 25 tokens a second on OpenAI.
    expect(mediaInputTokens(user([{ type: 'input_audio', input_audio: { data: bytes(999), format: 'wav' } }]), rulesOf('openai'))).toBe(50);
    // 12,498 bytes of video: under 2 s at 50 kbit/s, 300 tokens a second on Gemini.
    expect(mediaInputTokens({ contents: [{ parts: [{ inlineData: { mimeType: 'video/mp4', data: bytes(12_498) } }] }] }, rulesOf('google'))).toBe(600);
    expect(mediaInputTokens(user([{ type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: bytes(3_000) } }]), rulesOf('anthropic'))).toBe(6_000);
    expect(mediaInputTokens(user([{ type: 'file', file: { file_data: `data:application/pdf;base64,${bytes(3_000)}` } }]), rulesOf('openai'))).toBe(3_000);
  });

  it('holds audio, video and documents named by reference at the allowance, 10,000 unless the operator says otherwise', () => {
    const openai = user([{ type: 'file', file: { file_id: 'file-abc' } }]);
    const anthropic = user([{ type: 'document', source: { type: 'file', file_id: 'file_abc' } }]);
    const gemini = { contents: [{ parts: [{ fileData: { mimeType: 'video/mp4', fileUri: 'https://generativelanguage.googleapis.com/v1beta/files/v' } }] }] };
    expect(DEFAULT_REFERENCE_HOLD_TOKENS).toBe(10_000);
    expect(mediaInputTokens(openai, rulesOf('openai'))).toBe(10_000);
    expect(mediaInputTokens(anthropic, rulesOf('anthropic'))).toBe(10_000);
    expect(mediaInputTokens(gemini, rulesOf('google'))).toBe(10_000);
    expect(mediaInputTokens(gemini, rulesOf('google'), 250_000)).toBe(250_000);
  });

  it('MEDIA_REFERENCE_HOLD_TOKENS sizes the hold of a request naming a document by reference', () => {
    expect(loadConfig({}).mediaReferenceHoldTokens).toBe(10_000);
    const config = loadConfig({ MEDIA_REFERENCE_HOLD_TOKENS: '200000' });
    expect(config.mediaReferenceHoldTokens).toBe(200_000);
    expect(() => loadConfig({ MEDIA_REFERENCE_HOLD_TOKENS: '-1' })).toThrow();
    const body = { model: 'gpt-4o', max_tokens: 1, ...user([{ type: 'file', file: { file_id: 'file-abc' } }]) };
    const holdWith = (referenceTokens?: number) =>
      estimateHold({
        requestBody: body,
        pricing: MERCHANT_ONLY_PRICING,
        prices: lookupBasePrices('openai', 'gpt-4o'),
        baseCostCharged: true,
        serviceChargeRate: 0n,
        ...(referenceTokens === undefined ? {} : { referenceTokens }),
      }).charge.input_tokens;
    expect(holdWith(config.mediaReferenceHoldTokens) - holdWith()).toBe(190_000);
  });
});
