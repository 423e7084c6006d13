import { describe, expect, it } from 'vitest';
import { verifyLedger } from '../../src/ledger/verify.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';
import { OPENAI_CHAT } from '../helpers/gateway.ts';
import { useRelayGateway, type Envelope } from '../helpers/relay-gateway.ts';

/**
 * Metadata of forwarded requests (the metadata query parameter and the x-service-metadata
 * header, which never reaches the provider) and the x-tollgate-request-id header on every kind of
 * answer; both gateways' ledgers are left balanced.
 */

describe.each(databasesUnderTest())('forward gateway relay on %s', (dialect) => {
  const h = useRelayGateway(dialect, { shortTimeouts: true });
  const { upstream, t, tt, post } = h;

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
      const timedOut = await post(OPENAI_CHAT, chat, { authorization: `Bearer ${tt.merchant.secretKey}` }, h.timeoutBase);
      await timedOut.arrayBuffer();
      expect(timedOut.status).toBe(504);
      expect(timedOut.headers.get('x-tollgate-request-id')).toMatch(/^req_/);

      expect(new Set([okId, limitedId, refused.headers.get('x-tollgate-request-id'), timedOut.headers.get('x-tollgate-request-id')]).size).toBe(4);
    });
  });

  it('leaves both ledgers balanced with nothing held', async () => {
    for (const app of [t, tt]) {
      // Settlements still in flight end first.
      await until(async () => (await app.storage.db.selectFrom('requests').select('id').where('status', '=', 'pending').execute()).length === 0, 'no record left pending');
      expect((await verifyLedger(app.storage)).problems).toEqual([]);
      const held = await app.storage.db.selectFrom('wallets').select('held').execute();
      expect(held.every((w) => BigInt(w.held) === 0n)).toBe(true);
    }
  });
});
