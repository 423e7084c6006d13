import { describe, expect, it } from 'vitest';
import { ProviderContextSizes } from '../../src/gateway/provider-context.ts';
import { DEFAULT_HOLD_RULES } from '../../src/providers/estimate.ts';
import { google } from '../../src/providers/google.ts';
import { anthropic } from '../../src/providers/anthropic.ts';

/** Which provider-side context a request names, and what a settled request teaches about its size (decision 0025). */
describe('provider-side context sizes', () => {
  const openai = DEFAULT_HOLD_RULES;
  const googleRules = google.holdRules!;

  it('names the Responses API conversation, a conversation object and a stored prompt by version; Gemini cached content in either case; nothing for Anthropic', () => {
    expect(ProviderContextSizes.referencesOf('m1', openai, { previous_response_id: 'resp_1', input: 'x' })).toEqual(['m1:openai:response:resp_1']);
    expect(ProviderContextSizes.referencesOf('m1', openai, { conversation: { id: 'conv_1' }, prompt: { id: 'pmpt_1', version: '2' } })).toEqual([
      'm1:openai:conversation:conv_1',
      'm1:openai:prompt:pmpt_1:2',
    ]);
    expect(ProviderContextSizes.referencesOf('m1', openai, { conversation: 'conv_2', prompt: { id: 'pmpt_1' } })).toEqual(['m1:openai:conversation:conv_2', 'm1:openai:prompt:pmpt_1:latest']);
    expect(ProviderContextSizes.referencesOf('m1', openai, { previous_response_id: '', prompt: 'not an object', messages: [] })).toEqual([]);
    expect(ProviderContextSizes.referencesOf('m1', googleRules, { cachedContent: 'cachedContents/a' })).toEqual(['m1:google:cachedContent:cachedContents/a']);
    expect(ProviderContextSizes.referencesOf('m1', googleRules, { cached_content: 'cachedContents/b' })).toEqual(['m1:google:cachedContent:cachedContents/b']);
    expect(ProviderContextSizes.referencesOf('m1', anthropic.holdRules!, { previous_response_id: 'resp_1' })).toEqual([]);
  });

  it('holds the allowance for a context never seen, then what usage showed: a response its input and output, a named context the input that carried it', () => {
    const sizes = new ProviderContextSizes();
    const first = { merchantId: 'm1', keys: [], rules: openai };
    sizes.learn(first, { inputTokens: 9_000, outputTokens: 900, responseId: 'resp_1' });
    const followUp = ProviderContextSizes.referencesOf('m1', openai, { previous_response_id: 'resp_1' });
    expect(sizes.tokensFor(followUp, 32_000)).toBe(9_900);
    // Another merchant naming the same id learns nothing from the first one's usage.
    expect(sizes.tokensFor(ProviderContextSizes.referencesOf('m2', openai, { previous_response_id: 'resp_1' }), 32_000)).toBe(32_000);
    // A chat completion's id names no context.
    sizes.learn(first, { inputTokens: 5, outputTokens: 5, responseId: 'chatcmpl-1' });
    expect(sizes.tokensFor(['m1:openai:response:chatcmpl-1'], 7)).toBe(7);

    const cached = { merchantId: 'm1', keys: ProviderContextSizes.referencesOf('m1', googleRules, { cachedContent: 'cachedContents/a' }), rules: googleRules };
    expect(sizes.tokensFor(cached.keys, 32_000)).toBe(32_000);
    sizes.learn(cached, { inputTokens: 50_004, outputTokens: 8, responseId: 'abc' });
    expect(sizes.tokensFor(cached.keys, 32_000)).toBe(50_004);
  });

  it('forgets the least recently learned context first once full', () => {
    const sizes = new ProviderContextSizes(2);
    const learn = (id: string) => sizes.learn({ merchantId: 'm', keys: [], rules: openai }, { inputTokens: 10, outputTokens: 1, responseId: id });
    learn('resp_a');
    learn('resp_b');
    learn('resp_a');
    learn('resp_c');
    expect(sizes.tokensFor(['m:openai:response:resp_a', 'm:openai:response:resp_b', 'm:openai:response:resp_c'], 0)).toBe(22);
    expect(sizes.tokensFor(['m:openai:response:resp_b'], 0)).toBe(0);
  });
});
