import { describe, expect, it } from 'vitest';
import { resolveTarget, splitForwardQuery } from '../../src/gateway/target.ts';
import { ApiError } from '../../src/http/errors.ts';
import { createRegistry, listProviders } from '../../src/providers/index.ts';

const registry = createRegistry();
const NO_OVERRIDES = {};

describe('splitForwardQuery', () => {
  it('decodes a percent-encoded u, its own query included', () => {
    const target = 'https://api.openai.com/v1/chat/completions?a=1&b=x y';
    const { target: got, params } = splitForwardQuery(`/v1/forward?u=${encodeURIComponent(target)}`);
    expect(got).toBe(target);
    expect([...params]).toEqual([]);
  });

  it('keeps Tollgate params on both sides of an encoded u', () => {
    const metadata = JSON.stringify({ user: 'a b' });
    const url = `/v1/forward?metadata=${encodeURIComponent(metadata)}&u=${encodeURIComponent('https://api.openai.com/v1/models')}&key=tok%2Bx`;
    const { target, params } = splitForwardQuery(url);
    expect(target).toBe('https://api.openai.com/v1/models');
    expect(params.get('metadata')).toBe(metadata);
    expect(params.get('key')).toBe('tok+x');
  });

  it('takes a raw u with its own ? and & up to the end of the query string', () => {
    const { target, params } = splitForwardQuery('/v1/forward?u=https://api.openai.com/v1/models?a=1&b=2');
    expect(target).toBe('https://api.openai.com/v1/models?a=1&b=2');
    expect([...params]).toEqual([]);
  });

  it('leaves a raw u verbatim: percent-escapes and + belong to the target', () => {
    const { target } = splitForwardQuery('/v1/forward?u=https://api.openai.com/v1/files?q=a%20b+c&x=%2F');
    expect(target).toBe('https://api.openai.com/v1/files?q=a%20b+c&x=%2F');
  });

  it("takes Tollgate's key and metadata out of a raw target's query: they never reach the provider", () => {
    const raw = 'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse';
    const { target, params } = splitForwardQuery(`/v1/forward?u=${raw}&key=TOKEN&metadata=%7B%22a%22%3A%22b%22%7D&x=1`);
    expect(target).toBe(`${raw}&x=1`);
    expect(params.get('key')).toBe('TOKEN');
    expect(params.get('metadata')).toBe('{"a":"b"}');
  });

  it('ends a raw target without ? at its first &: the rest is query, key and metadata are Tollgate\'s', () => {
    const { target, params } = splitForwardQuery('/v1/forward?u=https://api.anthropic.com/v1/messages&key=sk_live_x&beta=true');
    expect(target).toBe('https://api.anthropic.com/v1/messages?beta=true');
    expect(params.get('key')).toBe('sk_live_x');
  });

  it('gives params before a raw u to Tollgate', () => {
    const { target, params } = splitForwardQuery(
      '/v1/forward?metadata=%7B%22a%22%3A%22b%22%7D&key=tok&u=https://api.anthropic.com/v1/messages?beta=true&x=1',
    );
    expect(target).toBe('https://api.anthropic.com/v1/messages?beta=true&x=1');
    expect(params.get('metadata')).toBe('{"a":"b"}');
    expect(params.get('key')).toBe('tok');
  });

  it('treats the published client providers.* URL plus a path as raw', () => {
    const base = 'https://api.openai.com/v1';
    const { target } = splitForwardQuery(`/v1/forward?u=${base}/chat/completions`);
    expect(target).toBe('https://api.openai.com/v1/chat/completions');
  });

  it('returns null for a missing or empty u', () => {
    expect(splitForwardQuery('/v1/forward').target).toBeNull();
    expect(splitForwardQuery('/v1/forward?').target).toBeNull();
    expect(splitForwardQuery('/v1/forward?u=').target).toBeNull();
    expect(splitForwardQuery('/v1/forward?metadata=%7B%7D').target).toBeNull();
    expect(splitForwardQuery('/v1/forward?metadata=%7B%7D').params.get('metadata')).toBe('{}');
  });

  it('uses the first u; a later one stays in params', () => {
    const { target, params } = splitForwardQuery(
      `/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/models')}&u=${encodeURIComponent('https://evil.example/')}`,
    );
    expect(target).toBe('https://api.openai.com/v1/models');
    expect(params.get('u')).toBe('https://evil.example/');
  });

  it("passes a client's own query parameters beside an encoded u on to the provider, keeping metadata and key", () => {
    const { target, params } = splitForwardQuery(
      `/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/files?purpose=batch')}&limit=5&after=file%2D1&metadata=%7B%7D&key=k`,
    );
    expect(target).toBe('https://api.openai.com/v1/files?purpose=batch&limit=5&after=file%2D1');
    expect(params.get('metadata')).toBe('{}');
    expect(params.get('key')).toBe('k');
  });

  it('joins the request path after /forward to the base named by an encoded u (openai 7)', () => {
    const { target } = splitForwardQuery(`/v1/forward/chat/completions?u=${encodeURIComponent('https://api.openai.com/v1')}`, '/chat/completions');
    expect(target).toBe('https://api.openai.com/v1/chat/completions');
  });

  it('joins the path to a raw base and merges both queries', () => {
    const { target, params } = splitForwardQuery('/v1/forward/files?u=https://api.openai.com/v1/?purpose=batch&limit=2&metadata=%7B%7D', '/files');
    expect(target).toBe('https://api.openai.com/v1/files?purpose=batch&limit=2');
    expect(params.get('metadata')).toBe('{}');
  });

  it('sends a parameter found both in u and beside it once (no alt=sse&alt=sse)', () => {
    const u = encodeURIComponent('https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent?alt=sse');
    expect(splitForwardQuery(`/v1/forward?u=${u}&alt=sse`).target).toBe(
      'https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent?alt=sse',
    );
    expect(splitForwardQuery(`/v1/forward/models/g:streamGenerateContent?u=https://generativelanguage.googleapis.com/v1beta?alt=sse&alt=sse`, '/models/g:streamGenerateContent').target).toBe(
      'https://generativelanguage.googleapis.com/v1beta/models/g:streamGenerateContent?alt=sse',
    );
  });

  it('keeps the host of u whatever the joined path holds', () => {
    const { target } = splitForwardQuery(`/v1/forward//evil.example/x?u=https://api.openai.com`, '//evil.example/x');
    expect(new URL(target!).host).toBe('api.openai.com');
    const dotted = splitForwardQuery(`/v1/forward/../../@evil.example?u=https://api.openai.com/v1`, '/../../@evil.example');
    expect(new URL(dotted.target!).host).toBe('api.openai.com');
  });

  it('decodes an encoded parameter name (%75 is u)', () => {
    expect(splitForwardQuery(`/v1/forward?%75=${encodeURIComponent('https://api.x.ai/v1/models')}`).target).toBe(
      'https://api.x.ai/v1/models',
    );
  });

  it('tolerates malformed percent-escapes', () => {
    const { target, params } = splitForwardQuery('/v1/forward?metadata=%E0%A4%A&u=https%3A%2F%2Fapi.openai.com%2Fv1%2Fmodels%ZZ');
    expect(target).toBe('https://api.openai.com/v1/models%ZZ');
    expect(params.has('metadata')).toBe(true);
  });
});

function refusal(target: string, reg = registry): ApiError {
  try {
    resolveTarget(target, reg, NO_OVERRIDES);
  } catch (error) {
    expect(error).toBeInstanceOf(ApiError);
    return error as ApiError;
  }
  throw new Error(`expected ${target} to be refused`);
}

describe('resolveTarget: refused targets', () => {
  const refused: [label: string, target: string][] = [
    ['IPv4 loopback', 'https://127.0.0.1/v1/models'],
    ['IPv4 loopback, http', 'http://127.0.0.1:8080/v1/models'],
    ['cloud metadata address', 'http://169.254.169.254/latest/meta-data/'],
    ['private address', 'https://10.0.0.1/v1/models'],
    ['localhost', 'http://localhost:3000/v1/models'],
    ['localhost, https', 'https://localhost/v1/models'],
    ['localhost with a trailing dot', 'https://localhost./v1/models'],
    ['a .localhost name', 'https://api.openai.com.localhost/v1/models'],
    ['IPv6 loopback', 'https://[::1]/v1/models'],
    ['IPv4-mapped IPv6', 'https://[::ffff:127.0.0.1]/v1/models'],
    ['IPv6 unspecified', 'http://[::]/'],
    ['decimal IPv4', 'http://2130706433/'],
    ['hex IPv4 parts', 'https://0x7f.1/v1/models'],
    ['octal IPv4', 'https://0177.0.0.1/v1/models'],
    ['short IPv4', 'https://127.1/v1/models'],
    ['IPv4 with a trailing dot', 'https://127.0.0.1./v1/models'],
    ['userinfo naming a provider', 'https://api.openai.com@evil.example/v1/models'],
    ['userinfo on a provider host', 'https://user:pass@api.openai.com/v1/models'],
    ['encoded @ in userinfo', 'https://api.openai.com%40evil.example/v1/models'],
    ['encoded dot in the host', 'https://api.openai.com%2eevil.example/v1/models'],
    ['backslash authority trick', 'https://evil.example\\@api.openai.com/v1/models'],
    ['look-alike suffix', 'https://api.openai.com.evil.example/v1/models'],
    ['subdomain of a provider', 'https://evil.api.openai.com/v1/models'],
    ['unknown host', 'https://example.com/v1/chat/completions'],
    ['provider host, unknown path', 'https://api.openai.com/admin'],
    ['dot-segments leaving the base path', 'https://api.openai.com/v1/../admin'],
    ['encoded dot-segments leaving the base path', 'https://api.openai.com/v1/%2e%2e/admin'],
    ['provider host on another port', 'https://api.openai.com:8443/v1/models'],
    ['http for a built-in provider', 'http://api.openai.com/v1/models'],
    ['another scheme', 'ftp://api.openai.com/v1/models'],
    ['file URL', 'file:///etc/passwd'],
    ['not absolute', 'api.openai.com/v1/models'],
    ['not a URL', 'https://'],
  ];

  it.each(refused)('refuses %s', (_label, target) => {
    const error = refusal(target);
    expect(error.code).toBe('unsupported_provider');
    expect(error.status).toBe(400);
  });

  it('says why an http target of a built-in is refused', () => {
    expect(refusal('http://api.anthropic.com/v1/messages').message).toMatch(/https/);
  });

  it('says why an address is refused', () => {
    expect(refusal('http://2130706433/').message).toMatch(/IP address/);
  });
});

describe('resolveTarget: allowed targets', () => {
  it.each(listProviders().map((p) => [p.id, p.baseUrl] as const))('allows the %s base %s', (id, baseUrl) => {
    const { provider, publicUrl, upstreamUrl, strippedKey } = resolveTarget(`${baseUrl}/some/path`, registry, NO_OVERRIDES);
    expect(provider.id).toBe(id);
    expect(publicUrl.href).toBe(`${baseUrl}/some/path`);
    expect(upstreamUrl.href).toBe(publicUrl.href);
    expect(strippedKey).toBeNull();
  });

  it('normalises case, default port and a trailing dot', () => {
    const { provider, publicUrl } = resolveTarget('HTTPS://API.OpenAI.com.:443/v1/models', registry, NO_OVERRIDES);
    expect(provider.id).toBe('openai');
    expect(publicUrl.href).toBe('https://api.openai.com/v1/models');
  });

  it('drops a fragment', () => {
    expect(resolveTarget('https://api.openai.com/v1/models#x', registry, NO_OVERRIDES).publicUrl.href).toBe(
      'https://api.openai.com/v1/models',
    );
  });

  it('removes the key parameter and keeps the other parameters byte for byte', () => {
    const { publicUrl, upstreamUrl, strippedKey, provider } = resolveTarget(
      'https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse&key=tok%2Bx&f=a:b%20c',
      registry,
      NO_OVERRIDES,
    );
    expect(provider.id).toBe('google');
    expect(strippedKey).toBe('tok+x');
    expect(publicUrl.search).toBe('?alt=sse&f=a:b%20c');
    expect(upstreamUrl.search).toBe('?alt=sse&f=a:b%20c');
  });

  it('removes every key parameter, and the ? when nothing else is left', () => {
    const { publicUrl, strippedKey } = resolveTarget(
      'https://generativelanguage.googleapis.com/v1beta/models?key=first&key=second',
      registry,
      NO_OVERRIDES,
    );
    expect(strippedKey).toBe('first');
    expect(publicUrl.href).toBe('https://generativelanguage.googleapis.com/v1beta/models');
  });

  it('reports an empty key parameter as no key', () => {
    const { publicUrl, strippedKey } = resolveTarget('https://api.openai.com/v1/models?key=&a=1', registry, NO_OVERRIDES);
    expect(strippedKey).toBeNull();
    expect(publicUrl.search).toBe('?a=1');
  });

  it("collapses a doubled API version to the client's own (published base + a client's versioned path)", () => {
    expect(resolveTarget('https://api.anthropic.com/v1/v1/messages', registry, NO_OVERRIDES).publicUrl.pathname).toBe('/v1/messages');
    const gemini = resolveTarget('https://generativelanguage.googleapis.com/v1beta/v1/models/g:generateContent', registry, NO_OVERRIDES);
    expect(gemini.publicUrl.pathname).toBe('/v1/models/g:generateContent');
    expect(gemini.provider.id).toBe('google');
    expect(resolveTarget('https://api.openai.com/v1/v1/models', registry, NO_OVERRIDES).publicUrl.pathname).toBe('/v1/v1/models');
  });

  it('accepts a raw target straight from splitForwardQuery', () => {
    const { target, params } = splitForwardQuery('/v1/forward?u=https://api.openai.com/v1/models?a=1&key=k&b=2');
    const { publicUrl, strippedKey } = resolveTarget(target!, registry, NO_OVERRIDES);
    expect(publicUrl.href).toBe('https://api.openai.com/v1/models?a=1&b=2');
    expect(strippedKey).toBeNull();
    expect(params.get('key')).toBe('k');
  });
});

describe('resolveTarget: custom providers', () => {
  const custom = createRegistry({
    custom: [
      { id: 'vllm', baseUrl: 'http://10.0.0.5:8000/v1' },
      { id: 'internal', baseUrl: 'https://llm.internal.example/openai' },
    ],
  });

  it('allows a declared https custom provider', () => {
    const { provider, publicUrl } = resolveTarget('https://llm.internal.example/openai/chat/completions', custom, NO_OVERRIDES);
    expect(provider.id).toBe('internal');
    expect(publicUrl.href).toBe('https://llm.internal.example/openai/chat/completions');
  });

  it('allows the exact http address the operator declared, nothing next to it', () => {
    expect(resolveTarget('http://10.0.0.5:8000/v1/chat/completions', custom, NO_OVERRIDES).provider.id).toBe('vllm');
    expect(refusal('http://10.0.0.5:8001/v1/chat/completions', custom).code).toBe('unsupported_provider');
    expect(refusal('http://10.0.0.6:8000/v1/chat/completions', custom).code).toBe('unsupported_provider');
    expect(refusal('http://10.0.0.5:8000/admin', custom).code).toBe('unsupported_provider');
  });

  it('keeps the built-ins', () => {
    expect(resolveTarget('https://api.openai.com/v1/models', custom, NO_OVERRIDES).provider.id).toBe('openai');
  });
});

describe('resolveTarget: upstream overrides', () => {
  it('replaces scheme, host and port, keeping path and query', () => {
    const { publicUrl, upstreamUrl, provider } = resolveTarget(
      'https://api.openai.com/v1/chat/completions?a=1&b=x%20y',
      registry,
      { 'api.openai.com': 'http://127.0.0.1:5555' },
    );
    expect(provider.id).toBe('openai');
    expect(publicUrl.href).toBe('https://api.openai.com/v1/chat/completions?a=1&b=x%20y');
    expect(upstreamUrl.href).toBe('http://127.0.0.1:5555/v1/chat/completions?a=1&b=x%20y');
  });

  it('prefixes the override base path', () => {
    const { upstreamUrl } = resolveTarget('https://api.anthropic.com/v1/messages', registry, {
      'api.anthropic.com': 'http://127.0.0.1:5555/anthropic/',
    });
    expect(upstreamUrl.href).toBe('http://127.0.0.1:5555/anthropic/v1/messages');
  });

  it('does not carry the stripped key upstream', () => {
    const { upstreamUrl, strippedKey } = resolveTarget(
      'https://generativelanguage.googleapis.com/v1beta/models/m:generateContent?key=secret',
      registry,
      { 'generativelanguage.googleapis.com': 'http://127.0.0.1:5555' },
    );
    expect(strippedKey).toBe('secret');
    expect(upstreamUrl.href).toBe('http://127.0.0.1:5555/v1beta/models/m:generateContent');
  });

  it('leaves hosts without an override alone', () => {
    const { upstreamUrl } = resolveTarget('https://api.x.ai/v1/models', registry, { 'api.openai.com': 'http://127.0.0.1:5555' });
    expect(upstreamUrl.href).toBe('https://api.x.ai/v1/models');
  });

  it('matches override keys case-insensitively', () => {
    const { upstreamUrl } = resolveTarget('https://api.openai.com/v1/models', registry, { 'API.OpenAI.com': 'http://127.0.0.1:5555' });
    expect(upstreamUrl.host).toBe('127.0.0.1:5555');
  });

  it('keeps a path that starts with // a path (never a protocol-relative URL)', () => {
    const { upstreamUrl } = resolveTarget('https://api.deepseek.com//evil.example/x', registry, {
      'api.deepseek.com': 'http://127.0.0.1:5555',
    });
    expect(upstreamUrl.host).toBe('127.0.0.1:5555');
    expect(upstreamUrl.pathname).toBe('//evil.example/x');
  });

  it('is the only way to a loopback address: the address itself stays refused', () => {
    expect(refusal('http://127.0.0.1:5555/v1/models').code).toBe('unsupported_provider');
  });
});
