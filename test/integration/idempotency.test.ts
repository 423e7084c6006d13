import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hashSecret } from '../../src/domain/secrets.ts';
import { claimIdempotencyKey, findIdempotencyKey, releaseIdempotencyKey } from '../../src/storage/idempotency.ts';
import { startTestApp, type Merchant, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

type Resource = { url: string; body: Record<string, unknown>; idOf: (item: Record<string, unknown>) => unknown };

const resources: [string, Resource][] = [
  [
    'POST /v1/meters',
    {
      url: '/v1/meters',
      body: { name: 'Chat tokens', rate_type: 'fixed', tiers: [{ start: 0, rate: '2.5' }] },
      idOf: (m) => m.meter_id,
    },
  ],
  [
    'POST /v1/customers',
    {
      url: '/v1/customers',
      // No reference_id: a second creation must not fail for a reason other than idempotency.
      body: { name: 'Ada Lovelace', email: 'ada@example.com', metadata: { plan: 'pro' } },
      idOf: (c) => c.customer_id,
    },
  ],
];

let keyCounter = 0;
/** A fresh Idempotency-Key per use, so tests never see each other's claims. */
const freshKey = () => `idem-${process.pid}-${Date.now()}-${++keyCounter}`;

describe.each(databasesUnderTest())('Idempotency-Key on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  function post(
    app: TestApp,
    url: string,
    opts: { secret: string; key?: string; body?: unknown; raw?: string },
  ) {
    return app.app.inject({
      method: 'POST',
      url,
      headers: {
        ...app.auth(opts.secret),
        'content-type': 'application/json',
        ...(opts.key === undefined ? {} : { 'idempotency-key': opts.key }),
      },
      payload: opts.raw ?? JSON.stringify(opts.body),
    });
  }

  async function listIds(app: TestApp, r: Resource, secret: string): Promise<unknown[]> {
    const res = await app.app.inject({ method: 'GET', url: `${r.url}?limit=100`, headers: app.auth(secret) });
    expect(res.statusCode).toBe(200);
    return (res.json() as { data: Record<string, unknown>[] }).data.map(r.idOf);
  }

  async function keyIdOf(secret: string): Promise<string> {
    const row = await t.storage.db
      .selectFrom('secret_keys')
      .select('id')
      .where('key_hash', '=', hashSecret(secret))
      .executeTakeFirstOrThrow();
    return row.id;
  }

  describe.each(resources)('%s', (_label, r) => {
    let m: Merchant;
    beforeAll(async () => {
      m = await t.newMerchant();
    });

    it('replays the stored response for the same key and body, creating only one resource', async () => {
      const key = freshKey();
      const first = await post(t, r.url, { secret: m.secretKey, key, body: r.body });
      expect(first.statusCode).toBe(201);
      expect(first.headers['idempotent-replayed']).toBeUndefined();

      const again = await post(t, r.url, { secret: m.secretKey, key, body: r.body });
      expect(again.statusCode).toBe(first.statusCode);
      expect(again.body).toBe(first.body);
      expect(again.headers['idempotent-replayed']).toBe('true');
      expect(String(again.headers['content-type'])).toMatch(/^application\/json/);

      const ids = await listIds(t, r, m.secretKey);
      expect(ids.filter((id) => id === r.idOf(first.json()))).toHaveLength(1);
      expect(ids).toHaveLength(1);
    });

    it('refuses the same key with a different body: 422 idempotency_key_reused, nothing created', async () => {
      const mm = await t.newMerchant();
      const key = freshKey();
      expect((await post(t, r.url, { secret: mm.secretKey, key, body: r.body })).statusCode).toBe(201);
      const other = await post(t, r.url, { secret: mm.secretKey, key, body: { ...r.body, name: 'Someone else' } });
      expect(other.statusCode).toBe(422);
      expect(other.json()).toEqual({
        error: { message: expect.any(String), code: 'idempotency_key_reused', status: 422 },
      });
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(1);
    });

    it('treats whitespace-different but equal JSON as the same body', async () => {
      const mm = await t.newMerchant();
      const key = freshKey();
      const compact = await post(t, r.url, { secret: mm.secretKey, key, raw: JSON.stringify(r.body) });
      expect(compact.statusCode).toBe(201);
      const pretty = await post(t, r.url, { secret: mm.secretKey, key, raw: `\n  ${JSON.stringify(r.body, null, 4)}\n\n` });
      expect(pretty.statusCode).toBe(201);
      expect(pretty.headers['idempotent-replayed']).toBe('true');
      expect(pretty.body).toBe(compact.body);
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(1);
    });

    it('scopes keys per API key: another secret key of the same merchant creates a new resource', async () => {
      const mm = await t.newMerchant();
      const created = await t.app.inject({
        method: 'POST',
        url: '/v1/secret_keys',
        headers: t.auth(mm.secretKey),
        payload: { name: 'Second' },
      });
      expect(created.statusCode).toBe(201);
      const secondKey = created.json().secret_key as string;

      const key = freshKey();
      const a = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      const b = await post(t, r.url, { secret: secondKey, key, body: r.body });
      expect(a.statusCode).toBe(201);
      expect(b.statusCode).toBe(201);
      expect(b.headers['idempotent-replayed']).toBeUndefined();
      expect(r.idOf(b.json())).not.toBe(r.idOf(a.json()));
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(2);

      // Each key still replays its own response.
      const replayB = await post(t, r.url, { secret: secondKey, key, body: r.body });
      expect(replayB.headers['idempotent-replayed']).toBe('true');
      expect(replayB.body).toBe(b.body);
    });

    it('answers 409 idempotency_key_in_use while the same request is still in flight, and proceeds once released', async () => {
      const mm = await t.newMerchant();
      const scope = await keyIdOf(mm.secretKey);
      // Learn the fingerprint of this body from a finished request, then claim a second key with it
      // as a still-running request on another instance would.
      const probeKey = freshKey();
      expect((await post(t, r.url, { secret: mm.secretKey, key: probeKey, body: r.body })).statusCode).toBe(201);
      const probe = await findIdempotencyKey(t.storage.db, scope, probeKey);
      expect(probe?.state).toBe('done');

      const key = freshKey();
      const now = new Date();
      const claimed = await claimIdempotencyKey(t.storage.db, {
        scope,
        key,
        request_hash: probe!.request_hash,
        created_at: now.toISOString(),
        expires_at: new Date(now.getTime() + 60_000).toISOString(),
      });
      expect(claimed).toBe(true);

      const busy = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(busy.statusCode).toBe(409);
      expect(busy.json()).toEqual({
        error: { message: expect.any(String), code: 'idempotency_key_in_use', status: 409 },
      });
      // A different body under a running key is still a reuse, not a wait.
      const reused = await post(t, r.url, { secret: mm.secretKey, key, body: { ...r.body, name: 'Other' } });
      expect(reused.statusCode).toBe(422);
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(1);

      await releaseIdempotencyKey(t.storage.db, scope, key);
      const retried = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(retried.statusCode).toBe(201);
      expect(retried.headers['idempotent-replayed']).toBeUndefined();
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(2);
    });

    it('lets concurrent requests with one key create exactly one resource', async () => {
      const mm = await t.newMerchant();
      const key = freshKey();
      const results = await Promise.all(
        Array.from({ length: 8 }, () => post(t, r.url, { secret: mm.secretKey, key, body: r.body })),
      );
      const originals = results.filter((x) => x.statusCode === 201 && x.headers['idempotent-replayed'] === undefined);
      expect(originals).toHaveLength(1);
      for (const x of results) {
        if (x.statusCode === 201) expect(x.body).toBe(originals[0]!.body);
        else {
          expect(x.statusCode).toBe(409);
          expect(x.json().error.code).toBe('idempotency_key_in_use');
        }
      }
      expect(await listIds(t, r, mm.secretKey)).toEqual([r.idOf(originals[0]!.json())]);
    });

    it('lets an expired key be used again as a new request', async () => {
      const mm = await t.newMerchant();
      const key = freshKey();
      const dayMs = 24 * 60 * 60 * 1000;
      await t.storage.db
        .insertInto('idempotency_keys')
        .values({
          scope: await keyIdOf(mm.secretKey),
          key,
          request_hash: 'stale-hash-of-another-body',
          state: 'done',
          response_status: 201,
          response_body: '{"stale":true}',
          created_at: new Date(Date.now() - 2 * dayMs).toISOString(),
          expires_at: new Date(Date.now() - dayMs).toISOString(),
        })
        .execute();

      const res = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(res.statusCode).toBe(201);
      expect(res.headers['idempotent-replayed']).toBeUndefined();
      expect(res.json()).not.toHaveProperty('stale');
      expect(await listIds(t, r, mm.secretKey)).toEqual([r.idOf(res.json())]);

      const replay = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toBe(res.body);
    });
  });

  it('rejects an Idempotency-Key longer than 255 characters with 400, creating nothing', async () => {
    const mm = await t.newMerchant();
    const ok = await post(t, '/v1/customers', { secret: mm.secretKey, key: 'k'.repeat(255), body: {} });
    expect(ok.statusCode).toBe(201);

    const res = await post(t, '/v1/customers', { secret: mm.secretKey, key: 'k'.repeat(256), body: {} });
    expect(res.statusCode).toBe(400);
    const { error } = res.json();
    expect(error.code).toBe('validation_error');
    expect(error.issues).toEqual([{ path: ['headers', 'idempotency-key'], message: expect.any(String) }]);
    const list = await t.app.inject({ method: 'GET', url: '/v1/customers', headers: t.auth(mm.secretKey) });
    expect(list.json().data).toHaveLength(1);
  });

  it('keeps claims in the database: a second app instance on the same database replays the first one', async () => {
    const second = await startTestApp(dialect, { database: t.database });
    try {
      const mm = await t.newMerchant();
      const key = freshKey();
      const body = resources[0]![1].body;
      const first = await post(t, '/v1/meters', { secret: mm.secretKey, key, body });
      expect(first.statusCode).toBe(201);

      const replay = await post(second, '/v1/meters', { secret: mm.secretKey, key, body });
      expect(replay.statusCode).toBe(201);
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toBe(first.body);

      const reused = await post(second, '/v1/meters', { secret: mm.secretKey, key, body: { ...body, name: 'Else' } });
      expect(reused.statusCode).toBe(422);

      const list = await second.app.inject({ method: 'GET', url: '/v1/meters', headers: second.auth(mm.secretKey) });
      expect(list.json().data.map((x: { meter_id: string }) => x.meter_id)).toEqual([first.json().meter_id]);
    } finally {
      await second.close();
    }
  });
});
