import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCliCode } from '../../src/storage/cli-codes.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { TestClock } from '../helpers/clock.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

describe.each(databasesUnderTest())('POST /v1/auth/callback on %s', (dialect) => {
  let t: TestApp;
  const clock = new TestClock(Date.parse('2026-03-01T10:00:00Z'));

  beforeAll(async () => {
    t = await startTestApp(dialect, { clock });
  });
  afterAll(() => t.close());

  const exchange = (payload: unknown) =>
    t.app.inject({ method: 'POST', url: '/v1/auth/callback', headers: { 'content-type': 'application/json' }, payload: JSON.stringify(payload) });

  it('turns a fresh code into a working secret key and a wallet key on the merchant wallet, without an API key', async () => {
    const code = await createCliCode(t.storage, t.merchant.merchantId, clock.now());
    const res = await exchange({ code });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body).toMatchObject({
      merchant_id: t.merchant.merchantId,
      account_id: t.merchant.merchantId,
      wallet_id: t.merchant.walletId,
    });
    expect(body.secret_key).toMatch(/^sk_live_/);
    expect(body.wallet_key).toMatch(/^wk_live_/);
    const meters = await t.app.inject({ method: 'GET', url: '/v1/meters', headers: t.auth(body.secret_key) });
    expect(meters.statusCode).toBe(200);
    const keys = (await t.app.inject({ method: 'GET', url: '/v1/secret_keys', headers: t.auth() })).json();
    expect(keys.data.map((k: { secret_key_id: string }) => k.secret_key_id)).toContain(body.secret_key_id);
  });

  it('refuses a code exchanged a second time with auth_code_used', async () => {
    const code = await createCliCode(t.storage, t.merchant.merchantId, clock.now());
    expect((await exchange({ code })).statusCode).toBe(200);
    const again = await exchange({ code });
    expect(again.statusCode).toBe(400);
    expect(again.json().error.code).toBe('auth_code_used');
  });

  it('gives exactly one of two concurrent exchanges of one code the credentials', async () => {
    const code = await createCliCode(t.storage, t.merchant.merchantId, clock.now());
    const results = await Promise.all([exchange({ code }), exchange({ code })]);
    expect(results.map((r) => r.statusCode).sort()).toEqual([200, 400]);
  });

  it('accepts a code 59 s old and refuses one 61 s old with auth_code_expired', async () => {
    const young = await createCliCode(t.storage, t.merchant.merchantId, clock.now());
    const old = await createCliCode(t.storage, t.merchant.merchantId, clock.now());
    clock.advance(59_000);
    expect((await exchange({ code: young })).statusCode).toBe(200);
    clock.advance(2_000);
    const res = await exchange({ code: old });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('auth_code_expired');
  });

  it('refuses a code never issued with auth_code_invalid', async () => {
    const res = await exchange({ code: 'cli_never-issued' });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('auth_code_invalid');
  });

  it.each([
    ['no code', {}],
    ['a numeric code', { code: 42 }],
    ['an empty code', { code: '' }],
  ])('refuses a body with %s as validation_error naming the field', async (_name, payload) => {
    const res = await exchange(payload);
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('validation_error');
    expect(res.json().error.issues[0].path).toEqual(['code']);
  });

  it('refuses a body that is not JSON with invalid_json', async () => {
    const res = await t.app.inject({ method: 'POST', url: '/v1/auth/callback', headers: { 'content-type': 'application/json' }, payload: '{code:' });
    expect(res.statusCode).toBe(400);
    expect(res.json().error.code).toBe('invalid_json');
  });

  it('is in the OpenAPI document without a security requirement', async () => {
    const doc = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    expect(doc.paths['/v1/auth/callback'].post.security).toEqual([]);
  });
});
