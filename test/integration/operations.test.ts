import { once } from 'node:events';
import { connect, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../../src/app.ts';
import { loadConfig } from '../../src/config.ts';
import { MemoryRateLimiter } from '../../src/http/rate-limit.ts';
import { startServer, type RunningServer } from '../../src/main.ts';
import { openStorage } from '../../src/storage/db.ts';
import { createMerchant } from '../../src/storage/merchants.ts';
import { migrateToLatest } from '../../src/storage/migrate.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest, freshDatabase, runTempDir } from '../helpers/databases.ts';
import { until } from '../helpers/until.ts';

describe.each(databasesUnderTest())('operational endpoints on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  it('GET /healthz answers 200 without an API key', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/healthz' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ok' });
  });

  it('GET /readyz answers 200 naming the database engine', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/readyz' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: 'ready', database: dialect });
  });

  it('GET /readyz answers 503 service_unavailable once the database is gone, while /healthz stays 200', async () => {
    const broken = await startTestApp(dialect, { database: t.database });
    try {
      await broken.storage.close();
      const res = await broken.app.inject({ method: 'GET', url: '/readyz' });
      expect(res.statusCode).toBe(503);
      expect(res.json()).toEqual({ error: { message: expect.any(String), code: 'service_unavailable', status: 503 } });
      expect((await broken.app.inject({ method: 'GET', url: '/healthz' })).statusCode).toBe(200);
    } finally {
      await broken.app.close();
    }
  });

  it('GET /metrics is Prometheus text with the request-duration histogram of answered requests', async () => {
    await t.app.inject({ method: 'GET', url: '/healthz' });
    await t.app.inject({ method: 'GET', url: '/v1/meters', headers: t.auth() });
    const res = await t.app.inject({ method: 'GET', url: '/metrics' });
    expect(res.statusCode).toBe(200);
    expect(String(res.headers['content-type'])).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(res.body).toContain('# TYPE tollgate_http_request_duration_seconds histogram');
    expect(res.body).toMatch(/^tollgate_http_request_duration_seconds_count\{method="GET",route="\/healthz",status="200"\} [1-9]/m);
    expect(res.body).toMatch(/^tollgate_http_request_duration_seconds_count\{method="GET",route="\/v1\/meters",status="200"\} [1-9]/m);
    expect(res.body).toMatch(/^tollgate_process_cpu_user_seconds_total /m);
  });

  it('GET /metrics with METRICS_TOKEN set answers only a scraper that sends the token', async () => {
    const token = 'metrics-token-0123456789';
    const guarded = await startTestApp(dialect, { env: { METRICS_TOKEN: token } });
    try {
      const read = (authorization?: string) =>
        guarded.app.inject({ method: 'GET', url: '/metrics', headers: authorization ? { authorization } : {} });
      for (const refused of [await read(), await read(`Bearer ${token}x`), await read(token), await read(`Bearer ${guarded.merchant.secretKey}`)]) {
        expect(refused.statusCode).toBe(401);
        expect(refused.json().error.code).toBe('unauthorized');
      }
      const allowed = await read(`Bearer ${token}`);
      expect(allowed.statusCode).toBe(200);
      expect(allowed.body).toContain('# TYPE tollgate_http_request_duration_seconds histogram');
    } finally {
      await guarded.close();
    }
  });

  it('GET /v1/openapi.json is an OpenAPI 3.1 document generated from the route schemas', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/v1/openapi.json' });
    expect(res.statusCode).toBe(200);
    expect(String(res.headers['content-type'])).toMatch(/^application\/json/);
    const doc = res.json();
    expect(doc.openapi).toMatch(/^3\.1\./);
    expect(doc.info.title).toEqual(expect.any(String));
    for (const path of ['/v1/meters', '/v1/customers', '/v1/secret_keys', '/v1/connections']) {
      expect(Object.keys(doc.paths)).toContain(path);
    }
    const body = doc.paths['/v1/meters'].post.requestBody.content['application/json'].schema;
    expect(body.properties.rate_type.enum).toEqual(['fixed', 'percentage']);
    expect(body.required).toEqual(expect.arrayContaining(['name', 'rate_type', 'tiers']));
    expect(doc.paths['/v1/meters/{id}'].get.responses['404']).toBeDefined();
    // The pass-through gateway routes have no body schema, but are documented all the same.
    for (const method of ['get', 'post', 'put', 'patch', 'delete']) {
      expect(doc.paths['/v1/forward'][method].parameters).toContainEqual(expect.objectContaining({ name: 'u', required: true }));
    }
    for (const path of ['/v1/chat/completions', '/v1/responses', '/v1/embeddings', '/v1/messages']) {
      expect(doc.paths[path].post.responses['402']).toBeDefined();
    }
    expect(doc.paths['/v1/models'].get).toBeDefined();
    expect(doc.paths['/v1/spend_keys/{id}/rotate'].post).toBeDefined();
    // What the shared hooks do is documented on every standard operation.
    const createMeter = doc.paths['/v1/meters'].post;
    expect(createMeter.parameters).toContainEqual(
      expect.objectContaining({ name: 'Idempotency-Key', in: 'header', required: false, schema: expect.objectContaining({ maxLength: 255 }) }),
    );
    for (const status of ['409', '413', '415', '422']) expect(createMeter.responses[status], status).toBeDefined();
    expect(createMeter.responses['422'].content['application/json'].schema.properties.error).toBeDefined();
    expect(Object.keys(createMeter.responses['201'].headers)).toEqual(
      expect.arrayContaining(['Idempotent-Replayed', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset']),
    );
    expect(Object.keys(createMeter.responses['429'].headers)).toContain('Retry-After');
    const patchMeter = doc.paths['/v1/meters/{id}'].patch;
    expect(patchMeter.responses['415']).toBeDefined();
    expect(patchMeter.parameters.map((p: { name: string }) => p.name)).not.toContain('Idempotency-Key');
    const listMeters = doc.paths['/v1/meters'].get;
    expect(listMeters.responses['415']).toBeUndefined();
    expect(Object.keys(listMeters.responses['200'].headers)).toContain('X-RateLimit-Remaining');
    expect(doc.paths['/v1/secret_keys/{id}'].delete.responses['409'].description).toContain('last_secret_key');
    // Public operations have no API key, so no rate limit.
    expect(doc.paths['/healthz'].get.responses['200'].headers).toBeUndefined();
    // Internal endpoints stay out of the public document.
    expect(Object.keys(doc.paths)).not.toContain('/metrics');
    expect(Object.keys(doc.paths)).not.toContain('/v1/openapi.json');
  });
});

describe('graceful shutdown of startServer', () => {
  function freshConfig() {
    const dir = runTempDir();
    const databaseUrl = `sqlite:${join(dir, 'ops.db')}`;
    return { databaseUrl, config: loadConfig({ PORT: '0', DATABASE_URL: databaseUrl, LOG_LEVEL: 'silent' }) };
  }

  it('answers on its port, then stop() resolves and the port refuses connections', async () => {
    const { config } = freshConfig();
    const server = await startServer(config);
    const url = new URL(server.url);
    expect(url.hostname).toBe('127.0.0.1');
    expect(Number(url.port)).toBeGreaterThan(0);

    const res = await fetch(`${server.url}/healthz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ status: 'ok' });
    expect((await fetch(`${server.url}/readyz`)).status).toBe(200);

    // fetch keeps the connection alive; stop() must not wait on idle sockets.
    await expect(server.stop()).resolves.toBeUndefined();
    await expect(fetch(`${server.url}/healthz`)).rejects.toThrow();
    await expect(canConnect(Number(url.port))).resolves.toBe(false);
  });

  /**
   * Opens a raw connection and sends the headers and the first bytes of a POST, leaving it in
   * progress; returns once the server has taken the request in (its headers are parsed).
   */
  async function beginSlowPost(server: RunningServer, port: number, secretKey: string, body: string) {
    const arrived = once(server.app.server, 'request');
    const socket = connect(port, '127.0.0.1');
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    let text = '';
    const response = new Promise<string>((resolve) => {
      socket.on('data', (chunk) => {
        text += chunk.toString();
        const [head, payload = ''] = text.split('\r\n\r\n');
        const length = Number(/content-length: (\d+)/i.exec(head ?? '')?.[1] ?? NaN);
        if (Buffer.byteLength(payload) >= length) resolve(text);
      });
    });
    socket.write(
      [
        'POST /v1/customers HTTP/1.1',
        `Host: 127.0.0.1:${port}`,
        `Authorization: Bearer ${secretKey}`,
        'Content-Type: application/json',
        `Content-Length: ${Buffer.byteLength(body)}`,
        '',
        '',
      ].join('\r\n') + body.slice(0, 5),
    );
    await arrived;
    return { socket, response, finish: () => socket.write(body.slice(5)) };
  }

  async function serverWithMerchant() {
    const { databaseUrl, config } = freshConfig();
    const server = await startServer(config);
    const side = openStorage(databaseUrl);
    const { secretKey } = await createMerchant(side, { name: 'Shutdown' }, new Date().toISOString());
    await side.close();
    return { server, secretKey, port: Number(new URL(server.url).port) };
  }

  it('lets a request already in progress finish while stopping, refusing new connections meanwhile', async () => {
    const { server, secretKey, port } = await serverWithMerchant();
    const slow = await beginSlowPost(server, port, secretKey, JSON.stringify({ reference_id: 'in-flight' }));

    let stopped = false;
    const stopping = server.stop().then(() => (stopped = true));
    await until(async () => !(await canConnect(port)), 'stop() to close the listening port');
    expect(stopped).toBe(false);

    slow.finish();
    const text = await slow.response;
    expect(text).toMatch(/^HTTP\/1\.1 201 /);
    expect(text).toContain('"reference_id":"in-flight"');
    slow.socket.destroy();
    await stopping;
    expect(stopped).toBe(true);
  });

  it('resolves stop() promptly after the in-flight response even if the client keeps the connection', async () => {
    const { server, secretKey, port } = await serverWithMerchant();
    const slow = await beginSlowPost(server, port, secretKey, JSON.stringify({ reference_id: 'kept-alive' }));
    const stopping = server.stop();
    await until(async () => !(await canConnect(port)), 'stop() to close the listening port');
    slow.finish();
    const text = await slow.response;
    try {
      expect(text).toMatch(/^HTTP\/1\.1 201 /);
      const outcome = await Promise.race([
        stopping.then(() => 'stopped' as const),
        new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), 2_000)),
      ]);
      expect(outcome).toBe('stopped');
    } finally {
      slow.socket.destroy();
      await stopping;
    }
  });
});

describe.each(databasesUnderTest())('requests arriving during shutdown on %s', (dialect) => {
  it('are answered 503 service_unavailable in the envelope with Connection: close', async () => {
    const database = await freshDatabase(dialect);
    const storage = openStorage(database.url);
    await migrateToLatest(storage);
    const { secretKey } = await createMerchant(storage, { name: 'Closing' }, new Date().toISOString());
    const config = loadConfig({ LOG_LEVEL: 'silent', DATABASE_URL: database.url });
    const app = await buildApp({ config, storage, rateLimiter: new MemoryRateLimiter() });
    // Holds shutdown open while the port still accepts, as a slow drain would.
    let releaseShutdown = () => {};
    const shutdownHeld = new Promise<void>((resolve) => (releaseShutdown = resolve));
    app.addHook('preClose', () => shutdownHeld);
    await app.listen({ port: 0, host: '127.0.0.1' });
    const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    const closing = app.close();
    try {
      for (const [method, path] of [['GET', '/healthz'], ['GET', '/v1/meters'], ['POST', '/v1/customers']] as const) {
        const res = await fetch(`${base}${path}`, {
          method,
          headers: { authorization: `Bearer ${secretKey}`, 'content-type': 'application/json' },
          ...(method === 'POST' ? { body: '{}' } : {}),
        });
        expect(res.status).toBe(503);
        expect(res.headers.get('connection')).toBe('close');
        expect(await res.json()).toEqual({ error: { message: expect.any(String), code: 'service_unavailable', status: 503 } });
      }
      // Nothing was created by the refused POST.
      expect(await storage.db.selectFrom('connections').select('id').execute()).toEqual([]);
    } finally {
      releaseShutdown();
      await closing;
      await storage.close();
    }
  });
});

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}
