import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet } from '../../src/ledger/wallets.ts';
import type { TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock } from '../helpers/gateway.ts';
import type { MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The SSRF wall of /v1/forward over real HTTP: only registry hosts (mapped to the mock by
 * UPSTREAM_OVERRIDES) are ever called; addresses, local names, userinfo and look-alikes are
 * refused with 400 unsupported_provider before any connection; redirects are relayed, never
 * followed; the target's own query arrives intact; every verb is forwarded.
 */

type Envelope = { error: { code: string } };
type Echo = { method: string; path: string; query: Record<string, string>; headers: Record<string, string>; body: string };

describe.each(databasesUnderTest())('forward gateway SSRF wall and targets on %s', (dialect) => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let port: string;

  beforeAll(async () => {
    ({ upstream, t, base } = await startGatewayOnMock(dialect, {
      providerHosts: ['api.openai.com', 'api.anthropic.com'],
      providerKeys: { openai: 'sk-managed-openai', anthropic: 'sk-managed-anthropic' },
    }));
    port = new URL(upstream.url).port;
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'), new Date().toISOString());
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const auth = () => ({ authorization: `Bearer ${t.merchant.secretKey}` });
  const chat = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });

  describe('refused targets', () => {
    const targets = (): [string, string][] => [
      ['loopback IPv4 (the mock itself)', `http://127.0.0.1:${port}/v1/chat/completions`],
      ['loopback IPv4 over https', `https://127.0.0.1:${port}/v1/chat/completions`],
      ['cloud metadata', 'http://169.254.169.254/latest/meta-data/iam/security-credentials/'],
      ['cloud metadata over https', 'https://169.254.169.254/v1/chat/completions'],
      ['localhost', `http://localhost:${port}/v1/chat/completions`],
      ['localhost over https', 'https://localhost/v1/chat/completions'],
      ['a *.localhost name', 'https://api.localhost/v1/chat/completions'],
      ['loopback IPv6', `http://[::1]:${port}/v1/chat/completions`],
      ['IPv4-mapped IPv6', `http://[::ffff:127.0.0.1]:${port}/v1/chat/completions`],
      ['unspecified address', `http://0.0.0.0:${port}/v1/chat/completions`],
      ['private address', 'https://10.0.0.5/v1/chat/completions'],
      ['userinfo naming a provider', 'https://api.openai.com@evil.example/v1/chat/completions'],
      ['userinfo naming a provider, loopback host', `http://api.openai.com@127.0.0.1:${port}/v1/chat/completions`],
      ['userinfo with a password on a provider host', 'https://user:pass@api.openai.com/v1/chat/completions'],
      ['decimal IPv4', `http://2130706433:${port}/v1/chat/completions`],
      ['hex IPv4', `http://0x7f.0.0.1:${port}/v1/chat/completions`],
      ['short IPv4', `http://127.1:${port}/v1/chat/completions`],
      ['octal IPv4', `http://0177.0.0.1:${port}/v1/chat/completions`],
      ['percent-encoded IPv4', `http://%31%32%37.0.0.1:${port}/v1/chat/completions`],
      ['percent-encoded localhost', `http://%6c%6f%63%61%6c%68%6f%73%74:${port}/v1/chat/completions`],
      ['an unknown host', 'https://evil.example/v1/chat/completions'],
      ['a provider name as a subdomain of another host', 'https://api.openai.com.evil.example/v1/chat/completions'],
      ['a provider name as a path of another host', 'https://evil.example/api.openai.com/v1/chat/completions'],
      ['a provider host on another port', 'https://api.openai.com:8443/v1/chat/completions'],
      ['a provider host over plain http', 'http://api.openai.com/v1/chat/completions'],
      ['a provider host outside its base path', 'https://api.openai.com/admin'],
      ['a non-http scheme', 'file:///etc/passwd'],
      ['a relative URL', '/v1/chat/completions'],
      ['garbage', 'not a url at all'],
    ];

    it('refuses every one in both u spellings with 400 unsupported_provider, and the mock sees nothing', async () => {
      const before = upstream.requests.length;
      const failures: string[] = [];
      for (const [name, target] of targets()) {
        for (const query of [`u=${encodeURIComponent(target)}`, `u=${target}`]) {
          const res = await fetch(`${base}/v1/forward?${query}`, {
            method: 'POST',
            headers: { ...auth(), 'content-type': 'application/json' },
            body: chat,
          });
          const text = await res.text();
          const code = res.status === 400 ? (JSON.parse(text) as Envelope).error.code : `HTTP ${res.status}`;
          if (code !== 'unsupported_provider') failures.push(`${name} (${query}): ${code} ${text.slice(0, 200)}`);
        }
      }
      expect(failures).toEqual([]);
      expect(upstream.requests.length).toBe(before);
    });

    it('refuses before authenticating the caller', async () => {
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent(`http://127.0.0.1:${port}/v1/echo`)}`);
      expect(res.status).toBe(400);
      expect(((await res.json()) as Envelope).error.code).toBe('unsupported_provider');
    });

    it('a missing u → 400 validation_error', async () => {
      const before = upstream.requests.length;
      for (const path of ['/v1/forward', '/v1/forward?u=', '/v1/forward?metadata=%7B%7D']) {
        const res = await fetch(`${base}${path}`, { headers: auth() });
        expect(res.status).toBe(400);
        expect(((await res.json()) as Envelope).error.code).toBe('validation_error');
      }
      expect(upstream.requests.length).toBe(before);
    });
  });

  it('percent-encoded letters in a provider host name the same provider host', async () => {
    const before = upstream.requests.length;
    const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://%61pi.OpenAI.com./v1/echo')}`, { headers: auth() });
    expect(res.status).toBe(200);
    expect(((await res.json()) as Echo).path).toBe('/v1/echo');
    expect(upstream.requests.length).toBe(before + 1);
  });

  describe('redirects', () => {
    it.each([
      ['an internal address', () => `http://127.0.0.1:${port}/v1/echo`],
      ['the metadata service', () => 'http://169.254.169.254/latest/meta-data/'],
      ['a provider URL', () => 'https://api.openai.com/v1/echo'],
    ])('relays the 302 to %s itself and never follows it', async (_name, locationOf) => {
      const location = locationOf();
      upstream.setNext({ redirectTo: location });
      const before = upstream.requests.length;
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`, {
        method: 'POST',
        redirect: 'manual',
        headers: { ...auth(), 'content-type': 'application/json' },
        body: chat,
      });
      expect(res.status).toBe(302);
      expect(res.headers.get('location')).toBe(location);
      expect(res.headers.get('x-tollgate-request-id')).toMatch(/^req_/);
      await res.arrayBuffer();
      // Give a follow-up (there must be none) time to happen.
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      await new Promise((r) => setTimeout(r, 50));
      expect(upstream.requests.length).toBe(before + 1);
      expect(upstream.requests.at(-1)!.path).toBe('/v1/chat/completions');
      expect(record.status).not.toBe('pending');
    });
  });

  describe('target query strings', () => {
    async function echo(query: string, init: RequestInit = {}) {
      const before = upstream.requests.length;
      const res = await fetch(`${base}/v1/forward?${query}`, { ...init, headers: { ...auth(), ...(init.headers as Record<string, string>) } });
      expect(res.status).toBe(200);
      const body = (await res.json()) as Echo;
      expect(upstream.requests.length).toBe(before + 1);
      return { body, seen: upstream.requests.at(-1)! };
    }

    it('a raw u keeps its own ?a=1&b=2', async () => {
      const { seen, body } = await echo('u=https://api.openai.com/v1/echo?a=1&b=2');
      expect(seen.url).toBe('/v1/echo?a=1&b=2');
      expect(body.query).toEqual({ a: '1', b: '2' });
    });

    it('an encoded u keeps its own ?a=1&b=2', async () => {
      const { seen } = await echo(`u=${encodeURIComponent('https://api.openai.com/v1/echo?a=1&b=2')}`);
      expect(seen.url).toBe('/v1/echo?a=1&b=2');
    });

    it('a raw u keeps the exact bytes of its query (escapes, colons, plus signs, repeated names)', async () => {
      const query = 'a=x%20y&b=c:d&c=1+2&a=again&empty=&flag&d=%2F%3F%26';
      const { seen } = await echo(`u=https://api.openai.com/v1/echo?${query}`);
      expect(seen.url).toBe(`/v1/echo?${query}`);
    });

    it('an encoded u keeps the exact bytes of its query', async () => {
      const query = 'a=x%20y&b=c:d&c=1+2&a=again&d=%2F%3F%26';
      const { seen } = await echo(`u=${encodeURIComponent(`https://api.openai.com/v1/echo?${query}`)}`);
      expect(seen.url).toBe(`/v1/echo?${query}`);
    });

    it('parameters before a raw u are ours; metadata does not reach the provider', async () => {
      const metadata = encodeURIComponent(JSON.stringify({ team: 'ssrf' }));
      const res = await fetch(`${base}/v1/forward?metadata=${metadata}&u=https://api.openai.com/v1/echo?a=1`, { headers: auth() });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      expect(upstream.requests.at(-1)!.url).toBe('/v1/echo?a=1');
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).metadata).toEqual({ team: 'ssrf' });
    });

    it('client parameters beside an encoded u join the target query; ours do not', async () => {
      const metadata = encodeURIComponent(JSON.stringify({ team: 'beside' }));
      const { seen } = await echo(`limit=5&u=${encodeURIComponent('https://api.openai.com/v1/echo?a=1')}&metadata=${metadata}&after=x`);
      expect(seen.url).toBe('/v1/echo?a=1&limit=5&after=x');
    });

    it('a target fragment is not sent', async () => {
      const { seen } = await echo(`u=${encodeURIComponent('https://api.openai.com/v1/echo?a=1#frag')}`);
      expect(seen.url).toBe('/v1/echo?a=1');
    });

    it('a path that looks like another host is refused (not under the base path), never sent elsewhere', async () => {
      const before = upstream.requests.length;
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com//evil.example/v1/echo')}`, { headers: auth() });
      expect(res.status).toBe(400);
      expect(((await res.json()) as Envelope).error.code).toBe('unsupported_provider');
      expect(upstream.requests.length).toBe(before);
    });
  });

  describe('verbs', () => {
    it.each(['GET', 'DELETE'])('%s is forwarded', async (method) => {
      const before = upstream.requests.length;
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/echo?x=1')}`, { method, headers: auth() });
      expect(res.status).toBe(200);
      expect(res.headers.get('x-tollgate-request-id')).toMatch(/^req_/);
      const echo = (await res.json()) as Echo;
      expect(echo).toMatchObject({ method, path: '/v1/echo', query: { x: '1' }, body: '' });
      expect(upstream.requests.length).toBe(before + 1);
      expect(upstream.requests.at(-1)!.headers.authorization).toBe('Bearer sk-managed-openai');
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', endpoint: `${method} https://api.openai.com/v1/echo?x=1` });
    });

    it.each(['PUT', 'PATCH', 'POST', 'DELETE'])('%s is forwarded with its body', async (method) => {
      const body = `{"op": "${method}",  "n": [1, 2]}`;
      const res = await fetch(`${base}/v1/forward?u=https://api.openai.com/v1/echo`, {
        method,
        headers: { ...auth(), 'content-type': 'application/json' },
        body,
      });
      expect(res.status).toBe(200);
      const echo = (await res.json()) as Echo;
      expect(echo).toMatchObject({ method, path: '/v1/echo', body });
      expect(upstream.requests.at(-1)!.body.toString()).toBe(body);
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).status).toBe('completed');
    });

    it('OPTIONS and TRACE are not forwarded', async () => {
      const before = upstream.requests.length;
      for (const method of ['OPTIONS', 'TRACE']) {
        const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.openai.com/v1/echo')}`, { method, headers: auth() }).catch(
          () => null,
        );
        if (res) {
          await res.arrayBuffer();
          expect(res.status).toBeGreaterThanOrEqual(400);
        }
      }
      expect(upstream.requests.length).toBe(before);
    });
  });
});
