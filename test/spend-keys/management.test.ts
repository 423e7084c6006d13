import { Lava } from '@lavapayments/nodejs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Json = Record<string, unknown>;

const DAY_MS = 24 * 60 * 60 * 1000;

/** Spend key and wallet key management: the published client end to end, PATCH, /manage, bad input. */
describe.each(databasesUnderTest())('spend key management on %s', (dialect) => {
  let t: TestApp;
  let base: string;
  const client = (key: string) => new Lava(key, { baseUrl: `${base}/v1/` });

  beforeAll(async () => {
    t = await startTestApp(dialect);
    base = await t.listen();
  });
  afterAll(async () => t?.close());

  const call = async (method: string, path: string, body?: unknown, key = t.merchant.secretKey) => {
    const res = await t.app.inject({
      method: method as 'GET',
      url: `/v1${path}`,
      headers: { ...t.auth(key), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { payload: JSON.stringify(body) }),
    });
    return { status: res.statusCode, body: res.json() as Json };
  };

  it('creates, lists, retrieves, updates (PUT), rotates and revokes with the published client', async () => {
    const m = await t.newMerchant();
    const lava = client(m.secretKey);
    const created = await lava.spendKeys.create({
      name: 'IDE assistant',
      request_shape: 'openai',
      allowed_models: ['gpt-4o'],
      allowed_providers: ['openai'],
      spend_limit: { amount: '25', cycle: 'monthly' },
      request_limit: { count: 1000, cycle: 'daily' },
      rate_limit: { rpm: 60, burst: 10 },
    });
    const key = (created as unknown as { key: string }).key;
    expect(key).toMatch(/^spk_live_/);
    expect(created).toMatchObject({
      name: 'IDE assistant',
      status: 'active',
      request_shape: 'openai',
      wallet_id: m.walletId,
      allowed_models: ['gpt-4o'],
      allowed_providers: ['openai'],
      spend_limit: { amount: '25.0000000000', cycle: 'monthly' },
      request_limit: { count: 1000, cycle: 'daily' },
      rate_limit: { rpm: 60, burst: 10 },
      current_spend: '0.0000000000',
      total_spend: '0.0000000000',
      current_requests: 0,
      total_requests: 0,
      expires_at: null,
      last_used_at: null,
    });
    expect(created.spend_key_id).toMatch(/^spk_/);
    expect(created.key_preview).toMatch(/^spk_live_.{4}\*+$/);
    expect(key.startsWith(created.key_preview.replace(/\*+$/, ''))).toBe(true);

    const list = await lava.spendKeys.list({ limit: 10 });
    expect(list.data.map((k) => k.spend_key_id)).toEqual([created.spend_key_id]);
    expect(JSON.stringify(list)).not.toContain(key);
    expect(list.data[0]).not.toHaveProperty('key');

    const retrieved = await lava.spendKeys.retrieve(created.spend_key_id);
    expect(retrieved).not.toHaveProperty('key');
    expect(retrieved.name).toBe('IDE assistant');

    const updated = await lava.spendKeys.update(created.spend_key_id, { status: 'paused', allowed_models: null, rate_limit: null });
    expect(updated).toMatchObject({ status: 'paused', allowed_models: null, rate_limit: null, allowed_providers: ['openai'] });

    const rotated = (await lava.spendKeys.rotate(created.spend_key_id)) as unknown as { key: string; spend_key_id: string; status: string };
    expect(rotated.spend_key_id).toBe(created.spend_key_id);
    expect(rotated.key).toMatch(/^spk_live_/);
    expect(rotated.key).not.toBe(key);
    expect(rotated.status).toBe('paused');

    expect(await lava.spendKeys.revoke(created.spend_key_id)).toEqual({ success: true });
    await expect(lava.spendKeys.retrieve(created.spend_key_id)).rejects.toThrow(/404/);
    expect((await lava.spendKeys.list()).data).toEqual([]);
  });

  it('serves the same handlers under /manage/spend_keys, updates by PATCH and pages with a cursor', async () => {
    const m = await t.newMerchant();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const res = await call('POST', '/manage/spend_keys', { name: `k${i}` }, m.secretKey);
      expect(res.status).toBe(201);
      ids.push(res.body.spend_key_id as string);
    }
    const page1 = await call('GET', '/spend_keys?limit=2', undefined, m.secretKey);
    expect((page1.body.data as Json[]).map((k) => k.spend_key_id)).toEqual([ids[2], ids[1]]);
    expect(page1.body).toMatchObject({ has_more: true, next_cursor: ids[1] });
    const page2 = await call('GET', `/manage/spend_keys?limit=2&cursor=${ids[1]}`, undefined, m.secretKey);
    expect(page2.body).toMatchObject({ has_more: false, next_cursor: null });
    expect((page2.body.data as Json[]).map((k) => k.spend_key_id)).toEqual([ids[0]]);
    expect((await call('GET', '/spend_keys?limit=101', undefined, m.secretKey)).status).toBe(400);

    const patched = await call('PATCH', `/manage/spend_keys/${ids[0]}`, { name: 'renamed', spend_limit: { amount: '1.5', cycle: 'weekly' } }, m.secretKey);
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ name: 'renamed', spend_limit: { amount: '1.5000000000', cycle: 'weekly' } });
    // Another merchant sees nothing of these keys.
    expect((await call('GET', `/spend_keys/${ids[0]}`)).status).toBe(404);
    expect((await call('DELETE', `/spend_keys/${ids[0]}`)).status).toBe(404);
  });

  it('creates a key on a customer wallet, and refuses an unknown wallet with 400', async () => {
    const m = await t.newMerchant();
    const customer = await call('POST', '/customers', { name: 'Ada Lovelace' }, m.secretKey);
    const customerId = customer.body.customer_id as string;
    const res = await call('POST', '/spend_keys', { name: 'c', customer_id: customerId }, m.secretKey);
    expect(res.status).toBe(201);
    expect(res.body.wallet_id).not.toBe(m.walletId);
    expect(res.body.customer_id).toBe(customerId);
    for (const body of [{ customer_id: 'con_nope' }, { connection_id: 'con_nope' }, { wallet_id: 'wal_nope' }]) {
      const bad = await call('POST', '/spend_keys', { name: 'x', ...body }, m.secretKey);
      expect(bad.status).toBe(400);
      expect((bad.body.error as Json).issues).toEqual([expect.objectContaining({ path: [Object.keys(body)[0]] })]);
    }
    // Another merchant's customer is unknown too.
    expect((await call('POST', '/spend_keys', { name: 'x', customer_id: customerId })).status).toBe(400);
  });

  it.each([
    ['unknown cycle', { spend_limit: { amount: '1', cycle: 'hourly' } }, ['spend_limit', 'cycle']],
    ['negative spend amount', { spend_limit: { amount: '-1', cycle: 'daily' } }, ['spend_limit', 'amount']],
    ['zero spend amount', { spend_limit: { amount: '0', cycle: 'daily' } }, ['spend_limit', 'amount']],
    ['negative request count', { request_limit: { count: -3, cycle: 'daily' } }, ['request_limit', 'count']],
    ['fractional request count', { request_limit: { count: 1.5, cycle: 'daily' } }, ['request_limit', 'count']],
    ['empty model allow-list', { allowed_models: [] }, ['allowed_models']],
    ['empty provider allow-list', { allowed_providers: [] }, ['allowed_providers']],
    ['rpm 0', { rate_limit: { rpm: 0 } }, ['rate_limit', 'rpm']],
    ['burst 0', { rate_limit: { rpm: 5, burst: 0 } }, ['rate_limit', 'burst']],
    ['expires_at in the past', { expires_at: '2020-01-01T00:00:00Z' }, ['expires_at']],
    ['expires_at not a date', { expires_at: 'tomorrow' }, ['expires_at']],
    ['unknown status', { status: 'frozen' }, ['status']],
    ['unknown request shape', { request_shape: 'gemini' }, ['request_shape']],
  ])('refuses %s with 400 and issues, on create and on update', async (_label, body, path) => {
    const create = await call('POST', '/spend_keys', { name: 'bad', ...body });
    expect(create.status).toBe(400);
    expect((create.body.error as Json).code).toBe('validation_error');
    expect((create.body.error as { issues: { path: string[] }[] }).issues.map((i) => i.path)).toContainEqual(path);
    const ok = await call('POST', '/spend_keys', { name: 'ok', spend_limit: { amount: '3', cycle: 'daily' } });
    for (const method of ['PUT', 'PATCH']) {
      const update = await call(method, `/spend_keys/${ok.body.spend_key_id as string}`, body);
      expect(update.status).toBe(400);
      expect((update.body.error as { issues: { path: string[] }[] }).issues.map((i) => i.path)).toContainEqual(path);
    }
    // A refused update changes nothing.
    expect((await call('GET', `/spend_keys/${ok.body.spend_key_id as string}`)).body).toMatchObject({
      name: 'ok',
      status: 'active',
      spend_limit: { amount: '3.0000000000', cycle: 'daily' },
    });
  });

  it.each([
    ['a misspelt limit', { spend_limits: { amount: '1', cycle: 'daily' } }, ['spend_limits']],
    ['an unknown setting', { colour: 'blue' }, ['colour']],
    ['a misspelt nested field', { rate_limit: { rpm: 5, brust: 2 } }, ['rate_limit', 'brust']],
  ])('refuses %s on spend-key create, PUT and PATCH with 400 at the field', async (_label, body, path) => {
    const pathsOf = (error: unknown) => (error as { issues: { path: string[] }[] }).issues.map((i) => i.path);
    const before = (await call('GET', '/spend_keys?limit=100')).body.data as Json[];
    const create = await call('POST', '/spend_keys', { name: 'typo', ...body });
    expect(create.status).toBe(400);
    expect((create.body.error as Json).code).toBe('validation_error');
    expect(pathsOf(create.body.error)).toEqual([path]);
    expect((await call('GET', '/spend_keys?limit=100')).body.data).toHaveLength(before.length);
    const ok = await call('POST', '/spend_keys', { name: 'ok' });
    for (const method of ['PUT', 'PATCH']) {
      const update = await call(method, `/spend_keys/${ok.body.spend_key_id as string}`, body);
      expect(update.status).toBe(400);
      expect(pathsOf(update.body.error)).toEqual([path]);
    }
  });

  it("stamps keys and reads their daily windows on the app's clock, not the wall clock", async () => {
    const m = await t.newMerchant();
    t.clock.advance(10 * DAY_MS);
    const created = await call('POST', '/spend_keys', { name: 'clocked', request_limit: { count: 100, cycle: 'daily' } }, m.secretKey);
    expect(created.status).toBe(201);
    const id = created.body.spend_key_id as string;
    expect(Math.abs(Date.parse(created.body.created_at as string) - t.clock.now())).toBeLessThan(60_000);
    const start = (await t.storage.db.selectFrom('spend_keys').select('request_cycle_start').where('id', '=', id).executeTakeFirstOrThrow()).request_cycle_start;
    await t.storage.db.updateTable('spend_keys').set({ current_requests: 5n, last_used_at: start }).where('id', '=', id).execute();
    expect((await call('GET', `/spend_keys/${id}`, undefined, m.secretKey)).body.current_requests).toBe(5);
    t.clock.advance(DAY_MS);
    expect((await call('GET', `/spend_keys/${id}`, undefined, m.secretKey)).body.current_requests).toBe(0);
    expect((await call('DELETE', `/spend_keys/${id}`, undefined, m.secretKey)).status).toBe(200);
    const revoked = await t.storage.db.selectFrom('spend_keys').select('revoked_at').where('id', '=', id).executeTakeFirstOrThrow();
    expect(Math.abs(Date.parse(revoked.revoked_at!) - t.clock.now())).toBeLessThan(60_000);
  });

  it('refuses an unknown field on wallet-key create with 400', async () => {
    const res = await call('POST', '/wallet_keys', { name: 'w', customer: 'con_x' });
    expect(res.status).toBe(400);
    expect((res.body.error as Json).issues).toEqual([{ path: ['customer'], message: 'is not a known field' }]);
  });

  it('creates a key on a customer wallet named by connection_id', async () => {
    const m = await t.newMerchant();
    const customer = await call('POST', '/customers', { name: 'Edsger' }, m.secretKey);
    const customerId = customer.body.customer_id as string;
    const wallet = await t.storage.db.selectFrom('connections').select('wallet_id').where('id', '=', customerId).executeTakeFirstOrThrow();
    const res = await call('POST', '/spend_keys', { name: 'c', connection_id: customerId }, m.secretKey);
    expect(res.status).toBe(201);
    expect(res.body).toMatchObject({ customer_id: customerId, wallet_id: wallet.wallet_id });
    const both = await call('POST', '/spend_keys', { name: 'c', connection_id: customerId, customer_id: customerId }, m.secretKey);
    expect(both.status).toBe(201);
    expect(both.body.wallet_id).toBe(wallet.wallet_id);
  });

  it('pages wallet keys with a cursor, newest first', async () => {
    const m = await t.newMerchant();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await call('POST', '/wallet_keys', { name: `w${i}` }, m.secretKey)).body.wallet_key_id as string);
    const page1 = await call('GET', '/wallet_keys?limit=2', undefined, m.secretKey);
    expect((page1.body.data as Json[]).map((k) => k.wallet_key_id)).toEqual([ids[2], ids[1]]);
    expect(page1.body).toMatchObject({ has_more: true, next_cursor: ids[1] });
    const page2 = await call('GET', `/wallet_keys?limit=2&cursor=${ids[1]}`, undefined, m.secretKey);
    expect((page2.body.data as Json[]).map((k) => k.wallet_key_id)).toEqual([ids[0]]);
    expect(page2.body).toMatchObject({ has_more: false, next_cursor: null });
    expect((await call('GET', '/wallet_keys?cursor=wk_unknown', undefined, m.secretKey)).status).toBe(400);
    // Another merchant's cursor is no cursor here.
    expect((await call('GET', `/wallet_keys?cursor=${ids[1]}`)).status).toBe(400);
  });

  it('refuses a wallet key on /v1/meters with 403 and leaves its last_used_at alone; an allowed call stamps it', async () => {
    const m = await t.newMerchant();
    const wk = await call('POST', '/wallet_keys', { name: 'w' }, m.secretKey);
    const walletKey = wk.body.key as string;
    const lastUsed = async () =>
      (await t.storage.db.selectFrom('wallet_keys').select('last_used_at').where('id', '=', wk.body.wallet_key_id as string).executeTakeFirstOrThrow())
        .last_used_at;
    for (const path of ['/meters', '/meters?limit=1']) {
      const refused = await call('GET', path, undefined, walletKey);
      expect(refused.status).toBe(403);
      expect((refused.body.error as Json).code).toBe('forbidden');
    }
    expect((await call('POST', '/meters', { name: 'm', rate_type: 'fixed', tier_type: 'tokens_1m', tiers: [] }, walletKey)).status).toBe(403);
    expect(await lastUsed()).toBeNull();
    expect((await call('GET', '/spend_keys', undefined, walletKey)).status).toBe(200);
    expect(await lastUsed()).not.toBeNull();
  });

  it('manages wallet keys; a wallet key manages only its own wallet\'s spend keys', async () => {
    const m = await t.newMerchant();
    const customer = await call('POST', '/customers', { name: 'Grace Hopper' }, m.secretKey);
    const customerId = customer.body.customer_id as string;
    const wk = await call('POST', '/wallet_keys', { name: 'team wallet', customer_id: customerId }, m.secretKey);
    expect(wk.status).toBe(201);
    const walletKey = wk.body.key as string;
    expect(walletKey).toMatch(/^wk_live_/);
    expect(wk.body.wallet_key_id).toMatch(/^wk_/);
    const walletId = wk.body.wallet_id as string;

    const merchantKey = await call('POST', '/spend_keys', { name: 'merchant-wallet key' }, m.secretKey);
    const own = await call('POST', '/spend_keys', { name: 'from wallet key' }, walletKey);
    expect(own.status).toBe(201);
    expect(own.body.wallet_id).toBe(walletId);
    const listed = await call('GET', '/spend_keys', undefined, walletKey);
    expect((listed.body.data as Json[]).map((k) => k.spend_key_id)).toEqual([own.body.spend_key_id]);
    expect((await call('GET', `/spend_keys/${merchantKey.body.spend_key_id as string}`, undefined, walletKey)).status).toBe(404);
    expect((await call('PATCH', `/manage/spend_keys/${own.body.spend_key_id as string}`, { status: 'paused' }, walletKey)).status).toBe(200);
    // Another wallet, and every other endpoint, are refused.
    expect((await call('POST', '/spend_keys', { name: 'x', wallet_id: m.walletId }, walletKey)).status).toBe(403);
    expect((await call('GET', '/customers', undefined, walletKey)).status).toBe(403);
    expect((await call('GET', '/wallet_keys', undefined, walletKey)).status).toBe(403);

    const page = (await call('GET', '/wallet_keys', undefined, m.secretKey)).body;
    expect((page.data as Json[])[0]).toMatchObject({ wallet_key_id: wk.body.wallet_key_id, name: 'team wallet', wallet_id: walletId });
    expect(JSON.stringify(page)).not.toContain(walletKey);
    expect((page.data as Json[])[0]!.last_used_at).not.toBeNull();

    const rotated = await call('POST', `/wallet_keys/${wk.body.wallet_key_id as string}/rotate`, undefined, m.secretKey);
    expect(rotated.status).toBe(200);
    expect(rotated.body.key).not.toBe(walletKey);
    expect((await call('GET', '/spend_keys', undefined, walletKey)).status).toBe(401);
    expect((await call('GET', '/spend_keys', undefined, rotated.body.key as string)).status).toBe(200);
    expect((await call('DELETE', `/wallet_keys/${wk.body.wallet_key_id as string}`, undefined, m.secretKey)).body).toEqual({ success: true });
    expect((await call('GET', '/spend_keys', undefined, rotated.body.key as string)).status).toBe(401);
  });
});
