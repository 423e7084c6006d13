import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { createRegistry, type ProviderModule } from '../../src/providers/index.ts';
import type { TestApp } from '../helpers/app.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * Every base URL of the published client's `providers` map, used as a client of its family uses a
 * base URL: appended to as a string (@anthropic-ai/sdk, the Vercel AI SDK, LangChain) or with the
 * path joined to the base URL's path and the query re-encoded (openai 7 and other current
 * Stainless clients). Each call must reach the provider's own path, once, and be recorded there.
 */

const registry = createRegistry();
const providerOf = (base: string): ProviderModule => {
  const provider = registry.findProvider(new URL(base));
  if (!provider) throw new Error(`no provider serves ${base}`);
  return provider;
};

/** The client path a family's clients append to its base URL, and the path the provider must see under the base. */
function callOf(provider: ProviderModule): { path: string; method: string; body?: unknown; expectedTail: string } {
  switch (provider.family) {
    case 'anthropic':
      // @anthropic-ai/sdk appends /v1/messages to whatever base it is given.
      return { path: '/v1/messages', method: 'POST', body: { model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }, expectedTail: '/messages' };
    case 'google':
      return { path: '/models/gemini-2.0-flash:generateContent', method: 'POST', body: { contents: [{ parts: [{ text: 'hi' }] }] }, expectedTail: '/models/gemini-2.0-flash:generateContent' };
    case 'elevenlabs':
      return { path: '/text-to-speech/voice1', method: 'POST', body: { text: 'hello there' }, expectedTail: '/text-to-speech/voice1' };
    default:
      return { path: '/chat/completions', method: 'POST', body: { model: 'some-model', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }, expectedTail: '/chat/completions' };
  }
}

describe('forward: every providers.* base URL works as a base URL', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let providers: [name: string, url: string][];

  beforeAll(async () => {
    const bases = Object.values(new Lava('sk_x', { baseUrl: 'http://x/v1/' }).providers).map((url) => url.slice(url.indexOf('?u=') + 3));
    const hosts = [...new Set(bases.map((b) => new URL(b).host))];
    const keys = Object.fromEntries(bases.map((b) => [providerOf(b).id, `managed-${providerOf(b).id}`]));
    ({ upstream, t, base } = await startGatewayOnMock('sqlite', { providerHosts: hosts, providerKeys: keys }));
    const lava = new Lava(t.merchant.secretKey, { baseUrl: `${base}/v1/` });
    providers = Object.entries(lava.providers);
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  it('covers the 28 bases of the published client', () => {
    expect(providers.length).toBeGreaterThanOrEqual(28);
  });

  for (const style of ['appended to the string', 'joined to the path, query re-encoded'] as const) {
    it(`reaches each provider's own path when the client's path is ${style}`, async () => {
      for (const [name, url] of providers) {
        const providerBase = url.slice(url.indexOf('?u=') + 3);
        const provider = providerOf(providerBase);
        const call = callOf(provider);
        const requestUrl =
          style === 'appended to the string' ? `${url}${call.path}` : `${base}/v1/forward${call.path}?u=${encodeURIComponent(providerBase)}`;
        upstream.reset();
        const res = await fetch(requestUrl, {
          method: call.method,
          headers: { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' },
          body: JSON.stringify(call.body),
        });
        expect(res.status, `${name}: ${await res.clone().text()}`).toBe(200);
        await res.arrayBuffer();
        expect(upstream.requests, name).toHaveLength(1);
        const seen = upstream.requests[0]!;
        expect(seen.path, name).toBe(new URL(providerBase).pathname.replace(/\/$/, '') + call.expectedTail);
        expect(seen.url, `${name}: no query reaches the provider`).not.toContain('?');
        const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
        expect(record.provider, name).toBe(provider.id);
        expect(record.endpoint, name).toBe(`POST ${providerBase.replace(/\/$/, '')}${call.expectedTail}`);
      }
    });
  }

  it("passes the client's own query beside u on and keeps Tollgate's key and metadata out of it", async () => {
    upstream.reset();
    const u = encodeURIComponent('https://api.openai.com/v1?purpose=batch');
    const res = await fetch(`${base}/v1/forward/models?u=${u}&limit=2&purpose=batch&key=${t.merchant.secretKey}&metadata=%7B%22a%22%3A%22b%22%7D`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(upstream.requests.at(-1)!.url).toBe('/v1/models?purpose=batch&limit=2');
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    expect(record.endpoint).toBe('GET https://api.openai.com/v1/models?purpose=batch&limit=2');
    expect(record.metadata).toEqual({ a: 'b' });
  });

  it("takes key and metadata after a raw u without ? as Tollgate's: neither reaches the provider or the record", async () => {
    upstream.reset();
    const res = await fetch(`${base}/v1/forward?u=https://api.anthropic.com/v1/messages&key=${t.merchant.secretKey}&metadata=%7B%22a%22%3A%22c%22%7D`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'claude-haiku-4-5', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    const seen = upstream.requests.at(-1)!;
    expect(seen.url).toBe('/v1/messages');
    expect(JSON.stringify(seen.headers)).not.toContain(t.merchant.secretKey);
    const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
    expect(record.endpoint).toBe('POST https://api.anthropic.com/v1/messages');
    expect(record.metadata).toEqual({ a: 'c' });
  });

  it('forwards every method with the path joined', async () => {
    for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE']) {
      upstream.reset();
      const res = await fetch(`${base}/v1/forward/echo?u=${encodeURIComponent('https://api.openai.com/v1')}`, {
        method,
        headers: { authorization: `Bearer ${t.merchant.secretKey}`, ...(method === 'GET' || method === 'DELETE' ? {} : { 'content-type': 'application/json' }) },
        body: method === 'GET' || method === 'DELETE' ? undefined : '{}',
      });
      expect(res.status, method).toBe(200);
      expect(((await res.json()) as { method: string; path: string }).path, method).toBe('/v1/echo');
    }
  });
});
