import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { creditWallet } from '../../src/ledger/wallets.ts';
import { parseMoney } from '../../src/domain/money.ts';
import { databasesUnderTest } from '../helpers/databases.ts';
import { startGatewayOnMock, type MockGateway } from '../helpers/gateway.ts';

/**
 * Hostile inputs on every path that reads JSON (decision 0019): bodies nested far
 * deeper than any real request are refused with 400 before anything walks them, and a NUL that
 * appears only once a header, query parameter or body is decoded is a 400 on both engines (on
 * PostgreSQL it used to reach the database as a 500).
 */

const OPENAI_CHAT = 'https://api.openai.com/v1/chat/completions';
const NUL_ESCAPE = '\\u0000';

/** `{"a":{"a":…"x"…}}` nested `depth` objects deep, as text (JSON.stringify would itself recurse). */
const nested = (depth: number): string => `${'{"a":'.repeat(depth)}"x"${'}'.repeat(depth)}`;
const nestedArrays = (depth: number): string => `${'['.repeat(depth)}${']'.repeat(depth)}`;

describe.each(databasesUnderTest())('hostile input on %s', (dialect) => {
  let gw: MockGateway;
  let customer: { customer_id: string; wallet: { wallet_id: string } };
  let meter: { meter_slug: string };

  beforeAll(async () => {
    gw = await startGatewayOnMock(dialect, { providerHosts: ['api.openai.com'], providerKeys: { openai: 'sk-managed' } });
    const h = gw.t.auth();
    customer = (await gw.t.app.inject({ method: 'POST', url: '/v1/customers', headers: h, payload: {} })).json();
    meter = (
      await gw.t.app.inject({
        method: 'POST',
        url: '/v1/meters',
        headers: h,
        payload: { name: 'm', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.01' }] },
      })
    ).json();
    await creditWallet(gw.t.storage, customer.wallet.wallet_id, parseMoney('5'), new Date().toISOString());
  });
  afterAll(async () => {
    await gw.t.close();
    await gw.upstream.close();
  });

  const api = (method: 'GET' | 'POST', url: string, opts: { payload?: string; headers?: Record<string, string> } = {}) =>
    gw.t.app.inject({
      method,
      url,
      headers: { ...gw.t.auth(), ...(opts.payload === undefined ? {} : { 'content-type': 'application/json' }), ...opts.headers },
      ...(opts.payload === undefined ? {} : { payload: opts.payload }),
    });
  const forward = (payload: string, opts: { query?: string; headers?: Record<string, string> } = {}) =>
    api('POST', `/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}${opts.query ?? ''}`, { payload, headers: opts.headers });
  const chat = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });

  describe('nesting depth', () => {
    it.each([
      ['POST /v1/customers, objects', '/v1/customers', nested(6_000)],
      ['POST /v1/customers, arrays', '/v1/customers', nestedArrays(7_000)],
      ['POST /v1/requests, 65 levels', '/v1/requests', nested(65)],
    ])('%s: refused with 400 invalid_json', async (_name, url, payload) => {
      const res = await api('POST', url, { payload });
      expect(res.statusCode).toBe(400);
      expect(res.json().error).toMatchObject({ code: 'invalid_json', status: 400 });
    });

    it('accepts 64 levels (the body is then judged by its schema, not refused as JSON)', async () => {
      const res = await api('POST', '/v1/customers', { payload: JSON.stringify({ metadata: JSON.parse(nested(63)) }) });
      expect(res.json().error.code).not.toBe('invalid_json');
    });

    it('refuses a forwarded or drop-in body nested 6,000 deep before any provider call', async () => {
      const deep = `{"model":"gpt-4o-mini","messages":${nestedArrays(6_000)}}`;
      const forwarded = await forward(deep);
      expect(forwarded.statusCode).toBe(400);
      expect(forwarded.json().error.code).toBe('invalid_json');
      const dropIn = await api('POST', '/v1/chat/completions', { payload: deep });
      expect(dropIn.statusCode).toBe(400);
      expect(dropIn.json().error.code).toBe('invalid_json');
      expect(gw.upstream.requests).toHaveLength(0);
    });

    it('refuses metadata text nested 6,000 deep in a header with 400 invalid_metadata', async () => {
      const res = await forward(chat, { headers: { 'x-service-metadata': nested(6_000) } });
      expect(res.statusCode).toBe(400);
      expect(res.json().error.code).toBe('invalid_metadata');
    });
  });

  describe('NUL after decoding', () => {
    const nulMetadata = `{"team":"a${NUL_ESCAPE}b"}`;
    const requestBody = (id: string) => JSON.stringify({ request_id: id, customer_id: customer.customer_id, meter_slug: meter.meter_slug });

    it.each([
      ['x-service-metadata on POST /v1/requests', () => api('POST', '/v1/requests', { payload: requestBody('nul-h'), headers: { 'x-service-metadata': nulMetadata } })],
      ['?metadata= on POST /v1/requests', () => api('POST', `/v1/requests?metadata=${encodeURIComponent(nulMetadata)}`, { payload: requestBody('nul-q') })],
      ['metadata_filters on GET /v1/requests', () => api('GET', `/v1/requests?metadata_filters=${encodeURIComponent(`[["team","a${NUL_ESCAPE}"]]`)}`)],
      ['metadata_filters on GET /v1/usage', () => api('GET', `/v1/usage?start=2026-01-01&metadata_filters=${encodeURIComponent(`[["team","a${NUL_ESCAPE}"]]`)}`)],
      ['x-service-metadata on /v1/forward', () => forward(chat, { headers: { 'x-service-metadata': nulMetadata } })],
      ['?metadata= on /v1/forward', () => forward(chat, { query: `&metadata=${encodeURIComponent(nulMetadata)}` })],
    ])('%s: 400 invalid_metadata', async (_name, send) => {
      const res = await send();
      expect(res.statusCode).toBe(400);
      expect(res.json().error).toMatchObject({ code: 'invalid_metadata', status: 400 });
    });

    it.each([
      ['/v1/forward', () => forward(`{"model":"gpt-4o-mini${NUL_ESCAPE}","messages":[],"max_tokens":2}`)],
      ['drop-in /v1/chat/completions', () => api('POST', '/v1/chat/completions', { payload: `{"model":"gpt-4o${NUL_ESCAPE}","messages":[],"max_tokens":2}` })],
    ])('a forwarded model holding a NUL on %s: 400 before any provider call', async (_name, send) => {
      const before = gw.upstream.requests.length;
      const res = await send();
      expect(res.statusCode).toBe(400);
      expect(res.json().error).toMatchObject({ code: 'validation_error', issues: [{ path: ['model'] }] });
      expect(gw.upstream.requests).toHaveLength(before);
    });

    it.each([['customer_id'], ['meter_slug'], ['secret_key']])('a forward token whose %s holds a NUL: 4xx, never a 500', async (member) => {
      const token = { secret_key: gw.t.merchant.secretKey, customer_id: customer.customer_id, meter_slug: meter.meter_slug, [member]: 'x\u0000y' };
      const res = await gw.t.app.inject({
        method: 'POST',
        url: `/v1/forward?u=${encodeURIComponent(OPENAI_CHAT)}`,
        headers: { authorization: `Bearer ${Buffer.from(JSON.stringify(token)).toString('base64')}`, 'content-type': 'application/json' },
        payload: chat,
      });
      expect(res.statusCode).toBeGreaterThanOrEqual(400);
      expect(res.statusCode).toBeLessThan(500);
    });

    it('a NUL in a body field of a standard endpoint is still a 400', async () => {
      const res = await api('POST', '/v1/customers', { payload: `{"name":"a${NUL_ESCAPE}"}` });
      expect(res.statusCode).toBe(400);
      expect(res.json().error.code).toBe('validation_error');
    });
  });
});
