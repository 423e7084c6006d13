import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const HOOK = 'https://hooks.example.com/tollgate';

describe.each(databasesUnderTest())('webhook management on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  const call = (method: 'GET' | 'POST' | 'PATCH' | 'DELETE', url: string, key: string, payload?: object) =>
    t.app.inject({ method, url, headers: t.auth(key), ...(payload ? { payload } : {}) });

  it('creates a webhook whose secret is shown once, and lists, retrieves, updates and deletes it without the secret', async () => {
    const m = await t.newMerchant();
    const created = await call('POST', '/v1/webhooks', m.secretKey, { name: 'Main', url: HOOK });
    expect(created.statusCode).toBe(201);
    const hook = created.json();
    expect(hook).toMatchObject({ name: 'Main', url: HOOK, events: ['*'], status: 'enabled', disabled_at: null });
    expect(hook.webhook_id).toMatch(/^wh_/);
    expect(hook.webhook_secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);

    const listed = (await call('GET', '/v1/webhooks', m.secretKey)).json();
    expect(listed).toMatchObject({ has_more: false, next_cursor: null });
    expect(listed.data).toHaveLength(1);
    const retrieved = (await call('GET', `/v1/webhooks/${hook.webhook_id}`, m.secretKey)).json();
    for (const shown of [listed.data[0], retrieved]) {
      expect(shown.webhook_id).toBe(hook.webhook_id);
      expect(JSON.stringify(shown)).not.toContain(hook.webhook_secret);
      expect(shown).not.toHaveProperty('webhook_secret');
    }

    const updated = await call('PATCH', `/v1/webhooks/${hook.webhook_id}`, m.secretKey, {
      name: 'Renamed',
      events: ['connection.created', 'customer.deleted'],
    });
    expect(updated.statusCode).toBe(200);
    expect(updated.json()).toMatchObject({ name: 'Renamed', url: HOOK, events: ['connection.created', 'customer.deleted'] });

    const paused = (await call('PATCH', `/v1/webhooks/${hook.webhook_id}`, m.secretKey, { enabled: false })).json();
    expect(paused.status).toBe('disabled');
    const resumed = (await call('PATCH', `/v1/webhooks/${hook.webhook_id}`, m.secretKey, { enabled: true })).json();
    expect(resumed).toMatchObject({ status: 'enabled', disabled_at: null });

    const deleted = await call('DELETE', `/v1/webhooks/${hook.webhook_id}`, m.secretKey);
    expect(deleted.json()).toEqual({ id: hook.webhook_id, deleted: true });
    expect((await call('GET', `/v1/webhooks/${hook.webhook_id}`, m.secretKey)).statusCode).toBe(404);
  });

  it('refuses a fourth webhook with its own code, and has room again after a delete', async () => {
    const m = await t.newMerchant();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await call('POST', '/v1/webhooks', m.secretKey, { name: `h${i}`, url: HOOK })).json().webhook_id);
    const fourth = await call('POST', '/v1/webhooks', m.secretKey, { name: 'h3', url: HOOK });
    expect(fourth.statusCode).toBe(400);
    expect(fourth.json().error.code).toBe('webhook_limit_reached');
    await call('DELETE', `/v1/webhooks/${ids[0]}`, m.secretKey);
    expect((await call('POST', '/v1/webhooks', m.secretKey, { name: 'again', url: HOOK })).statusCode).toBe(201);
  });

  it('never lets concurrent creates pass the limit of 3', async () => {
    const m = await t.newMerchant();
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, i) => call('POST', '/v1/webhooks', m.secretKey, { name: `c${i}`, url: HOOK })),
    );
    expect(answers.filter((a) => a.statusCode === 201)).toHaveLength(3);
    expect(answers.filter((a) => a.json().error?.code === 'webhook_limit_reached')).toHaveLength(3);
  });

  it('keeps each merchant to its own webhooks', async () => {
    const a = await t.newMerchant();
    const b = await t.newMerchant();
    const hook = (await call('POST', '/v1/webhooks', a.secretKey, { name: 'A', url: HOOK })).json();
    expect((await call('GET', `/v1/webhooks/${hook.webhook_id}`, b.secretKey)).statusCode).toBe(404);
    expect((await call('DELETE', `/v1/webhooks/${hook.webhook_id}`, b.secretKey)).statusCode).toBe(404);
    expect((await call('GET', '/v1/webhooks', b.secretKey)).json().data).toEqual([]);
  });

  it('checks the event names: unknown, repeated, or "*" beside others are refused with the path', async () => {
    const m = await t.newMerchant();
    for (const events of [['customer.exploded'], ['customer.created', 'customer.created'], ['*', 'customer.created'], []]) {
      const res = await call('POST', '/v1/webhooks', m.secretKey, { name: 'x', url: HOOK, events });
      expect(res.statusCode, JSON.stringify(events)).toBe(400);
      expect(res.json().error.code).toBe('validation_error');
      expect(res.json().error.issues[0].path[0]).toBe('events');
    }
  });

  it.each([
    ['plain http', 'http://hooks.example.com/'],
    ['another scheme', 'ftp://hooks.example.com/'],
    ['credentials in the URL', 'https://user:pw@hooks.example.com/'],
    ['loopback', 'https://127.0.0.1/'],
    ['10/8', 'https://10.1.2.3/'],
    ['172.16/12', 'https://172.20.0.1/'],
    ['192.168/16', 'https://192.168.1.10/'],
    ['the metadata address', 'https://169.254.169.254/latest/meta-data'],
    ['IPv6 loopback', 'https://[::1]/'],
    ['IPv4-mapped loopback', 'https://[::ffff:127.0.0.1]/'],
    ['a multicast address', 'https://224.0.0.1/'],
    ['a host name that resolves to 127.0.0.1', 'https://localhost:8443/'],
    ['not a URL', 'hooks.example.com'],
  ])('refuses a webhook URL with %s', async (_what, url) => {
    const m = await t.newMerchant();
    const res = await call('POST', '/v1/webhooks', m.secretKey, { name: 'x', url });
    expect(res.statusCode).toBe(400);
    expect(res.json().error).toMatchObject({ code: 'webhook_url_refused', issues: [{ path: ['url'] }] });
    const hook = (await call('POST', '/v1/webhooks', m.secretKey, { name: 'ok', url: HOOK })).json();
    const patched = await call('PATCH', `/v1/webhooks/${hook.webhook_id}`, m.secretKey, { url });
    expect(patched.json().error.code).toBe('webhook_url_refused');
  });

  it('rotates the secret: a new one is shown once and the old one keeps signing for the overlap', async () => {
    const m = await t.newMerchant();
    const hook = (await call('POST', '/v1/webhooks', m.secretKey, { name: 'r', url: HOOK })).json();
    const rotated = await call('POST', `/v1/webhooks/${hook.webhook_id}/rotate_secret`, m.secretKey, { overlap_seconds: 3600 });
    expect(rotated.statusCode).toBe(200);
    const body = rotated.json();
    expect(body.webhook_secret).toMatch(/^whsec_/);
    expect(body.webhook_secret).not.toBe(hook.webhook_secret);
    const until = Date.parse(body.previous_secret_expires_at);
    // An hour past the rotation on the app's clock (which stands still).
    expect(until).toBe(t.clock.now() + 3_600_000);
    const stored = await t.storage.db.selectFrom('webhooks').selectAll().where('id', '=', hook.webhook_id).executeTakeFirstOrThrow();
    expect(stored).toMatchObject({ secret: body.webhook_secret, previous_secret: hook.webhook_secret });
  });

  it('lists no deliveries for a new webhook and answers 404 for an unknown delivery', async () => {
    const m = await t.newMerchant();
    const hook = (await call('POST', '/v1/webhooks', m.secretKey, { name: 'd', url: HOOK })).json();
    expect((await call('GET', `/v1/webhooks/${hook.webhook_id}/deliveries`, m.secretKey)).json()).toEqual({ data: [], has_more: false, next_cursor: null });
    const res = await call('POST', `/v1/webhooks/${hook.webhook_id}/deliveries/whd_nope/redeliver`, m.secretKey);
    expect(res.statusCode).toBe(404);
  });

  it('documents the webhook operations in the OpenAPI document', async () => {
    const doc = (await t.app.inject({ method: 'GET', url: '/v1/openapi.json' })).json();
    for (const path of ['/v1/webhooks', '/v1/webhooks/{id}', '/v1/webhooks/{id}/rotate_secret', '/v1/webhooks/{id}/deliveries', '/v1/webhooks/{id}/deliveries/{delivery_id}/redeliver']) {
      expect(doc.paths[path], path).toBeDefined();
    }
    expect(Object.keys(doc.paths['/v1/webhooks'])).toEqual(expect.arrayContaining(['get', 'post']));
  });
});

describe('webhook URLs in development', () => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp('sqlite', { env: { WEBHOOK_ALLOW_HTTP_LOOPBACK: 'true' } });
  });
  afterAll(async () => t?.close());

  it('allows plain http to loopback when WEBHOOK_ALLOW_HTTP_LOOPBACK is set, and still nothing private', async () => {
    const ok = (url: string) => t.app.inject({ method: 'POST', url: '/v1/webhooks', headers: t.auth(), payload: { name: 'dev', url } });
    expect((await ok('http://127.0.0.1:9999/hook')).statusCode).toBe(201);
    expect((await ok('http://[::1]:9999/hook')).statusCode).toBe(201);
    for (const url of ['http://hooks.example.com/', 'https://10.0.0.1/', 'https://169.254.169.254/']) {
      expect((await ok(url)).json().error.code, url).toBe('webhook_url_refused');
    }
  });
});
