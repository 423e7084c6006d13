import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { dateOf } from '../../src/domain/clock.ts';
import { hashSecret } from '../../src/domain/secrets.ts';
import { loadConfig } from '../../src/config.ts';
import { IDEMPOTENCY_LEASE_MS, IDEMPOTENCY_TTL_MS } from '../../src/http/idempotency.ts';
import { startServer } from '../../src/main.ts';
import {
  claimIdempotencyKey,
  completeIdempotencyKey,
  findIdempotencyKey,
  releaseIdempotencyKey,
} from '../../src/storage/idempotency.ts';
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

  /** The stored fingerprint of this resource's body, learnt from a finished request with a throw-away key. */
  async function fingerprintOf(secret: string, r: Resource): Promise<string> {
    const probeKey = freshKey();
    expect((await post(t, r.url, { secret, key: probeKey, body: r.body })).statusCode).toBe(201);
    const probe = await findIdempotencyKey(t.storage.db, await keyIdOf(secret), probeKey);
    await t.storage.db.deleteFrom('idempotency_keys').where('key', '=', probeKey).execute();
    return probe!.request_hash;
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
      const now = dateOf(t.clock);
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
      // Retry-After: the seconds left on the claim's lease.
      expect(Number(busy.headers['retry-after'])).toBeGreaterThanOrEqual(58);
      expect(Number(busy.headers['retry-after'])).toBeLessThanOrEqual(60);
      // A different body under a running key is still a reuse, not a wait.
      const reused = await post(t, r.url, { secret: mm.secretKey, key, body: { ...r.body, name: 'Other' } });
      expect(reused.statusCode).toBe(422);
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(1);

      await releaseIdempotencyKey(t.storage.db, { scope, key, created_at: now.toISOString() });
      const retried = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(retried.statusCode).toBe(201);
      expect(retried.headers['idempotent-replayed']).toBeUndefined();
      expect(await listIds(t, r, mm.secretKey)).toHaveLength(2);
    });

    it('lets a retry take over a claim whose lease ran out (a crashed request) and replays the retry from then on', async () => {
      const mm = await t.newMerchant();
      const scope = await keyIdOf(mm.secretKey);
      const hash = await fingerprintOf(mm.secretKey, r);
      const key = freshKey();
      const crashedAt = t.clock.now() - IDEMPOTENCY_LEASE_MS - 1_000;
      await t.storage.db
        .insertInto('idempotency_keys')
        .values({
          scope,
          key,
          request_hash: hash,
          state: 'in_flight',
          response_status: null,
          response_body: null,
          created_at: new Date(crashedAt).toISOString(),
          expires_at: new Date(crashedAt + IDEMPOTENCY_LEASE_MS).toISOString(),
        })
        .execute();

      const retried = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(retried.statusCode).toBe(201);
      expect(retried.headers['idempotent-replayed']).toBeUndefined();
      const replay = await post(t, r.url, { secret: mm.secretKey, key, body: r.body });
      expect(replay.headers['idempotent-replayed']).toBe('true');
      expect(replay.body).toBe(retried.body);
      // Replays last 24 h from the retry's claim, not the lease.
      const row = await findIdempotencyKey(t.storage.db, scope, key);
      expect(Date.parse(row!.expires_at) - Date.parse(row!.created_at)).toBe(IDEMPOTENCY_TTL_MS);
      // The probe that learnt the fingerprint, and the retry.
      expect(await listIds(t, r, mm.secretKey)).toEqual([r.idOf(retried.json()), expect.anything()]);
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
          // The running claim holds the key for its lease, not for the 24 h of replays.
          expect(Number(x.headers['retry-after'])).toBeGreaterThanOrEqual(1);
          expect(Number(x.headers['retry-after'])).toBeLessThanOrEqual(IDEMPOTENCY_LEASE_MS / 1000);
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
          created_at: new Date(t.clock.now() - 2 * dayMs).toISOString(),
          expires_at: new Date(t.clock.now() - dayMs).toISOString(),
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

  it('does not let a request whose claim was taken over store or free the new claim when it finishes late', async () => {
    const mm = await t.newMerchant();
    const scope = await keyIdOf(mm.secretKey);
    const body = resources[1]![1].body;
    const key = freshKey();
    const abandoned = { scope, key, created_at: new Date(t.clock.now() - IDEMPOTENCY_LEASE_MS - 1_000).toISOString() };
    expect(
      await claimIdempotencyKey(t.storage.db, {
        ...abandoned,
        request_hash: await fingerprintOf(mm.secretKey, resources[1]![1]),
        expires_at: new Date(Date.parse(abandoned.created_at) + IDEMPOTENCY_LEASE_MS).toISOString(),
      }),
    ).toBe(true);
    const retried = await post(t, '/v1/customers', { secret: mm.secretKey, key, body });
    expect(retried.statusCode).toBe(201);

    const late = { status: 201, body: '{"late":true}', expiresAt: new Date(t.clock.now() + IDEMPOTENCY_TTL_MS).toISOString() };
    expect(await completeIdempotencyKey(t.storage.db, abandoned, late)).toBe(false);
    await releaseIdempotencyKey(t.storage.db, abandoned);
    const replay = await post(t, '/v1/customers', { secret: mm.secretKey, key, body });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toBe(retried.body);
  });

  it.runIf(dialect === 'postgres')(
    'holds a running claim for its lease only: a retry after the lease takes over, and the late original stores nothing',
    async () => {
      const mm = await t.newMerchant();
      const key = freshKey();
      const body = resources[1]![1].body;
      // Customers cannot be written while this lock is held: the first request claims its key, then waits.
      const locker = new pg.Client({ connectionString: t.database.url });
      await locker.connect();
      await locker.query('begin');
      await locker.query('lock table connections in exclusive mode');
      let unlocked = false;
      const unlock = async () => {
        if (unlocked) return;
        unlocked = true;
        await locker.query('rollback');
        await locker.end();
      };
      try {
        const original = post(t, '/v1/customers', { secret: mm.secretKey, key, body });
        const scope = await keyIdOf(mm.secretKey);
        const claimOf = () => findIdempotencyKey(t.storage.db, scope, key);
        await expect.poll(async () => (await claimOf())?.state, { timeout: 5_000 }).toBe('in_flight');
        const originalClaim = (await claimOf())!.created_at;

        const busy = await post(t, '/v1/customers', { secret: mm.secretKey, key, body });
        expect(busy.statusCode).toBe(409);
        expect(Number(busy.headers['retry-after'])).toBeLessThanOrEqual(IDEMPOTENCY_LEASE_MS / 1000);

        // As if the original's process had hung past its lease: the retry takes the key over.
        t.clock.advance(IDEMPOTENCY_LEASE_MS + 1_000);
        const retry = post(t, '/v1/customers', { secret: mm.secretKey, key, body });
        await expect.poll(async () => (await claimOf())?.created_at, { timeout: 5_000 }).not.toBe(originalClaim);
        await unlock();
        const [first, second] = await Promise.all([original, retry]);
        expect(first.statusCode).toBe(201);
        expect(second.statusCode).toBe(201);
        expect(second.headers['idempotent-replayed']).toBeUndefined();

        const replay = await post(t, '/v1/customers', { secret: mm.secretKey, key, body });
        expect(replay.headers['idempotent-replayed']).toBe('true');
        expect(replay.body).toBe(second.body);
      } finally {
        await unlock();
      }
    },
  );

  it('is purged by the server\'s periodic sweep once past its 24 h or its lease, keeping live keys', async () => {
    const server = await startServer(loadConfig({ PORT: '0', LOG_LEVEL: 'silent', DATABASE_URL: t.database.url }), {
      sweepIntervalMs: 50,
    });
    try {
      const past = (ms: number) => new Date(Date.now() - ms).toISOString();
      const future = (ms: number) => new Date(Date.now() + ms).toISOString();
      const row = (key: string, state: 'in_flight' | 'done', createdAt: string, expiresAt: string) => ({
        scope: 'sweep-scope',
        key,
        request_hash: 'h',
        state,
        response_status: state === 'done' ? 201 : null,
        response_body: state === 'done' ? '{}' : null,
        created_at: createdAt,
        expires_at: expiresAt,
      });
      const day = IDEMPOTENCY_TTL_MS;
      await t.storage.db
        .insertInto('idempotency_keys')
        .values([
          row('old-response', 'done', past(2 * day), past(day)),
          row('abandoned-claim', 'in_flight', past(2 * IDEMPOTENCY_LEASE_MS), past(IDEMPOTENCY_LEASE_MS)),
          row('live-response', 'done', past(1_000), future(day)),
          row('running-claim', 'in_flight', past(1_000), future(IDEMPOTENCY_LEASE_MS)),
        ])
        .execute();
      const remaining = async () =>
        (await t.storage.db.selectFrom('idempotency_keys').select('key').where('scope', '=', 'sweep-scope').orderBy('key').execute()).map(
          (x) => x.key,
        );
      await expect.poll(remaining, { timeout: 5_000, interval: 50 }).toEqual(['live-response', 'running-claim']);
    } finally {
      await server.stop();
    }
  });

  it('covers POST /v1/requests: a replay is Idempotent-Replayed and charges once; another body under the key is 422', async () => {
    const mm = await t.newMerchant();
    const h = t.auth(mm.secretKey);
    const { customerId, meterSlug } = await t.customerWithMeter({ secretKey: mm.secretKey, credit: '1' });
    const body = { request_id: 'idem-req-1', customer_id: customerId, meter_slug: meterSlug };
    const key = freshKey();

    const first = await post(t, '/v1/requests', { secret: mm.secretKey, key, body });
    expect(first.statusCode).toBe(201);
    expect(first.headers['idempotent-replayed']).toBeUndefined();
    const again = await post(t, '/v1/requests', { secret: mm.secretKey, key, body });
    expect(again.statusCode).toBe(201);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.body).toBe(first.body);

    const other = await post(t, '/v1/requests', { secret: mm.secretKey, key, body: { ...body, request_id: 'idem-req-2' } });
    expect(other.statusCode).toBe(422);
    expect(other.json().error.code).toBe('idempotency_key_reused');

    // One charge of 0.25, and one recorded request.
    const after = await t.app.inject({ method: 'GET', url: `/v1/customers/${customerId}`, headers: h });
    expect(after.json().wallet.balance).toBe('0.7500000000');
    const list = await t.app.inject({ method: 'GET', url: '/v1/requests', headers: h });
    expect(list.json().data.map((r: { request_id: string }) => r.request_id)).toEqual(['idem-req-1']);
  });

  it('counts metadata sent in the query or the x-service-metadata header as part of the request: other metadata under the key is 422', async () => {
    const mm = await t.newMerchant();
    const h = t.auth(mm.secretKey);
    const { customerId, meterSlug } = await t.customerWithMeter({ secretKey: mm.secretKey, credit: '1' });
    const payload = JSON.stringify({ request_id: 'idem-meta-1', customer_id: customerId, meter_slug: meterSlug });
    const key = freshKey();
    const send = (url: string, extra: Record<string, string> = {}) =>
      t.app.inject({ method: 'POST', url, headers: { ...h, 'content-type': 'application/json', 'idempotency-key': key, ...extra }, payload });

    const first = await send('/v1/requests', { 'x-service-metadata': JSON.stringify({ team: 'a' }) });
    expect(first.statusCode).toBe(201);
    const replay = await send('/v1/requests', { 'x-service-metadata': JSON.stringify({ team: 'a' }) });
    expect(replay.headers['idempotent-replayed']).toBe('true');

    const otherHeader = await send('/v1/requests', { 'x-service-metadata': JSON.stringify({ team: 'b' }) });
    expect(otherHeader.statusCode).toBe(422);
    expect(otherHeader.json().error.code).toBe('idempotency_key_reused');
    const otherQuery = await send(`/v1/requests?metadata=${encodeURIComponent(JSON.stringify({ team: 'a' }))}`, {
      'x-service-metadata': JSON.stringify({ team: 'a' }),
    });
    expect(otherQuery.statusCode).toBe(422);
    const record = (await t.app.inject({ method: 'GET', url: '/v1/requests/idem-meta-1', headers: h })).json();
    expect(record.metadata).toEqual({ team: 'a' });
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
