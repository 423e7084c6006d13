import { describe, expect, it } from 'vitest';
import { routeModel } from '../../src/gateway/drop-in.ts';
import { managedKeyFor } from '../../src/gateway/forward.ts';
import { checkRequestShape } from '../../src/gateway/spend-key-guard.ts';
import { providerAllowed } from '../../src/ledger/spend-key-limits.ts';
import { createRegistry } from '../../src/providers/index.ts';

/**
 * Provider quirks live in the provider modules (decision 0003): which model names a provider serves on
 * the drop-in endpoints, which requests stream, whose account a provider shares. The gateway reads
 * them through the ProviderModule contract only.
 */
const registry = createRegistry({ custom: [{ id: 'local', baseUrl: 'http://10.0.0.5:8000/v1' }] });
const gateway = { registry };

describe('provider quirks through the ProviderModule contract', () => {
  it('routes bare model names by the module that declares them', () => {
    const routed = (model: string, shape: 'openai' | 'anthropic' = 'openai') => routeModel(gateway, model, shape).provider.id;
    expect(routed('gpt-4o-mini')).toBe('openai');
    expect(routed('o3-mini')).toBe('openai');
    expect(routed('text-embedding-3-small')).toBe('openai');
    // Gemini's embedding model is Google's, not OpenAI's, although both start with text-embedding-.
    expect(routed('text-embedding-004')).toBe('google-openai');
    expect(routed('gemini-2.5-flash')).toBe('google-openai');
    expect(routed('mistral-large-latest')).toBe('mistral');
    expect(routed('grok-3')).toBe('xai');
    expect(routed('claude-haiku-4-5', 'anthropic')).toBe('anthropic');
    expect(routeModel(gateway, 'local/my-model', 'openai')).toMatchObject({ provider: { id: 'local' }, model: 'my-model' });
    expect(() => routed('mystery-1')).toThrow(/No provider serves model/);
  });

  it('asks each module whether a request streams: Gemini by its method, the others by the body', () => {
    const google = registry.getProvider('google')!;
    const openai = registry.getProvider('openai')!;
    const anthropic = registry.getProvider('anthropic')!;
    const gemini = (method: string) => new URL(`https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:${method}`);
    expect(google.requestsStream({}, gemini('streamGenerateContent'))).toBe(true);
    expect(google.requestsStream({ stream: true }, gemini('generateContent'))).toBe(false);
    expect(openai.requestsStream({ stream: true }, new URL('https://api.openai.com/v1/chat/completions'))).toBe(true);
    expect(openai.requestsStream({ stream: 'yes' }, new URL('https://api.openai.com/v1/chat/completions'))).toBe(false);
    expect(anthropic.requestsStream({ stream: true }, new URL('https://api.anthropic.com/v1/messages'))).toBe(true);
    expect(anthropic.requestsStream(undefined, new URL('https://api.anthropic.com/v1/messages'))).toBe(false);
  });

  it("serves a provider that shares another's account with that one's key and allow-list entry", () => {
    const googleOpenai = registry.getProvider('google-openai')!;
    expect(googleOpenai.sharesAccountWith).toBe('google');
    expect(managedKeyFor({ providerKeys: { google: 'g-key' } }, googleOpenai)).toBe('g-key');
    expect(managedKeyFor({ providerKeys: { google: 'g-key', 'google-openai': 'own' } }, googleOpenai)).toBe('own');
    expect(managedKeyFor({ providerKeys: { google: 'g-key' } }, registry.getProvider('openai')!)).toBeUndefined();
    const key = { allowed_providers: JSON.stringify(['google']) };
    expect(providerAllowed(key, googleOpenai.id, googleOpenai.sharesAccountWith)).toBe(true);
    // Not the other way round: allowing the OpenAI-compatible path does not allow the native API.
    expect(providerAllowed({ allowed_providers: JSON.stringify(['google-openai']) }, 'google')).toBe(false);
  });

  it("lets openai-shaped spend keys call Gemini's native API, and anthropic-shaped ones only Anthropic", () => {
    expect(() => checkRequestShape({ request_shape: 'openai' }, 'google')).not.toThrow();
    expect(() => checkRequestShape({ request_shape: 'anthropic' }, 'google')).toThrow(/anthropic-shaped/);
    expect(() => checkRequestShape({ request_shape: 'openai' }, 'elevenlabs')).toThrow(/openai-shaped/);
  });
});
