import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type SecretKey = { secret_key_id: string; name: string; secret_key_hint: string; created_at: string };
type CreatedSecretKey = SecretKey & { secret_key: string };
type Page = { data: SecretKey[]; has_more: boolean; next_cursor: string | null };
type ErrorBody = {
  error: { message: string; code: string; status: number; issues?: { path: string[]; message: string }[] };
};

describe.each(databasesUnderTest())('secret keys on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const createKey = async (key: string, body: unknown = { name: 'CI key' }) => {
    return t.app.inject({ method: 'POST', url: '/v1/secret_keys', headers: t.auth(key), payload: body as object });
  };
  const list = (key: string, qs = '') => t.app.inject({ method: 'GET', url: `/v1/secret_keys${qs}`, headers: t.auth(key) });
  const remove = (key: string, id: string) =>
    t.app.inject({ method: 'DELETE', url: `/v1/secret_keys/${id}`, headers: t.auth(key) });

  it('returns the secret once on create; the list shows only id, name, hint and date', async () => {
    const m = await t.newMerchant();
    const res = await createKey(m.secretKey, { name: 'Deploy key' });
    expect(res.statusCode).toBe(201);
    const created = res.json<CreatedSecretKey>();
    expect(created.secret_key).toMatch(/^sk_live_[A-Za-z0-9_-]{20,}$/);
    expect(created.secret_key_id).toMatch(/^sk_[0-9A-Z]{26}$/);
    expect(created.name).toBe('Deploy key');
    expect(created.secret_key_hint.length).toBeGreaterThan(0);
    expect(created.secret_key_hint.length).toBeLessThan(created.secret_key.length);
    expect(Object.keys(created).sort()).toEqual(['created_at', 'name', 'secret_key', 'secret_key_hint', 'secret_key_id']);

    const listed = await list(m.secretKey);
    expect(listed.statusCode).toBe(200);
    const page = listed.json<Page>();
    expect(page.has_more).toBe(false);
    expect(page.data).toHaveLength(2);
    expect(page.data[0]).toEqual({
      secret_key_id: created.secret_key_id,
      name: 'Deploy key',
      secret_key_hint: created.secret_key_hint,
      created_at: created.created_at,
    });
    for (const item of page.data) expect(Object.keys(item)).not.toContain('secret_key');
    expect(listed.body).not.toContain(created.secret_key);
    expect(listed.body).not.toContain(m.secretKey);
  });

  it('hints reveal only the prefix and 4 characters, even when the random part contains "_"', async () => {
    const m = await t.newMerchant();
    // About 40% of base64url secrets of this length contain "_"; 12 keys make a miss vanishingly rare.
    const created: CreatedSecretKey[] = [];
    for (let i = 0; i < 12; i++) created.push((await createKey(m.secretKey, { name: `hint ${i}` })).json<CreatedSecretKey>());
    for (const k of created) {
      expect(k.secret_key_hint).toBe(`${k.secret_key.slice(0, 'sk_live_'.length + 4)}********`);
    }
    const listed = (await list(m.secretKey, '?limit=100')).json<Page>();
    for (const item of listed.data) expect(item.secret_key_hint).toMatch(/^sk_live_[A-Za-z0-9_-]{4}\*{8}$/);
  });

  it('authenticates with the new key, for the same merchant', async () => {
    const m = await t.newMerchant();
    const created = (await createKey(m.secretKey)).json<CreatedSecretKey>();
    const viaNew = await list(created.secret_key);
    expect(viaNew.statusCode).toBe(200);
    expect(viaNew.json<Page>()).toEqual((await list(m.secretKey)).json<Page>());
  });

  it('rejects a deleted key with 401 on the very next request, while the other key keeps working', async () => {
    const m = await t.newMerchant();
    const created = (await createKey(m.secretKey)).json<CreatedSecretKey>();
    expect((await list(created.secret_key)).statusCode).toBe(200);

    const res = await remove(m.secretKey, created.secret_key_id);
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^application\/json/);
    expect(res.json()).toEqual({ id: created.secret_key_id, deleted: true });

    const after = await list(created.secret_key);
    expect(after.statusCode).toBe(401);
    expect(after.json<ErrorBody>().error.code).toBe('unauthorized');
    const remaining = await list(m.secretKey);
    expect(remaining.statusCode).toBe(200);
    expect(remaining.json<Page>().data.map((k) => k.secret_key_id)).not.toContain(created.secret_key_id);
    // A revoked key is gone: deleting it again is a 404.
    expect((await remove(m.secretKey, created.secret_key_id)).statusCode).toBe(404);
  });

  it('lets a key delete itself when another remains', async () => {
    const m = await t.newMerchant();
    const created = (await createKey(m.secretKey)).json<CreatedSecretKey>();
    const res = await remove(created.secret_key, created.secret_key_id);
    expect(res.json()).toEqual({ id: created.secret_key_id, deleted: true });
    expect((await list(created.secret_key)).statusCode).toBe(401);
    expect((await list(m.secretKey)).statusCode).toBe(200);
  });

  it('refuses to delete the last active key with 409 last_secret_key, and the key still works', async () => {
    const m = await t.newMerchant();
    const [only] = (await list(m.secretKey)).json<Page>().data;
    expect(only).toBeDefined();
    const res = await remove(m.secretKey, only!.secret_key_id);
    expect(res.statusCode).toBe(409);
    expect(res.json<ErrorBody>().error).toMatchObject({ code: 'last_secret_key', status: 409 });
    expect((await list(m.secretKey)).statusCode).toBe(200);
  });

  it('keeps at least one key when two deletes race', async () => {
    const m = await t.newMerchant();
    const second = (await createKey(m.secretKey)).json<CreatedSecretKey>();
    const ids = (await list(m.secretKey)).json<Page>().data.map((k) => k.secret_key_id);
    expect(ids).toHaveLength(2);
    const results = await Promise.all(ids.map((id) => remove(m.secretKey, id)));
    const statuses = results.map((r) => r.statusCode).sort();
    // Exactly one delete wins; the other sees the last remaining key (409), so one key always survives.
    expect(statuses).toEqual([200, 409]);
    const survivors = [m.secretKey, second.secret_key];
    const working = await Promise.all(survivors.map(async (k) => (await list(k)).statusCode));
    expect(working.filter((s) => s === 200)).toHaveLength(1);
  });

  it("answers 404 for another merchant's key id and leaves that key working", async () => {
    const owner = await t.newMerchant();
    const created = (await createKey(owner.secretKey)).json<CreatedSecretKey>();
    const res = await remove(t.merchant.secretKey, created.secret_key_id);
    expect(res.statusCode).toBe(404);
    expect(res.json<ErrorBody>().error).toMatchObject({ code: 'not_found', status: 404 });
    expect((await list(created.secret_key)).statusCode).toBe(200);
    expect((await list(t.merchant.secretKey)).json<Page>().data.map((k) => k.secret_key_id)).not.toContain(
      created.secret_key_id,
    );
  });

  it('refuses malformed JSON on create with invalid_json, creating no key', async () => {
    const m = await t.newMerchant();
    const res = await t.app.inject({
      method: 'POST',
      url: '/v1/secret_keys',
      headers: { ...t.auth(m.secretKey), 'content-type': 'application/json' },
      payload: '{"name": "Half',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toEqual({ error: { message: expect.any(String), code: 'invalid_json', status: 400 } });
    expect((await list(m.secretKey)).json().data).toHaveLength(1);
  });

  it('answers 404 for an unknown key id', async () => {
    const res = await remove(t.merchant.secretKey, 'sk_01ARZ3NDEKTSV4RRFFQ69G5FAV');
    expect(res.statusCode).toBe(404);
    expect(res.json<ErrorBody>().error.code).toBe('not_found');
  });

  describe('authentication failures', () => {
    const unauthorized = { error: { message: expect.any(String), code: 'unauthorized', status: 401 } };

    it.each([
      ['missing', {}],
      ['Basic instead of Bearer', { authorization: 'Basic x' }],
      ['an empty Bearer', { authorization: 'Bearer ' }],
      ['a wrong key', { authorization: 'Bearer sk_live_definitelyNotARealKeyAtAll000000' }],
      ['a key id used as the key', { authorization: 'Bearer sk_01ARZ3NDEKTSV4RRFFQ69G5FAV' }],
    ])('answers 401 with the unauthorized envelope for a %s credential', async (_label, headers) => {
      for (const [method, url] of [
        ['GET', '/v1/secret_keys'],
        ['POST', '/v1/secret_keys'],
        ['DELETE', '/v1/secret_keys/sk_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ] as const) {
        const res = await t.app.inject({ method, url, headers: headers as Record<string, string> });
        expect(res.statusCode).toBe(401);
        expect(res.headers['content-type']).toMatch(/^application\/json/);
        expect(res.json()).toEqual(unauthorized);
      }
    });

    it('does not create a key when the credential is wrong', async () => {
      const m = await t.newMerchant();
      const before = (await list(m.secretKey)).json<Page>().data.length;
      const res = await createKey('sk_live_wrong');
      expect(res.statusCode).toBe(401);
      expect((await list(m.secretKey)).json<Page>().data.length).toBe(before);
    });
  });

  describe('as the published client sends requests', () => {
    it('accepts POST with Content-Type: application/json and an empty body (201, default name)', async () => {
      const m = await t.newMerchant();
      const res = await t.app.inject({
        method: 'POST',
        url: '/v1/secret_keys',
        headers: { ...t.auth(m.secretKey), 'content-type': 'application/json' },
        payload: '',
      });
      expect(res.statusCode).toBe(201);
      const created = res.json<CreatedSecretKey>();
      expect(created.secret_key).toMatch(/^sk_live_/);
      expect(created.name).toBe('Secret key');
    });

    it('accepts the same over real HTTP, and DELETE with a JSON content type and no body returns JSON', async () => {
      const m = await t.newMerchant();
      const base = await t.listen();
      const headers = { ...t.auth(m.secretKey), 'content-type': 'application/json' };
      const created = await fetch(`${base}/v1/secret_keys`, { method: 'POST', headers });
      expect(created.status).toBe(201);
      const key = (await created.json()) as CreatedSecretKey;

      const deleted = await fetch(`${base}/v1/secret_keys/${key.secret_key_id}`, { method: 'DELETE', headers });
      expect(deleted.status).toBe(200);
      expect(deleted.headers.get('content-type')).toMatch(/^application\/json/);
      expect(await deleted.json()).toEqual({ id: key.secret_key_id, deleted: true });

      const last = await fetch(`${base}/v1/secret_keys/${(await list(m.secretKey)).json<Page>().data[0]!.secret_key_id}`, {
        method: 'DELETE',
        headers,
      });
      expect(last.status).toBe(409);
      expect(last.headers.get('content-type')).toMatch(/^application\/json/);
      expect(((await last.json()) as ErrorBody).error.code).toBe('last_secret_key');
    });

    it('rejects a blank name with a validation error on ["name"]', async () => {
      const res = await createKey(t.merchant.secretKey, { name: '   ' });
      expect(res.statusCode).toBe(400);
      const body = res.json<ErrorBody>();
      expect(body.error.code).toBe('validation_error');
      expect((body.error.issues ?? []).map((i) => i.path)).toContainEqual(['name']);
    });
  });

  describe('pagination', () => {
    it('pages keys newest first and rejects bad limits and unknown cursors', async () => {
      const m = await t.newMerchant();
      const created: string[] = [];
      for (let i = 0; i < 3; i++) created.push((await createKey(m.secretKey, { name: `k${i}` })).json<CreatedSecretKey>().secret_key_id);
      const first = (await list(m.secretKey, '?limit=2')).json<Page>();
      expect(first.data.map((k) => k.secret_key_id)).toEqual([created[2], created[1]]);
      expect(first.has_more).toBe(true);
      const second = (await list(m.secretKey, `?limit=2&cursor=${first.next_cursor}`)).json<Page>();
      expect(second.data.map((k) => k.secret_key_id)[0]).toBe(created[0]);
      expect(second.data).toHaveLength(2); // created[0] and the merchant's original key
      expect(second).toMatchObject({ has_more: false, next_cursor: null });

      for (const limit of ['0', '101']) {
        const bad = await list(m.secretKey, `?limit=${limit}`);
        expect(bad.statusCode).toBe(400);
        expect((bad.json<ErrorBody>().error.issues ?? []).map((i) => i.path)).toContainEqual(['limit']);
      }
      const cursor = await list(m.secretKey, '?cursor=sk_01ARZ3NDEKTSV4RRFFQ69G5FAV');
      expect(cursor.statusCode).toBe(400);
      expect(cursor.json<ErrorBody>().error.code).toBe('invalid_cursor');
    });
  });
});
