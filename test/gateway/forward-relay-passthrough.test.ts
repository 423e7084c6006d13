import { createHash, randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';
import { OPENAI_CHAT } from '../helpers/gateway.ts';
import { BIG_BODY, RAW_JSON } from '../helpers/raw-provider.ts';
import { MISTRAL_CHAT, useRelayGateway } from '../helpers/relay-gateway.ts';

/**
 * The relay over real HTTP passes what it is given on as it comes: request bodies byte for byte,
 * the provider's body and headers back (binary and large ones too, at the pace of a client that
 * does not read), and streams chunk by chunk; a client disconnect aborts the upstream call, and a
 * stream cut by either side is settled from what was seen.
 */

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
  const h = useRelayGateway(dialect);
  const { upstream, raw, t, customer, wallet, post } = h;

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
      const res = await post(MISTRAL_CHAT, '{"model":"mistral-small-latest"}', { 'x-test-mode': 'flood' }, h.base, aborted.signal);
      expect(res.status).toBe(200);
      // The body is not read: the provider may fill the sockets' buffers on the way, and no more.
      // Wait until it stops: no more written over five looks 20 ms apart.
      let written = raw.flooded();
      let still = 0;
      await until(
        () => {
          const now = raw.flooded();
          still = now === written ? still + 1 : 0;
          written = now;
          return still >= 5;
        },
        'the provider to stop writing',
        { intervalMs: 20, timeoutMs: 10_000 },
      );
      expect(written).toBeGreaterThan(0);
      expect(written).toBeLessThan(64 * 1024 * 1024);
      aborted.abort();
      // Its charge lands in this test, not in the next one's balances.
      await t.app.gateway.settlements.drain();
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
      const before = await wallet(customer.walletId);
      const controller = new AbortController();
      const streamsBefore = raw.streams.length;
      const res = await post(
        MISTRAL_CHAT,
        JSON.stringify({ model: 'mistral-small-latest', stream: true, messages: [{ role: 'user', content: 'tell me a very long story please' }] }),
        { authorization: `Bearer ${h.customerToken}`, 'x-test-chunks': '200', 'x-test-delay': '25' },
        h.base,
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
      await until(() => stream.closedAt !== null, 'the provider to see its socket close');
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
      const after = await wallet(customer.walletId);
      expect(before.balance - after.balance).toBe(parseMoney(record.total_wallet_cost));
      expect(after.held).toBe(0n);
    });

    it('a stream cut by the provider mid-way is settled from what was seen, flagged, and not free', async () => {
      upstream.setNext({ path: '/chat/completions', cutAfterChunks: 4 });
      const res = await post(
        OPENAI_CHAT,
        JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 20, messages: [{ role: 'user', content: 'one two three' }] }),
        { authorization: `Bearer ${h.customerToken}` },
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
      expect((await wallet(customer.walletId)).held).toBe(0n);
    });
  });
});
