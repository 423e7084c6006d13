import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/**
 * No raw credential at rest in the idempotency table (decision 0019): the
 * response of a key-creating POST sent with an Idempotency-Key is stored sealed under the caller's
 * own credential, so its replay still answers the raw key while the database holds no trace of it.
 */

type Created = { key?: string; secret_key?: string; spend_key_id?: string; wallet_key_id?: string };

describe.each(databasesUnderTest())('idempotent key-creating calls on %s', (dialect) => {
  let t: TestApp;
  let customerId: string;
  let spendKeyId: string;
  let walletKeyId: string;

  beforeAll(async () => {
    t = await startTestApp(dialect);
    customerId = (await t.app.inject({ method: 'POST', url: '/v1/customers', headers: t.auth(), payload: {} })).json().customer_id;
    spendKeyId = (await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: t.auth(), payload: { name: 's' } })).json().spend_key_id;
    walletKeyId = (
      await t.app.inject({ method: 'POST', url: '/v1/wallet_keys', headers: t.auth(), payload: { customer_id: customerId } })
    ).json().wallet_key_id;
  });
  afterAll(async () => t?.close());

  const storedText = async () => JSON.stringify(await t.storage.db.selectFrom('idempotency_keys').selectAll().execute(), (_k, v: unknown) => (typeof v === 'bigint' ? String(v) : v));

  it.each([
    ['a secret key', '/v1/secret_keys', () => ({ name: 'idem' }), (c: Created) => c.secret_key],
    ['a spend key', '/v1/spend_keys', () => ({ name: 'idem' }), (c: Created) => c.key],
    ['a rotated spend key', () => `/v1/spend_keys/${spendKeyId}/rotate`, () => undefined, (c: Created) => c.key],
    ['a wallet key', '/v1/wallet_keys', () => ({ customer_id: customerId }), (c: Created) => c.key],
    ['a rotated wallet key', () => `/v1/wallet_keys/${walletKeyId}/rotate`, () => undefined, (c: Created) => c.key],
  ])('%s: stored without the raw key, replayed with it', async (_what, path, body, rawKeyOf) => {
    const url = typeof path === 'function' ? path() : path;
    const idempotencyKey = `idem-${url}`;
    const send = () =>
      t.app.inject({
        method: 'POST',
        url,
        headers: { ...t.auth(), 'idempotency-key': idempotencyKey, ...(body() === undefined ? {} : { 'content-type': 'application/json' }) },
        ...(body() === undefined ? {} : { payload: body() }),
      });
    const first = await send();
    expect(first.statusCode, first.body).toBeLessThan(300);
    const rawKey = rawKeyOf(first.json());
    expect(rawKey).toMatch(/^(sk|spk|wk)_live_/);

    const stored = await storedText();
    expect(stored).toContain(idempotencyKey);
    expect(stored, 'the raw key is in the idempotency table').not.toContain(rawKey);
    expect(stored).not.toContain(rawKey!.slice(-16));

    const replay = await send();
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.statusCode).toBe(first.statusCode);
    expect(replay.json()).toEqual(first.json());
  });

  it('another key of the same merchant cannot replay the sealed response (its own scope, a new resource)', async () => {
    const other = (await t.app.inject({ method: 'POST', url: '/v1/secret_keys', headers: t.auth(), payload: { name: 'other' } })).json().secret_key;
    const headers = { 'idempotency-key': 'idem-shared', 'content-type': 'application/json' };
    const mine = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: { ...t.auth(), ...headers }, payload: { name: 'x' } });
    const theirs = await t.app.inject({ method: 'POST', url: '/v1/spend_keys', headers: { ...t.auth(other), ...headers }, payload: { name: 'x' } });
    expect(theirs.headers['idempotent-replayed']).toBeUndefined();
    expect(theirs.json().key).not.toBe(mine.json().key);
  });
});
