import { describe, expect, it } from 'vitest';
import { parseMoney } from '../../src/domain/money.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { OPENAI_CHAT } from '../helpers/gateway.ts';
import { useRelayGateway, type Envelope } from '../helpers/relay-gateway.ts';

/**
 * Timeouts and unreachable providers, on a gateway that gives up after 300 ms: a provider that
 * never answers is a 504, one that cannot be reached a 502 (both recorded as errors, their holds
 * released), and a stream that stalls is cut and settled as estimated.
 */

describe.each(databasesUnderTest())('forward gateway relay on %s', (dialect) => {
  const h = useRelayGateway(dialect, { shortTimeouts: true });
  const { upstream, tt, wallet, post } = h;

  describe('timeouts and unreachable providers (UPSTREAM_TIMEOUT_MS=300)', () => {
    it('an upstream that never answers → 504 upstream_timeout, record error, hold released', async () => {
      upstream.setNext({ hang: true });
      const before = await wallet(tt.merchant.walletId, tt);
      const start = Date.now();
      const res = await post(OPENAI_CHAT, JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }), {
        authorization: `Bearer ${tt.merchant.secretKey}`,
      }, h.timeoutBase);
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
        h.timeoutBase,
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
        h.timeoutBase,
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
});
