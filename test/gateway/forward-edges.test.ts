import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Agent, request } from 'undici';
import { parseMoney } from '../../src/domain/money.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { stripNullUsage } from '../../src/providers/openai-compatible.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';

/** HEAD on the forward routes, the usage fields the gateway's own include_usage adds, and shutdown. */

const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const OPENAI_MODELS = 'https://api.openai.com/v1/models';
const forwardUrl = (base: string, target: string) => `${base}/v1/forward?u=${encodeURIComponent(target)}`;
const streamBody = (extra: Record<string, unknown> = {}) =>
  JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'one two' }], ...extra });

describe('stripNullUsage', () => {
  it('removes a top-level "usage":null wherever it sits, keeping every other byte', () => {
    expect(stripNullUsage('data: {"id":"a","choices":[],"usage":null}\n\n')).toBe('data: {"id":"a","choices":[]}\n\n');
    expect(stripNullUsage('data: {"usage":null,"id":"a"}\n\n')).toBe('data: {"id":"a"}\n\n');
    expect(stripNullUsage('data: {"id":"a", "usage" : null }\n\n')).toBe('data: {"id":"a"}\n\n');
    expect(stripNullUsage('data: {"usage":null}\n\n')).toBe('data: {}\n\n');
  });

  it('leaves usage objects, nested usage members and usage inside strings alone', () => {
    const cases = [
      'data: {"id":"a","usage":{"prompt_tokens":1}}\n\n',
      'data: {"id":"a","choices":[{"delta":{"usage":null}}]}\n\n',
      'data: {"id":"a","choices":[{"delta":{"content":"\\"usage\\":null"}}]}\n\n',
      'data: [DONE]\n\n',
    ];
    for (const raw of cases) expect(stripNullUsage(raw)).toBe(raw);
  });
});

describe('forward gateway edges', () => {
  let upstream: MockUpstream;
  let t: TestApp;
  let base: string;
  let token: string;

  beforeAll(async () => {
    upstream = await startMockUpstream();
    t = await startTestApp('sqlite', {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-managed' }),
      },
    });
    base = await t.listen();
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('50'), new Date().toISOString());
    token = t.merchant.secretKey;
  });
  afterAll(async () => {
    await t?.close();
    await upstream?.close();
  });

  const headers = () => ({ authorization: `Bearer ${token}`, 'content-type': 'application/json' });

  it('HEAD is not forwarded: /v1/forward and /v1/models answer the envelope and the provider is not called', async () => {
    const calls = upstream.requests.length;
    for (const url of [forwardUrl(base, OPENAI_MODELS), `${base}/v1/models`]) {
      const res = await request(url, { method: 'HEAD', headers: headers() });
      await res.body.text();
      expect([404, 405]).toContain(res.statusCode);
      expect(String(res.headers['content-type'])).toContain('application/json');
    }
    expect(upstream.requests.length).toBe(calls);
    // GET itself still works.
    const get = await fetch(forwardUrl(base, OPENAI_MODELS), { headers: headers() });
    expect(get.status).toBe(200);
    await get.text();
  });

  it('a JSON answer keeps its length (no chunked framing); a stream is relayed without one', async () => {
    const json = await request(forwardUrl(base, OPENAI_CHAT), {
      method: 'POST',
      headers: headers(),
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 3, messages: [{ role: 'user', content: 'one two' }] }),
    });
    const text = await json.body.text();
    expect(json.headers['content-length']).toBe(String(Buffer.byteLength(text)));
    expect(json.headers['transfer-encoding']).toBeUndefined();
    expect(JSON.parse(text)).toMatchObject({ object: 'chat.completion' });

    const stream = await request(forwardUrl(base, OPENAI_CHAT), { method: 'POST', headers: headers(), body: streamBody() });
    await stream.body.text();
    expect(stream.headers['content-length']).toBeUndefined();
  });

  it('a client that did not ask for usage sees neither the usage chunk nor "usage":null on the others', async () => {
    const res = await fetch(forwardUrl(base, OPENAI_CHAT), { method: 'POST', headers: headers(), body: streamBody() });
    const text = await res.text();
    expect(upstream.requests.at(-1)!.json).toMatchObject({ stream_options: { include_usage: true } });
    const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
    expect(events.length).toBe(3 + 2 + 1); // role, 3 words, finish, [DONE]
    expect(text).not.toContain('"usage"');
    for (const event of events.slice(0, -1)) expect(JSON.parse(event.slice(6))).toMatchObject({ object: 'chat.completion.chunk' });
  });

  it('a client that asked for usage gets the stream byte for byte, "usage":null included', async () => {
    const res = await fetch(forwardUrl(base, OPENAI_CHAT), {
      method: 'POST',
      headers: headers(),
      body: streamBody({ stream_options: { include_usage: true } }),
    });
    const text = await res.text();
    const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
    expect(events.filter((e) => e.includes('"usage":null')).length).toBe(5);
    expect(events.filter((e) => e.includes('"usage":{')).length).toBe(1);
  });
});

describe('shutdown with a forwarded response in flight', () => {
  it('close() waits for the stream to finish, then completes; idle keep-alive sockets do not hold it', async () => {
    const upstream = await startMockUpstream();
    const t = await startTestApp('sqlite', {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ 'api.openai.com': upstream.url }),
        PROVIDER_KEYS: JSON.stringify({ openai: 'sk-managed' }),
      },
    });
    const base = await t.listen();
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('50'), new Date().toISOString());
    const agent = new Agent({ keepAliveTimeout: 600_000, keepAliveMaxTimeout: 600_000, connections: 4 });
    const h = { authorization: `Bearer ${t.merchant.secretKey}`, 'content-type': 'application/json' };
    try {
      // Leaves an idle keep-alive connection behind.
      const warm = await request(forwardUrl(base, OPENAI_CHAT), { dispatcher: agent, method: 'POST', headers: h, body: streamBody() });
      await warm.body.text();

      upstream.setNext({ path: '/chat/completions', chunkDelayMs: 40 });
      const inFlight = await request(forwardUrl(base, OPENAI_CHAT), { dispatcher: agent, method: 'POST', headers: h, body: streamBody() });
      expect(inFlight.statusCode).toBe(200);

      const order: string[] = [];
      const closed = t.app.close().then(() => order.push('closed'));
      const text = await inFlight.body.text();
      order.push('stream ended');
      // Generous bound only so that a regression fails instead of hanging for the keep-alive timeout.
      await Promise.race([closed, new Promise((_, reject) => setTimeout(() => reject(new Error('close() stalled')), 15_000))]);

      expect(text.trim().endsWith('data: [DONE]')).toBe(true);
      expect(order).toEqual(['stream ended', 'closed']);
      // Nothing admitted is lost by a graceful shutdown: both requests are settled, no hold is left.
      const records = await t.storage.db.selectFrom('requests').select('status').where('merchant_id', '=', t.merchant.merchantId).execute();
      expect(records.map((r) => r.status)).toEqual(['completed', 'completed']);
      expect((await findWallet(t.storage, t.merchant.walletId))!.held).toBe(0n);
    } finally {
      await agent.close();
      await t.storage.close();
      await upstream.close();
    }
  });
});
