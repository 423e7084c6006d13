import { readFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import type { InjectOptions } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ERRORS, type ErrorCode } from '../../src/http/errors.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

const validMeter = { name: 'Chat tokens', rate_type: 'fixed', tiers: [{ start: 0, rate: '2.5' }] };
const MIB = 1024 * 1024;

type Case = {
  name: string;
  request: (t: TestApp) => InjectOptions;
  status: number;
  code: ErrorCode;
  /** For validation errors: paths that must appear among the issues. */
  issuePaths?: string[][];
};

const json = (t: TestApp) => ({ ...t.auth(), 'content-type': 'application/json' });

const cases: Case[] = [
  {
    name: 'malformed JSON',
    request: (t) => ({ method: 'POST', url: '/v1/meters', headers: json(t), payload: '{"name": "x",' }),
    status: 400,
    code: 'invalid_json',
  },
  {
    name: 'a JSON body that is not JSON at all',
    request: (t) => ({ method: 'POST', url: '/v1/customers', headers: json(t), payload: "{name: 'x'}" }),
    status: 400,
    code: 'invalid_json',
  },
  {
    name: 'a field of the wrong type',
    request: (t) => ({ method: 'POST', url: '/v1/meters', headers: json(t), payload: { ...validMeter, name: 42 } }),
    status: 400,
    code: 'validation_error',
    issuePaths: [['name']],
  },
  {
    name: 'an unknown enum value',
    request: (t) => ({ method: 'POST', url: '/v1/meters', headers: json(t), payload: { ...validMeter, rate_type: 'flat' } }),
    status: 400,
    code: 'validation_error',
    issuePaths: [['rate_type']],
  },
  {
    name: 'a nested field of the wrong type',
    request: (t) => ({
      method: 'POST',
      url: '/v1/customers',
      headers: json(t),
      payload: { metadata: { plan: 7 } },
    }),
    status: 400,
    code: 'validation_error',
    issuePaths: [['metadata', 'plan']],
  },
  {
    name: 'a JSON array where an object belongs',
    request: (t) => ({ method: 'POST', url: '/v1/meters', headers: json(t), payload: '[1, 2]' }),
    status: 400,
    code: 'validation_error',
  },
  {
    name: 'a query parameter out of range',
    request: (t) => ({ method: 'GET', url: '/v1/meters?limit=abc', headers: t.auth() }),
    status: 400,
    code: 'validation_error',
    issuePaths: [['limit']],
  },
  {
    name: 'an unknown route under /v1',
    request: (t) => ({ method: 'GET', url: '/v1/no_such_thing', headers: t.auth() }),
    status: 404,
    code: 'route_not_found',
  },
  {
    name: 'an unknown route outside /v1',
    request: () => ({ method: 'GET', url: '/nope?x=1' }),
    status: 404,
    code: 'route_not_found',
  },
  {
    name: 'an unrouted method on a known path',
    request: (t) => ({ method: 'PUT', url: '/v1/meters', headers: json(t), payload: {} }),
    status: 405,
    code: 'method_not_allowed',
  },
  {
    name: 'an unrouted method on a known path with an id',
    request: (t) => ({ method: 'POST', url: '/v1/customers/con_01ARZ3NDEKTSV4RRFFQ69G5FAV', headers: json(t), payload: {} }),
    status: 405,
    code: 'method_not_allowed',
  },
  ...(
    [
      ['GET', '/v1/meters/met_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['PATCH', '/v1/meters/met_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['DELETE', '/v1/meters/met_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['GET', '/v1/customers/con_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['PATCH', '/v1/customers/con_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['DELETE', '/v1/customers/con_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
      ['GET', '/v1/connections/not-an-id'],
      ['DELETE', '/v1/secret_keys/sk_01ARZ3NDEKTSV4RRFFQ69G5FAV'],
    ] as const
  ).map(
    ([method, url]): Case => ({
      name: `an unknown id (${method} ${url.split('/').slice(0, 3).join('/')}/:id)`,
      request: (t) => ({ method, url, headers: json(t), ...(method === 'PATCH' ? { payload: { name: 'x' } } : {}) }),
      status: 404,
      code: 'not_found',
    }),
  ),
  ...['text/plain', 'application/x-www-form-urlencoded', 'application/xml', 'multipart/form-data; boundary=x'].map(
    (type): Case => ({
      name: `a POST body of type ${type.split(';')[0]}`,
      request: (t) => ({
        method: 'POST',
        url: '/v1/customers',
        headers: { ...t.auth(), 'content-type': type },
        payload: JSON.stringify({ reference_id: 'x' }),
      }),
      status: 415,
      code: 'unsupported_media_type',
    }),
  ),
  {
    name: 'a body over 10 MiB with a Content-Length',
    request: (t) => ({ method: 'POST', url: '/v1/customers', headers: json(t), payload: 'x'.repeat(10 * MIB + 1) }),
    status: 413,
    code: 'payload_too_large',
  },
  {
    name: 'a streamed body over 10 MiB without a Content-Length',
    request: (t) => ({
      method: 'POST',
      url: '/v1/customers',
      headers: { ...json(t), 'transfer-encoding': 'chunked' },
      payload: Readable.from(Array.from({ length: 11 }, () => Buffer.alloc(MIB, 0x20))),
    }),
    status: 413,
    code: 'payload_too_large',
  },
  {
    name: 'a missing API key',
    request: () => ({ method: 'GET', url: '/v1/meters' }),
    status: 401,
    code: 'unauthorized',
  },
  ...(
    [
      ['in a body field', 'POST', '/v1/meters', { ...validMeter, name: 'Chat\u0000tokens' }, ['name']],
      ['in a nested body field', 'POST', '/v1/customers', { metadata: { plan: 'p\u0000' } }, ['metadata', 'plan']],
      ['in a body key', 'POST', '/v1/customers', { metadata: { 'pl\u0000an': 'pro' } }, ['metadata', 'pl\u0000an']],
      ['in a query parameter', 'GET', '/v1/customers?reference_id=a%00b', undefined, ['reference_id']],
      ['in a path id', 'GET', '/v1/meters/met_%00', undefined, ['id']],
      ['in a secret key name', 'POST', '/v1/secret_keys', { name: '\u0000' }, ['name']],
    ] as const
  ).map(
    ([where, method, url, payload, path]): Case => ({
      name: `a NUL character ${where}`,
      request: (t) => ({ method, url, headers: json(t), ...(payload ? { payload } : {}) }),
      status: 400,
      code: 'validation_error',
      issuePaths: [[...path]],
    }),
  ),
  {
    name: 'an Idempotency-Key over 255 characters',
    request: (t) => ({
      method: 'POST',
      url: '/v1/customers',
      headers: { ...json(t), 'idempotency-key': 'k'.repeat(256) },
      payload: {},
    }),
    status: 400,
    code: 'validation_error',
    issuePaths: [['headers', 'idempotency-key']],
  },
];

/** No stack frames, file paths or error internals in a response body. */
function expectNoInternals(body: string): void {
  expect(body).not.toMatch(/stack/i);
  expect(body).not.toMatch(/\n\s*at\s/);
  expect(body).not.toMatch(/\bat\s+\S+\s+\(?\S+:\d+:\d+\)?/);
  expect(body).not.toMatch(/node_modules|\/src\/|FST_ERR/);
}

function expectEnvelope(res: { statusCode: number; body: string; headers: Record<string, unknown> }, code: ErrorCode) {
  expect(res.statusCode).toBeLessThan(500);
  expect(String(res.headers['content-type'])).toMatch(/^application\/json/);
  expectNoInternals(res.body);
  const parsed = JSON.parse(res.body) as { error: Record<string, unknown> };
  expect(Object.keys(parsed)).toEqual(['error']);
  const { error } = parsed;
  const expectedKeys = code === 'validation_error' ? ['code', 'issues', 'message', 'status'] : ['code', 'message', 'status'];
  expect(Object.keys(error).sort()).toEqual(expectedKeys);
  expect(error.code).toBe(code);
  expect(error.status).toBe(res.statusCode);
  expect(error.status).toBe(ERRORS[code].status);
  expect(typeof error.message).toBe('string');
  expect((error.message as string).length).toBeGreaterThan(0);
  if (code === 'validation_error') {
    const issues = error.issues as unknown[];
    expect(issues.length).toBeGreaterThan(0);
    for (const issue of issues) {
      expect(Object.keys(issue as object).sort()).toEqual(['message', 'path']);
      const { path, message } = issue as { path: unknown; message: unknown };
      expect(Array.isArray(path) && path.every((p) => typeof p === 'string')).toBe(true);
      expect(typeof message).toBe('string');
    }
  }
  return error as { code: string; status: number; message: string; issues?: { path: string[]; message: string }[] };
}

describe.each(databasesUnderTest())('error envelope on %s', (dialect) => {
  let t: TestApp;
  beforeAll(async () => {
    t = await startTestApp(dialect);
  });
  afterAll(async () => t?.close());

  it.each(cases.map((c) => [c.name, c] as const))('answers %s with its code in the envelope, never a 500', async (_name, c) => {
    const res = await t.app.inject(c.request(t));
    expect(res.statusCode).toBe(c.status);
    const error = expectEnvelope(res, c.code);
    for (const path of c.issuePaths ?? []) {
      expect(error.issues?.map((i) => i.path)).toContainEqual(path);
    }
  });

  it('answers over real HTTP with the same envelope for malformed JSON and an unknown route', async () => {
    const base = await t.listen();
    const bad = await fetch(`${base}/v1/meters`, {
      method: 'POST',
      headers: json(t),
      body: '{"name":',
    });
    expect(bad.status).toBe(400);
    expectEnvelope({ statusCode: bad.status, body: await bad.text(), headers: { 'content-type': bad.headers.get('content-type') } }, 'invalid_json');
    const missing = await fetch(`${base}/v1/nope`, { headers: t.auth() });
    expect(missing.status).toBe(404);
    expectEnvelope(
      { statusCode: missing.status, body: await missing.text(), headers: { 'content-type': missing.headers.get('content-type') } },
      'route_not_found',
    );
  });

  it('accepts a JSON content type with an empty body as a request without a body', async () => {
    const empty = (url: string) => t.app.inject({ method: 'POST', url, headers: json(t), payload: '' });
    const customer = await empty('/v1/customers');
    expect(customer.statusCode).toBe(201);
    expect(customer.json().customer_id).toMatch(/^con_/);
    const key = await empty('/v1/secret_keys');
    expect(key.statusCode).toBe(201);
    expect(key.json().name).toBe('Secret key');

    // A route that needs a body reports the missing body as a validation error, not as bad JSON.
    const meter = await empty('/v1/meters');
    expect(meter.statusCode).toBe(400);
    expectEnvelope(meter, 'validation_error');

    // Deletes with the same header answer JSON too.
    const del = await t.app.inject({
      method: 'DELETE',
      url: `/v1/customers/${customer.json().customer_id}`,
      headers: json(t),
      payload: '',
    });
    expect(del.statusCode).toBe(200);
    expect(del.json()).toEqual({ success: true });
  });

  it('names the methods a known path accepts in the Allow header of a 405', async () => {
    const cases: [string, string, string][] = [
      ['PUT', '/v1/meters', 'GET, HEAD, POST'],
      ['POST', '/v1/meters/met_01ARZ3NDEKTSV4RRFFQ69G5FAV/', 'DELETE, GET, HEAD, PATCH'],
      ['DELETE', '/v1/secret_keys', 'GET, HEAD, POST'],
      ['POST', '/healthz', 'GET, HEAD'],
    ];
    for (const [method, url, allow] of cases) {
      const res = await t.app.inject({ method: method as 'PUT', url, headers: json(t), payload: '{}' });
      expect(res.statusCode, `${method} ${url}`).toBe(405);
      expect(res.headers.allow).toBe(allow);
      expectEnvelope(res, 'method_not_allowed');
    }
    // A path no route has stays a 404 whatever the method.
    const unknown = await t.app.inject({ method: 'PUT', url: '/v1/meterz', headers: t.auth() });
    expect(unknown.statusCode).toBe(404);
    expectEnvelope(unknown, 'route_not_found');
  });

  it.each(['application/json; charset=utf-8', 'application/json;charset=UTF-8', 'Application/JSON; Charset=UTF-8', 'application/merge-patch+json; charset=utf-8'])(
    'accepts the JSON content type %s on a POST with a body, an empty POST and a DELETE',
    async (type) => {
      const headers = { ...t.auth(), 'content-type': type };
      const withBody = await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: JSON.stringify({ metadata: { plan: 'pro' } }) });
      expect(withBody.statusCode).toBe(201);
      expect(withBody.json().metadata).toEqual({ plan: 'pro' });

      const empty = await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: '' });
      expect(empty.statusCode).toBe(201);

      const del = await t.app.inject({ method: 'DELETE', url: `/v1/customers/${empty.json().customer_id}`, headers, payload: '' });
      expect(del.statusCode).toBe(200);
      expect(del.json()).toEqual({ success: true });

      const malformed = await t.app.inject({ method: 'POST', url: '/v1/customers', headers, payload: '{"metadata":' });
      expectEnvelope(malformed, 'invalid_json');
    },
  );

  it('answers a malformed percent-escape in the path with the envelope', async () => {
    const res = await t.app.inject({ method: 'GET', url: '/v1/meters/%E0%A4%A', headers: t.auth() });
    expect(res.statusCode).toBe(404);
    expectEnvelope(res, 'route_not_found');
  });

  it('answers an id over the router parameter limit with the envelope', async () => {
    const res = await t.app.inject({ method: 'GET', url: `/v1/customers/${'x'.repeat(101)}`, headers: t.auth() });
    expect(res.statusCode).toBeLessThan(500);
    expect([400, 404]).toContain(res.statusCode);
    expect(res.json().error).toBeDefined();
  });
});

describe('docs/errors.md', () => {
  it('lists every code of ERRORS with its status, and no other code', () => {
    const text = readFileSync(new URL('../../docs/errors.md', import.meta.url), 'utf8');
    const lines = text.split('\n');
    const header = lines.findIndex((l) => /^\|\s*code\s*\|\s*status\s*\|\s*meaning\s*\|\s*$/.test(l));
    expect(header).toBeGreaterThanOrEqual(0);
    const documented = new Map<string, number>();
    for (const line of lines.slice(header + 2)) {
      if (!line.startsWith('|')) break;
      const cells = line.split('|').slice(1, -1).map((c) => c.trim());
      expect(cells).toHaveLength(3);
      const [code, status, meaning] = cells as [string, string, string];
      const name = code.replace(/`/g, '');
      expect(documented.has(name), `${name} is listed twice`).toBe(false);
      documented.set(name, Number(status));
      expect(meaning.length).toBeGreaterThan(0);
    }
    const expected = new Map(Object.entries(ERRORS).map(([code, { status }]) => [code, status]));
    expect(Object.fromEntries(documented)).toEqual(Object.fromEntries(expected));
  });
});
