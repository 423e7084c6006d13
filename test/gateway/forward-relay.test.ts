import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { creditWallet, findWallet } from '../../src/ledger/wallets.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startMockUpstream, type MockUpstream } from '../helpers/mock-upstream.ts';

/**
 * The relay over real HTTP: bodies byte for byte in both directions, streams chunk by chunk,
 * client disconnects and provider cuts settled from what was seen, provider errors relayed as
 * they are, timeouts, metadata and the x-tollgate-request-id header.
 *
 * Besides the shared mock, a tiny "raw" provider (mapped from api.mistral.ai) sends bytes the
 * mock cannot (odd JSON whitespace, a large binary body) and reports when its socket closes, so
 * a client disconnect can be seen to abort the upstream call.
 */

type Envelope = { error: { code: string; status: number } };

const RAW_JSON =
  '{"id":"chatcmpl-raw",\n\t"object" : "chat.completion",   "model":"mistral-small-latest","choices":[],' +
  '"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"x_unknown":{"deep":[1,  2.50, "\u00e9\\u00e9", null]}}\r\n';
const BIG_BODY = randomBytes(2 * 1024 * 1024 + 17);
/** 40 characters of RAW_JSON: the part of a cut answer the gateway sees. */
const CUT_JSON_SEEN = RAW_JSON.slice(0, 40);
/** A chat completion without usage: its text is "chat.completion" and "hello world again" (32 characters). */
const NO_USAGE_JSON =
  '{"id":"chatcmpl-nousage","object":"chat.completion","model":"mistral-small-latest","choices":[{"index":0,"message":{"role":"assistant","content":"hello world again"}}]}';

type RawProvider = {
  url: string;
  /** Per slow stream: when the socket closed, whether it closed before the stream ended, chunks written. */
  streams: { closedAt: number | null; closedEarly: boolean; written: number }[];
  /** Bytes the 'flood' mode managed to write so far. */
  flooded: () => number;
  close(): Promise<void>;
};

/** What the 'flood' mode offers at most: far more than every socket buffer on the way can hold. */
const FLOOD_BYTES = 256 * 1024 * 1024;

/** Answers by the x-test-mode request header (which, not being a credential, passes through). */
async function startRawProvider(): Promise<RawProvider> {
  const streams: RawProvider['streams'] = [];
  let flooded = 0;
  const sockets = new Set<import('node:net').Socket>();
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    res.on('error', () => {});
    req.resume();
    req.on('end', () => void answer(req, res));
  });
  server.on('connection', (socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });

  async function answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const mode = String(req.headers['x-test-mode'] ?? '');
    if (mode === 'raw-json') {
      res.writeHead(200, { 'content-type': 'application/json', 'x-provider-extra': 'kept' });
      res.end(RAW_JSON);
      return;
    }
    if (mode === 'cut-json') {
      // Declares the whole body, sends CUT_JSON_SEEN of it, then drops the connection.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(RAW_JSON.length) });
      res.write(CUT_JSON_SEEN, () => res.socket?.destroy());
      return;
    }
    if (mode === 'no-usage') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(NO_USAGE_JSON);
      return;
    }
    if (mode === 'flood') {
      // As fast as it is allowed to: only back-pressure slows it down.
      const chunk = Buffer.alloc(65_536, 'x');
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      for (flooded = 0; flooded < FLOOD_BYTES && !res.destroyed; flooded += chunk.length) {
        if (!res.write(chunk)) await drainedOrClosed(res);
      }
      res.end();
      return;
    }
    if (mode === 'big') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      for (let offset = 0; offset < BIG_BODY.length; offset += 65_536) {
        if (!res.write(BIG_BODY.subarray(offset, offset + 65_536))) await new Promise((r) => res.once('drain', r));
      }
      res.end();
      return;
    }
    // A slow OpenAI-style stream: one word per chunk, never a usage chunk.
    const chunks = Number(req.headers['x-test-chunks'] ?? 100);
    const delay = Number(req.headers['x-test-delay'] ?? 30);
    const state = { closedAt: null as number | null, closedEarly: false, written: 0 };
    streams.push(state);
    res.on('close', () => {
      state.closedAt = Date.now();
      state.closedEarly = !res.writableEnded;
    });
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.flushHeaders();
    for (let i = 0; i < chunks; i++) {
      await sleep(delay);
      if (res.destroyed) return;
      const chunk = { id: 'chatcmpl-slow', object: 'chat.completion.chunk', model: 'mistral-small-latest', choices: [{ index: 0, delta: { content: 'word ' } }] };
      res.write(`data: ${JSON.stringify(chunk)}\n\n`);
      state.written += 1;
    }
    res.end('data: [DONE]\n\n');
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    streams,
    flooded: () => flooded,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A TCP server that accepts connections and never says a word: a TLS handshake with it never ends. */
/** Waits until the response can take more, or is gone; whichever comes first removes the other listener. */
function drainedOrClosed(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.once('drain', done);
    res.once('close', done);
  });
}

async function startSilentServer(): Promise<{ port: number; connections: () => number; close(): Promise<void> }> {
  const sockets = new Set<import('node:net').Socket>();
  let connections = 0;
  const server = createNetServer((socket) => {
    connections += 1;
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    connections: () => connections,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

async function closedPort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Reads a streamed body, noting when each read arrived (ms since `start`). */
async function readTimed(res: Response, start: number): Promise<{ text: string; reads: { at: number; text: string }[]; endAt: number }> {
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  const reads: { at: number; text: string }[] = [];
  let text = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const piece = decoder.decode(value, { stream: true });
    reads.push({ at: Date.now() - start, text: piece });
    text += piece;
  }
  return { text, reads, endAt: Date.now() - start };
}

describe.each(databasesUnderTest())('forward gateway relay on %s', (dialect) => {
  let upstream: MockUpstream;
  let raw: RawProvider;
  let silent: Awaited<ReturnType<typeof startSilentServer>>;
  let t: TestApp;
  let base: string;
  let customer: { customer_id: string; wallet: { wallet_id: string } };
  let meter: { meter_slug: string };
  let customerToken: string;
  // A second gateway with short upstream timeouts.
  let tt: TestApp;
  let timeoutBase: string;

  beforeAll(async () => {
    upstream = await startMockUpstream();
    raw = await startRawProvider();
    silent = await startSilentServer();
    const overrides = {
      'api.openai.com': upstream.url,
      'api.anthropic.com': upstream.url,
      'api.mistral.ai': raw.url,
      'api.groq.com': `https://127.0.0.1:${silent.port}`,
    };
    const keys = { openai: 'sk-managed-openai', anthropic: 'sk-managed-anthropic', mistral: 'managed-mistral', xai: 'managed-xai', groq: 'managed-groq' };
    t = await startTestApp(dialect, { env: { UPSTREAM_OVERRIDES: JSON.stringify(overrides), PROVIDER_KEYS: JSON.stringify(keys) } });
    base = await t.listen();
    const h = t.auth();
    customer = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json();
    meter = (
      await t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'Chat', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [{ start: '0', rate: '100' }] },
      })
    ).json();
    customerToken = Buffer.from(
      JSON.stringify({ secret_key: t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug }),
    ).toString('base64');
    await creditWallet(t.storage, customer.wallet.wallet_id, parseMoney('10'));
    await creditWallet(t.storage, t.merchant.walletId, parseMoney('10'));

    tt = await startTestApp(dialect, {
      env: {
        UPSTREAM_OVERRIDES: JSON.stringify({ ...overrides, 'api.x.ai': `http://127.0.0.1:${await closedPort()}` }),
        PROVIDER_KEYS: JSON.stringify(keys),
        UPSTREAM_TIMEOUT_MS: '300',
        UPSTREAM_IDLE_TIMEOUT_MS: '300',
      },
    });
    timeoutBase = await tt.listen();
    await creditWallet(tt.storage, tt.merchant.walletId, parseMoney('10'));
  });
  afterAll(async () => {
    await tt?.close();
    await t?.close();
    await upstream?.close();
    await raw?.close();
    await silent?.close();
  });

  const wallet = async (id: string, app: TestApp = t) => (await findWallet(app.storage, id))!;
  const merchantAuth = () => ({ authorization: `Bearer ${t.merchant.secretKey}` });
  const OPENAI_CHAT = `u=${encodeURIComponent('https://api.openai.com/v1/chat/completions')}`;
  const MISTRAL_CHAT = `u=${encodeURIComponent('https://api.mistral.ai/v1/chat/completions')}`;

  function post(query: string, body: string | Buffer, headers: Record<string, string> = {}, root = base, signal?: AbortSignal): Promise<Response> {
    return fetch(`${root}/v1/forward?${query}`, {
      method: 'POST',
      headers: { ...merchantAuth(), 'content-type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : Uint8Array.from(body),
      ...(signal ? { signal } : {}),
    });
  }

  describe('bodies byte for byte', () => {
    it('sends the request body exactly as received: unknown fields, odd whitespace, escapes, key order', async () => {
      const body =
        '{ "model" : "gpt-4o",\n\t"messages":[ {"role":"user","content":"h\u00e9llo \\u00e9 w\u00f6rld \\ud83d\\ude00"} ],\r\n' +
        '  "zzz_unknown": {"nested": [1, 2.50, 1e3, null, true]}, "max_tokens":3, "a": "dup", "a": "dup2"   }\n\n';
      const before = upstream.requests.length;
      const res = await post(OPENAI_CHAT, body, { 'x-custom-client-header': 'passes' });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      expect(upstream.requests.length).toBe(before + 1);
      const seen = upstream.requests.at(-1)!;
      expect(seen.body.equals(Buffer.from(body))).toBe(true);
      expect(seen.headers['content-length']).toBe(String(Buffer.byteLength(body)));
      expect(seen.headers['content-type']).toBe('application/json');
      expect(seen.headers['x-custom-client-header']).toBe('passes');
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).status).toBe('completed');
    });

    it('sends a binary request body exactly', async () => {
      const bytes = randomBytes(70_000);
      const res = await post(`u=${encodeURIComponent('https://api.openai.com/v1/echo')}`, bytes, { 'content-type': 'application/octet-stream' });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      const seen = upstream.requests.at(-1)!;
      expect(seen.body.equals(bytes)).toBe(true);
      expect(seen.headers['content-type']).toBe('application/octet-stream');
    });

    it('a stream that already asks for usage is sent untouched', async () => {
      const body = '{"model":"gpt-4o",  "stream":true, "stream_options":{"include_usage":true, "x":1},"max_tokens":2,"messages":[{"role":"user","content":"a"}]}';
      const res = await post(OPENAI_CHAT, body);
      const text = await res.text();
      expect(upstream.requests.at(-1)!.body.toString()).toBe(body);
      // The client asked for the usage chunk: it gets it.
      expect(text).toContain('"usage":{"prompt_tokens"');
    });

    it('a stream that does not ask for usage keeps every field; only stream_options.include_usage is added', async () => {
      const original = { model: 'gpt-4o', stream: true, max_tokens: 2, messages: [{ role: 'user', content: 'a' }], zz_unknown: { keep: [1, 2] }, stream_options: { other: 'kept' } };
      const res = await post(OPENAI_CHAT, JSON.stringify(original));
      const text = await res.text();
      expect(upstream.requests.at(-1)!.json).toEqual({ ...original, stream_options: { other: 'kept', include_usage: true } });
      expect(text).not.toContain('"usage":{');
    });

    it('relays the provider body and headers exactly', async () => {
      const res = await post(MISTRAL_CHAT, '{"model":"mistral-small-latest","messages":[{"role":"user","content":"x"}]}', { 'x-test-mode': 'raw-json' });
      expect(res.status).toBe(200);
      expect(res.headers.get('x-provider-extra')).toBe('kept');
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(RAW_JSON))).toBe(true);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', usage_estimated: false, model_usage: { input_tokens: 3, output_tokens: 2 } });
    });

    it('relays a large binary provider body intact', async () => {
      const res = await post(MISTRAL_CHAT, '{"model":"mistral-small-latest"}', { 'x-test-mode': 'big' });
      expect(res.status).toBe(200);
      const got = Buffer.from(await res.arrayBuffer());
      expect(got.length).toBe(BIG_BODY.length);
      expect(createHash('sha256').update(got).digest('hex')).toBe(createHash('sha256').update(BIG_BODY).digest('hex'));
    });

    it('a client that does not read slows the provider down instead of growing the gateway', async () => {
      const aborted = new AbortController();
      const res = await post(MISTRAL_CHAT, '{"model":"mistral-small-latest"}', { 'x-test-mode': 'flood' }, base, aborted.signal);
      expect(res.status).toBe(200);
      // The body is not read: the provider may fill the sockets' buffers on the way, and no more.
      // Wait until it stops: no more written over five looks 20 ms apart.
      let written = raw.flooded();
      for (let still = 0, looks = 0; still < 5 && looks < 500; looks++) {
        await sleep(20);
        const now = raw.flooded();
        still = now === written ? still + 1 : 0;
        written = now;
      }
      expect(written).toBeGreaterThan(0);
      expect(written).toBeLessThan(64 * 1024 * 1024);
      aborted.abort();
    });

    it('relays binary audio from the mock byte for byte', async () => {
      const input = 'Hello, audio!';
      const res = await post(`u=${encodeURIComponent('https://api.openai.com/v1/audio/speech')}`, JSON.stringify({ model: 'tts-1', input, voice: 'alloy' }));
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('audio/mpeg');
      const got = Buffer.from(await res.arrayBuffer());
      expect(got.equals(Buffer.from(Array.from({ length: input.length }, (_, i) => i % 256)))).toBe(true);
    });
  });

  describe('streams', () => {
    it.each([
      ['the gateway hides the usage chunk it asked for', false],
      ['the client asked for usage itself', true],
    ])('relays SSE chunk by chunk (%s)', async (_name, clientAsksUsage) => {
      const delay = 60;
      upstream.setNext({ path: '/chat/completions', chunkDelayMs: delay });
      const start = Date.now();
      const res = await post(
        OPENAI_CHAT,
        JSON.stringify({
          model: 'gpt-4o',
          stream: true,
          max_tokens: 8,
          messages: [{ role: 'user', content: 'count to eight' }],
          ...(clientAsksUsage ? { stream_options: { include_usage: true } } : {}),
        }),
      );
      expect(res.headers.get('content-type')).toContain('text/event-stream');
      const { text, reads, endAt } = await readTimed(res, start);
      // role + 8 words + finish (+ usage) + [DONE], each after `delay` ms upstream.
      const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
      expect(events.at(-1)).toBe('data: [DONE]');
      expect(events.length).toBe(clientAsksUsage ? 12 : 11);
      const firstEventAt = reads.find((r) => r.text.includes('\n\n'))!.at;
      // The first event reached the client long before the stream ended: nothing was buffered.
      expect(endAt - firstEventAt).toBeGreaterThan(delay * 5);
      // Several separate arrivals, spread over the stream's life.
      expect(reads.length).toBeGreaterThanOrEqual(5);
      const spread = reads.at(-1)!.at - reads[0]!.at;
      expect(spread).toBeGreaterThan(delay * 5);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', usage_estimated: false, model_usage: { output_tokens: 8 } });
    });

    it('a client disconnect mid-stream aborts the upstream call; the record is settled from what was seen', async () => {
      const before = await wallet(customer.wallet.wallet_id);
      const controller = new AbortController();
      const streamsBefore = raw.streams.length;
      const res = await post(
        MISTRAL_CHAT,
        JSON.stringify({ model: 'mistral-small-latest', stream: true, messages: [{ role: 'user', content: 'tell me a very long story please' }] }),
        { authorization: `Bearer ${customerToken}`, 'x-test-chunks': '200', 'x-test-delay': '25' },
        base,
        controller.signal,
      );
      const requestId = res.headers.get('x-tollgate-request-id')!;
      const reader = res.body!.getReader();
      let text = '';
      while ((text.match(/\n\n/g) ?? []).length < 3) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
      const abortedAt = Date.now();
      controller.abort();
      await reader.cancel().catch(() => {});
      expect(raw.streams.length).toBe(streamsBefore + 1);
      const stream = raw.streams.at(-1)!;
      for (let i = 0; i < 100 && stream.closedAt === null; i++) await sleep(10);
      // The provider saw its socket close early, soon after the client left (200 × 25 ms = 5 s otherwise).
      expect(stream.closedEarly).toBe(true);
      expect(stream.closedAt! - abortedAt).toBeLessThan(1000);
      expect(stream.written).toBeLessThan(200);

      const record = await t.settledRecord(requestId);
      expect(record.status).toBe('completed');
      expect(record.usage_estimated).toBe(true);
      expect(record.model_usage.output_tokens).toBeGreaterThan(0);
      expect(record.model_usage.input_tokens).toBeGreaterThan(0);
      expect(parseMoney(record.total_request_cost)).toBeGreaterThan(0n);
      const after = await wallet(customer.wallet.wallet_id);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(after.held).toBe(0n);
    });

    it('a stream cut by the provider mid-way is settled from what was seen, flagged, and not free', async () => {
      upstream.setNext({ path: '/chat/completions', cutAfterChunks: 4 });
      const res = await post(
        OPENAI_CHAT,
        JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 20, messages: [{ role: 'user', content: 'one two three' }] }),
        { authorization: `Bearer ${customerToken}` },
      );
      expect(res.status).toBe(200);
      // The client sees the cut too (a truncated transfer), as it would talking to the provider directly.
      const text = await res.text().then(
        (t) => ({ t, error: null as unknown }),
        (error: unknown) => ({ t: '', error }),
      );
      expect(text.error).not.toBeNull();
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record.status).toBe('completed');
      expect(record.usage_estimated).toBe(true);
      expect(record.model_usage.output_tokens).toBeGreaterThan(0);
      expect(record.model_usage.output_tokens).toBeLessThan(20);
      expect(parseMoney(record.total_request_cost)).toBeGreaterThan(0n);
      expect((await wallet(customer.wallet.wallet_id)).held).toBe(0n);
    });
  });

  describe('never free: the provider may have worked without reporting usage', () => {
    const recordIds = async () => new Set((await t.storage.db.selectFrom('requests').select('id').execute()).map((r) => r.id));
    async function newRecordId(known: Set<string>): Promise<string> {
      for (let i = 0; i < 100; i++) {
        const fresh = [...(await recordIds())].filter((id) => !known.has(id));
        if (fresh.length === 1) return fresh[0]!;
        await sleep(20);
      }
      throw new Error('no new record');
    }

    it('a client that leaves before the provider answers is charged for the prompt the provider received, flagged', async () => {
      upstream.setNext({ path: '/chat/completions', delayMs: 1500 });
      const known = await recordIds();
      const before = await wallet(customer.wallet.wallet_id);
      const seen = upstream.requests.length;
      const controller = new AbortController();
      // 16 prompt characters → 4 estimated input tokens.
      const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'abcdefghijklmnop' }] });
      const pending = post(OPENAI_CHAT, body, { authorization: `Bearer ${customerToken}` }, base, controller.signal).catch(() => null);
      while (upstream.requests.length === seen) await sleep(10);
      controller.abort();
      expect(await pending).toBeNull();

      const record = await t.settledRecord(await newRecordId(known));
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 4, output_tokens: 0 } });
      // gpt-4o input 2.5 per 1M: 4 × 2.5 / 1e6; the meter's fee: 4 × 100 / 1e6.
      expect(record.model_usage.input_cost).toBe('0.0000100000');
      expect(record.fee.amount).toBe('0.0004000000');
      const after = await wallet(customer.wallet.wallet_id);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(parseMoney(record.total_wallet_cost)).toBeGreaterThan(0n);
      expect(after.held).toBe(0n);
    });

    it('a client that leaves before the request could reach the provider is charged nothing', async () => {
      // api.groq.com is mapped to a TLS port that never answers the handshake: the request is never sent.
      const known = await recordIds();
      const before = await wallet(customer.wallet.wallet_id);
      const controller = new AbortController();
      const pending = post(
        `u=${encodeURIComponent('https://api.groq.com/openai/v1/chat/completions')}`,
        JSON.stringify({ model: 'llama-3.3-70b-versatile', max_tokens: 50, messages: [{ role: 'user', content: 'abcdefghijklmnop' }] }),
        { authorization: `Bearer ${customerToken}` },
        base,
        controller.signal,
      ).catch(() => null);
      while (silent.connections() === 0) await sleep(10);
      await sleep(50);
      controller.abort();
      expect(await pending).toBeNull();

      const record = await t.settledRecord(await newRecordId(known));
      expect(record.status).toBe('error');
      expect(parseMoney(record.total_request_cost)).toBe(0n);
      const after = await wallet(customer.wallet.wallet_id);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
    });

    it('a non-streaming answer cut by the provider is settled from the prompt and the part seen, flagged', async () => {
      const before = await wallet(customer.wallet.wallet_id);
      const res = await post(MISTRAL_CHAT, JSON.stringify({ model: 'mistral-small-latest', messages: [{ role: 'user', content: 'abcdefgh' }] }), {
        authorization: `Bearer ${customerToken}`,
        'x-test-mode': 'cut-json',
      });
      expect(res.status).toBe(200);
      await expect(res.text()).rejects.toThrow();
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      // 8 prompt characters → 2 input tokens; 40 characters seen → 10 output tokens.
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 2, output_tokens: 10 } });
      expect(record.fee.amount).toBe('0.0012000000');
      const after = await wallet(customer.wallet.wallet_id);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(after.held).toBe(0n);
    });

    it('a generation answer without usage is settled from the prompt and its text, flagged', async () => {
      const res = await post(MISTRAL_CHAT, JSON.stringify({ model: 'mistral-small-latest', messages: [{ role: 'user', content: 'abcdefgh' }] }), {
        authorization: `Bearer ${customerToken}`,
        'x-test-mode': 'no-usage',
      });
      expect(await res.text()).toBe(NO_USAGE_JSON);
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      // 2 input tokens; the answer's text is 32 characters → 8 output tokens; fee 10 × 100 / 1e6.
      expect(record).toMatchObject({ status: 'completed', usage_estimated: true, model_usage: { input_tokens: 2, output_tokens: 8 } });
      expect(record.fee.amount).toBe('0.0010000000');
    });

    it('an answer without usage from an endpoint not billed by usage (a model list) stays free and unflagged', async () => {
      const res = await fetch(`${base}/v1/forward?u=${encodeURIComponent('https://api.mistral.ai/v1/models')}`, {
        headers: { authorization: `Bearer ${customerToken}`, 'x-test-mode': 'no-usage' },
      });
      expect(res.status).toBe(200);
      await res.text();
      const record = await t.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record).toMatchObject({ status: 'completed', usage_estimated: false, model_usage: { input_tokens: 0, output_tokens: 0 } });
      expect(parseMoney(record.total_request_cost)).toBe(0n);
    });
  });

  describe('provider errors', () => {
    it.each([
      [429, { error: { message: 'Slow down, custom.', type: 'rate_limit_error', code: 'rate_limit_exceeded', extra: [1, 2] } }],
      [400, { error: { message: "Invalid 'messages'.", type: 'invalid_request_error', param: 'messages', code: null } }],
      [400, undefined],
      [503, undefined],
    ])('relays an upstream %s unchanged, records error, releases the hold and charges nothing', async (status, errorBody) => {
      upstream.setNext({ status, ...(errorBody ? { errorBody } : {}), headers: { 'x-ratelimit-remaining-requests': '0' } });
      const customerBefore = await wallet(customer.wallet.wallet_id);
      const merchantBefore = await wallet(t.merchant.walletId);
      const res = await post(OPENAI_CHAT, JSON.stringify({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'hi' }] }), {
        authorization: `Bearer ${customerToken}`,
      });
      expect(res.status).toBe(status);
      const text = await res.text();
      if (errorBody) expect(text).toBe(JSON.stringify(errorBody));
      else expect(JSON.parse(text)).toMatchObject({ error: { message: `Mock upstream error ${status}.` } });
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(res.headers.get('x-ratelimit-remaining-requests')).toBe('0');
      if (status === 429) expect(res.headers.get('retry-after')).toBe('1');
      const requestId = res.headers.get('x-tollgate-request-id');
      expect(requestId).toMatch(/^req_/);
      const record = await t.settledRecord(requestId!);
      expect(record.status).toBe('error');
      expect(parseMoney(record.total_request_cost)).toBe(0n);
      const customerAfter = await wallet(customer.wallet.wallet_id);
      const merchantAfter = await wallet(t.merchant.walletId);
      expect(customerAfter.balance).toBe(customerBefore.balance);
      expect(merchantAfter.balance).toBe(merchantBefore.balance);
      expect(customerAfter.held).toBe(0n);
      expect(merchantAfter.held).toBe(0n);
    });

    it('relays an Anthropic-shaped 400 unchanged', async () => {
      upstream.setNext({ status: 400 });
      const res = await post(
        `u=${encodeURIComponent('https://api.anthropic.com/v1/messages')}`,
        JSON.stringify({ model: 'claude-sonnet-4-5', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
      );
      expect(res.status).toBe(400);
      expect(await res.json()).toEqual({ type: 'error', error: { type: 'invalid_request_error', message: 'Mock upstream error 400.' } });
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).status).toBe('error');
    });
  });

  describe('timeouts and unreachable providers (UPSTREAM_TIMEOUT_MS=300)', () => {
    it('an upstream that never answers → 504 upstream_timeout, record error, hold released', async () => {
      upstream.setNext({ hang: true });
      const before = await wallet(tt.merchant.walletId, tt);
      const start = Date.now();
      const res = await post(OPENAI_CHAT, JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }), {
        authorization: `Bearer ${tt.merchant.secretKey}`,
      }, timeoutBase);
      const elapsed = Date.now() - start;
      expect(res.status).toBe(504);
      expect(((await res.json()) as Envelope).error).toMatchObject({ code: 'upstream_timeout', status: 504 });
      expect(elapsed).toBeGreaterThanOrEqual(250);
      expect(elapsed).toBeLessThan(10_000);
      const requestId = res.headers.get('x-tollgate-request-id');
      expect(requestId).toMatch(/^req_/);
      const record = await tt.settledRecord(requestId!);
      expect(record.status).toBe('error');
      const after = await wallet(tt.merchant.walletId, tt);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
    });

    it('an unreachable upstream → 502 upstream_unreachable, record error, hold released', async () => {
      const before = await wallet(tt.merchant.walletId, tt);
      const res = await post(
        `u=${encodeURIComponent('https://api.x.ai/v1/chat/completions')}`,
        JSON.stringify({ model: 'grok-3', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }),
        { authorization: `Bearer ${tt.merchant.secretKey}` },
        timeoutBase,
      );
      expect(res.status).toBe(502);
      expect(((await res.json()) as Envelope).error.code).toBe('upstream_unreachable');
      const record = await tt.settledRecord(res.headers.get('x-tollgate-request-id')!);
      expect(record.status).toBe('error');
      const after = await wallet(tt.merchant.walletId, tt);
      expect(after.balance).toBe(before.balance);
      expect(after.held).toBe(0n);
    });

    it('a stream that stalls longer than UPSTREAM_IDLE_TIMEOUT_MS is cut and settled as estimated', async () => {
      upstream.setNext({ path: '/chat/completions', chunkDelayMs: 1500 });
      const known = new Set((await tt.storage.db.selectFrom('requests').select('id').execute()).map((r) => r.id));
      // The provider sent its headers and then nothing: the client's transfer is cut (before or
      // after the status line reaches it, depending on buffering), never ended as if complete.
      const outcome = await post(
        OPENAI_CHAT,
        JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 5, messages: [{ role: 'user', content: 'one two three four five six' }] }),
        { authorization: `Bearer ${tt.merchant.secretKey}` },
        timeoutBase,
      ).then(
        (res) => res.text().then(() => 'complete', () => 'cut'),
        () => 'cut',
      );
      expect(outcome).toBe('cut');
      const ids = (await tt.storage.db.selectFrom('requests').select('id').execute()).map((r) => r.id).filter((id) => !known.has(id));
      expect(ids.length).toBe(1);
      const record = await tt.settledRecord(ids[0]!);
      expect(record.status).toBe('completed');
      expect(record.usage_estimated).toBe(true);
      expect(parseMoney(record.total_request_cost)).toBeGreaterThan(0n);
      expect((await wallet(tt.merchant.walletId, tt)).held).toBe(0n);
    });
  });

  describe('metadata and the request id header', () => {
    const chat = JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] });

    it('takes metadata from the metadata query parameter', async () => {
      const metadata = encodeURIComponent(JSON.stringify({ team: 'search', user_id: 'u_42' }));
      for (const query of [`${OPENAI_CHAT}&metadata=${metadata}`, `metadata=${metadata}&${OPENAI_CHAT}`, `metadata=${metadata}&u=https://api.openai.com/v1/chat/completions`]) {
        const res = await post(query, chat);
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        expect(upstream.requests.at(-1)!.url).toBe('/v1/chat/completions');
        expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).metadata).toEqual({ team: 'search', user_id: 'u_42' });
      }
    });

    it('takes metadata from the x-service-metadata header, which does not reach the provider', async () => {
      const res = await post(OPENAI_CHAT, chat, { 'x-service-metadata': JSON.stringify({ feature: 'chat_v2' }) });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      expect(upstream.requests.at(-1)!.headers['x-service-metadata']).toBeUndefined();
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).metadata).toEqual({ feature: 'chat_v2' });
    });

    it('merges the query parameter and the header key by key, the query parameter winning, as POST /requests does', async () => {
      const query = encodeURIComponent('{"from":"query","feature":"chat"}');
      const res = await post(`${OPENAI_CHAT}&metadata=${query}`, chat, { 'x-service-metadata': '{"from":"header","team":"search"}' });
      await res.arrayBuffer();
      expect((await t.settledRecord(res.headers.get('x-tollgate-request-id')!)).metadata).toEqual({ from: 'query', feature: 'chat', team: 'search' });
    });

    it('refuses more than 100 pairs across the query parameter and the header with 400 invalid_metadata', async () => {
      const pairs = (prefix: string) => encodeURIComponent(JSON.stringify(Object.fromEntries(Array.from({ length: 60 }, (_, i) => [`${prefix}${i}`, 'v']))));
      const before = upstream.requests.length;
      const res = await post(`${OPENAI_CHAT}&metadata=${pairs('q')}`, chat, { 'x-service-metadata': decodeURIComponent(pairs('h')) });
      expect(res.status).toBe(400);
      expect(((await res.json()) as Envelope).error.code).toBe('invalid_metadata');
      expect(upstream.requests.length).toBe(before);
    });

    it.each([
      ['not JSON', 'not json'],
      ['a JSON array', '["a"]'],
      ['a non-string value', '{"n":1}'],
      ['a bad key', '{"bad key":"x"}'],
      ['an empty value', '{"k":""}'],
      ['too many pairs', JSON.stringify(Object.fromEntries(Array.from({ length: 101 }, (_, i) => [`k${i}`, 'v'])))],
    ])('bad metadata (%s) → 400 invalid_metadata before any provider call', async (_name, text) => {
      for (const [query, headers] of [
        [`${OPENAI_CHAT}&metadata=${encodeURIComponent(text)}`, {}],
        [OPENAI_CHAT, { 'x-service-metadata': text }],
      ] as const) {
        const before = upstream.requests.length;
        const res = await post(query, chat, headers);
        expect(res.status).toBe(400);
        expect(((await res.json()) as Envelope).error.code).toBe('invalid_metadata');
        expect(upstream.requests.length).toBe(before);
      }
    });

    it('x-tollgate-request-id is on success, upstream error, 402 and 504 responses, and names the record', async () => {
      const ok = await post(OPENAI_CHAT, chat);
      await ok.arrayBuffer();
      expect(ok.status).toBe(200);
      const okId = ok.headers.get('x-tollgate-request-id')!;
      expect((await t.settledRecord(okId)).request_id).toBe(okId);

      upstream.setNext({ status: 429 });
      const limited = await post(OPENAI_CHAT, chat);
      await limited.arrayBuffer();
      expect(limited.status).toBe(429);
      const limitedId = limited.headers.get('x-tollgate-request-id')!;
      expect((await t.settledRecord(limitedId)).status).toBe('error');

      const broke = await t.newMerchant('Broke');
      const before = upstream.requests.length;
      const refused = await post(OPENAI_CHAT, chat, { authorization: `Bearer ${broke.secretKey}` });
      expect(refused.status).toBe(402);
      expect(((await refused.json()) as Envelope).error.code).toBe('insufficient_balance');
      expect(refused.headers.get('x-tollgate-request-id')).toMatch(/^req_/);
      expect(upstream.requests.length).toBe(before);

      upstream.setNext({ hang: true });
      const timedOut = await post(OPENAI_CHAT, chat, { authorization: `Bearer ${tt.merchant.secretKey}` }, timeoutBase);
      await timedOut.arrayBuffer();
      expect(timedOut.status).toBe(504);
      expect(timedOut.headers.get('x-tollgate-request-id')).toMatch(/^req_/);

      expect(new Set([okId, limitedId, refused.headers.get('x-tollgate-request-id'), timedOut.headers.get('x-tollgate-request-id')]).size).toBe(4);
    });
  });

  it('leaves both ledgers balanced with nothing held', async () => {
    for (const app of [t, tt]) {
      // Give any settlement still in flight a moment.
      for (let i = 0; i < 50; i++) {
        const pending = await app.storage.db.selectFrom('requests').select('id').where('status', '=', 'pending').execute();
        if (pending.length === 0) break;
        await sleep(20);
      }
      expect((await verifyLedger(app.storage)).problems).toEqual([]);
      const held = await app.storage.db.selectFrom('wallets').select('held').execute();
      expect(held.every((w) => BigInt(w.held) === 0n)).toBe(true);
    }
  });
});
