import { describe, expect, it } from 'vitest';
import {
  createRegistry,
  findProvider,
  listProviders,
  ProviderConfigError,
  type HeaderTarget,
} from '../../src/providers/index.ts';

/** The 28 provider bases of the official client's `providers` map (SDK 11.2), with our ids. */
const SDK_BASES: readonly [base: string, id: string][] = [
  ['https://api.openai.com/v1', 'openai'],
  ['https://api.anthropic.com/v1', 'anthropic'],
  ['https://api.mistral.ai/v1', 'mistral'],
  ['https://api.deepseek.com/v1', 'deepseek'],
  ['https://api.x.ai/v1', 'xai'],
  ['https://generativelanguage.googleapis.com/v1beta', 'google'],
  ['https://generativelanguage.googleapis.com/v1beta/openai', 'google-openai'],
  ['https://api.kluster.ai/v1', 'kluster'],
  ['https://api.inference.net/v1', 'inference'],
  ['https://api.groq.com/openai/v1', 'groq'],
  ['https://api.novita.ai/v3/openai', 'novita'],
  ['https://api.v0.dev/v1', 'vercel'],
  ['https://api.together.xyz/v1', 'together'],
  ['https://api.hyperbolic.xyz/v1', 'hyperbolic'],
  ['https://api.elevenlabs.io/v1', 'elevenlabs'],
  ['https://api.sambanova.ai/v1', 'sambanova'],
  ['https://api.deepinfra.com/v1/openai', 'deepinfra'],
  ['https://api.cohere.ai/compatibility/v1', 'cohere'],
  ['https://api.parasail.io/v1', 'parasail'],
  ['https://api.studio.nebius.com/v1', 'nebius'],
  ['https://api.fireworks.ai/inference/v1', 'fireworks'],
  ['https://api.embercloud.ai/v1', 'embercloud'],
  ['https://api.cerebras.ai/v1', 'cerebras'],
  ['https://api.targon.com/v1', 'targon'],
  ['https://api.gmi-serving.com/v1', 'gmicloud'],
  ['https://llm.chutes.ai/v1', 'chutes'],
  ['https://inference.baseten.co/v1', 'baseten'],
  ['https://api.moonshot.ai/v1', 'moonshot'],
];

describe('provider registry: host matching', () => {
  it('lists exactly the 28 SDK providers and the offline demo, with unique ids', () => {
    const ids = listProviders().map((provider) => provider.id);
    expect(ids).toHaveLength(29);
    expect(new Set(ids).size).toBe(29);
    expect([...ids].sort()).toEqual([...SDK_BASES.map(([, id]) => id), 'demo'].sort());
  });

  it.each(SDK_BASES)('matches %s (as the SDK builds it: base + path) to %s', (base, id) => {
    expect(findProvider(new URL(base))?.id).toBe(id);
    expect(findProvider(new URL(`${base}/`))?.id).toBe(id);
    expect(findProvider(new URL(`${base}/chat/completions`))?.id).toBe(id);
    expect(findProvider(new URL(`${base}/models?limit=5`))?.id).toBe(id);
  });

  it('documents each base URL it matches', () => {
    for (const [base, id] of SDK_BASES) {
      expect(listProviders().find((provider) => provider.id === id)?.baseUrl).toBe(base);
    }
  });

  it('splits the shared Google host by path: native API vs /v1beta/openai', () => {
    const host = 'https://generativelanguage.googleapis.com';
    expect(findProvider(new URL(`${host}/v1beta/models/gemini-2.5-flash:generateContent`))?.id).toBe('google');
    expect(findProvider(new URL(`${host}/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse`))?.id).toBe('google');
    expect(findProvider(new URL(`${host}/upload/v1beta/files`))?.id).toBe('google');
    expect(findProvider(new URL(`${host}/v1beta/openai/chat/completions`))?.id).toBe('google-openai');
    // Whole segments only: a look-alike segment is not the OpenAI-compatible path.
    expect(findProvider(new URL(`${host}/v1beta/openaix/chat`))?.id).toBe('google');
  });

  it('accepts the other documented bases of DeepSeek and Novita', () => {
    expect(findProvider(new URL('https://api.deepseek.com/chat/completions'))?.id).toBe('deepseek');
    expect(findProvider(new URL('https://api.novita.ai/openai/v1/chat/completions'))?.id).toBe('novita');
  });

  it('normalises what URL normalises (case of the host, default port, dot segments)', () => {
    expect(findProvider(new URL('https://API.OpenAI.com:443/v1/chat/completions'))?.id).toBe('openai');
    expect(findProvider(new URL('https://api.groq.com/openai/v1/../v1/chat/completions'))?.id).toBe('groq');
  });

  it.each([
    'https://evil.example.com/v1/chat/completions',
    'https://api.openai.com.evil.example/v1/chat/completions',
    'https://eu.api.openai.com/v1/chat/completions',
    'https://openai.com/v1/chat/completions',
    'http://api.openai.com/v1/chat/completions',
    'https://api.openai.com:8443/v1/chat/completions',
    'https://api.openai.com/v2/whatever',
    'https://api.openai.com/v1beta',
    'https://api.groq.com/v1/chat/completions',
    'https://api.cohere.ai/v2/chat',
    'https://api.deepinfra.com/v1/inference/some-model',
    'https://127.0.0.1/v1/chat/completions',
    'http://localhost:8000/v1/chat/completions',
    'https://api.openai.com/../../etc/passwd',
    'https://user:secret@api.openai.com/v1/chat/completions',
  ])('refuses %s', (target) => {
    expect(findProvider(new URL(target))).toBeNull();
  });
});

describe('provider registry: custom providers', () => {
  const registry = createRegistry({
    custom: [
      { id: 'vllm', baseUrl: 'http://10.0.0.5:8000/v1', displayName: 'Internal vLLM' },
      { id: 'corp-proxy', baseUrl: 'https://llm.corp.example/openai/', authStyle: 'x-api-key' },
    ],
  });

  it('matches an operator-declared OpenAI-compatible provider by scheme, host, port and base path', () => {
    const vllm = registry.findProvider(new URL('http://10.0.0.5:8000/v1/chat/completions'));
    expect(vllm?.id).toBe('vllm');
    expect(vllm?.custom).toBe(true);
    expect(vllm?.family).toBe('openai-compatible');
    expect(vllm?.displayName).toBe('Internal vLLM');
    expect(registry.findProvider(new URL('https://llm.corp.example/openai/v1/responses'))?.id).toBe('corp-proxy');
  });

  it('does not widen the match beyond the declared base', () => {
    expect(registry.findProvider(new URL('http://10.0.0.5:8001/v1/chat/completions'))).toBeNull();
    expect(registry.findProvider(new URL('https://10.0.0.5:8000/v1/chat/completions'))).toBeNull();
    expect(registry.findProvider(new URL('http://10.0.0.5:8000/admin'))).toBeNull();
    expect(findProvider(new URL('http://10.0.0.5:8000/v1/chat/completions'))).toBeNull();
  });

  it('keeps the built-ins and lists the custom ones after them', () => {
    expect(registry.listProviders()).toHaveLength(31);
    expect(registry.findProvider(new URL('https://api.openai.com/v1/chat/completions'))?.id).toBe('openai');
    expect(registry.getProvider('vllm')?.baseUrl).toBe('http://10.0.0.5:8000/v1');
    expect(registry.getProvider('nope')).toBeNull();
  });

  it('lets an operator override a built-in base explicitly', () => {
    const overriding = createRegistry({ custom: [{ id: 'my-openai', baseUrl: 'https://api.openai.com/v1' }] });
    expect(overriding.findProvider(new URL('https://api.openai.com/v1/chat/completions'))?.id).toBe('my-openai');
  });

  it.each([
    [{ id: 'openai', baseUrl: 'https://x.example/v1' }, /already taken/],
    [{ id: 'Bad Id', baseUrl: 'https://x.example/v1' }, /must be lower-case/],
    [{ id: 'ftp', baseUrl: 'ftp://x.example/v1' }, /http or https/],
    [{ id: 'creds', baseUrl: 'https://user:pw@x.example/v1' }, /credentials/],
    [{ id: 'query', baseUrl: 'https://x.example/v1?key=1' }, /query/],
    [{ id: 'garbage', baseUrl: 'not a url' }, /not a URL/],
  ])('rejects an invalid declaration %j', (config, message) => {
    expect(() => createRegistry({ custom: [config] })).toThrow(ProviderConfigError);
    expect(() => createRegistry({ custom: [config] })).toThrow(message);
  });

  it('rejects the same custom id twice', () => {
    const twice = [
      { id: 'dup', baseUrl: 'https://a.example/v1' },
      { id: 'dup', baseUrl: 'https://b.example/v1' },
    ];
    expect(() => createRegistry({ custom: twice })).toThrow(/already taken/);
  });
});

describe('auth injection', () => {
  const provider = (id: string) => {
    const found = createRegistry({
      custom: [{ id: 'xkey', baseUrl: 'https://x.example/v1', authStyle: 'x-api-key' }],
    }).getProvider(id);
    if (!found) throw new Error(`no provider ${id}`);
    return found;
  };

  /** Headers as a client sent them: our forward token in every credential slot, plus others. */
  const clientHeaders = (): Record<string, string> => ({
    Authorization: 'Bearer forward-token',
    'X-Api-Key': 'forward-token',
    'x-goog-api-key': 'forward-token',
    'xi-api-key': 'forward-token',
    'anthropic-version': '2023-06-01',
    'anthropic-beta': 'prompt-caching-2024-07-31',
    'content-type': 'application/json',
  });

  it.each([
    ['openai', 'authorization', 'Bearer sk-managed'],
    ['groq', 'authorization', 'Bearer sk-managed'],
    ['google-openai', 'authorization', 'Bearer sk-managed'],
    ['anthropic', 'x-api-key', 'sk-managed'],
    ['google', 'x-goog-api-key', 'sk-managed'],
    ['elevenlabs', 'xi-api-key', 'sk-managed'],
    ['xkey', 'x-api-key', 'sk-managed'],
  ])('%s: puts the key in %s and drops every other credential (plain record)', (id, header, value) => {
    const headers: HeaderTarget = clientHeaders();
    provider(id).applyAuth(headers, 'sk-managed');
    const credentials = Object.entries(headers).filter(([name]) =>
      ['authorization', 'x-api-key', 'x-goog-api-key', 'xi-api-key'].includes(name.toLowerCase()),
    );
    expect(credentials).toEqual([[header, value]]);
    expect(headers['anthropic-version']).toBe('2023-06-01');
    expect(headers['anthropic-beta']).toBe('prompt-caching-2024-07-31');
    expect(headers['content-type']).toBe('application/json');
  });

  it('works on a WHATWG Headers object too', () => {
    const headers = new Headers(clientHeaders());
    provider('anthropic').applyAuth(headers, 'sk-ant-managed');
    expect(headers.get('x-api-key')).toBe('sk-ant-managed');
    expect(headers.get('authorization')).toBeNull();
    expect(headers.get('x-goog-api-key')).toBeNull();
    expect(headers.get('xi-api-key')).toBeNull();
    expect(headers.get('anthropic-version')).toBe('2023-06-01');
  });

  it('declares the auth style it applies', () => {
    expect(provider('openai').authStyle).toBe('bearer');
    expect(provider('anthropic').authStyle).toBe('x-api-key');
    expect(provider('google').authStyle).toBe('x-goog-api-key');
    expect(provider('elevenlabs').authStyle).toBe('xi-api-key');
  });
});
