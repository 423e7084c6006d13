import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { databasesUnderTest } from '../helpers/databases.ts';
import type { MockGateway } from '../helpers/gateway.ts';
import { MOCK_UPSTREAM_HEADER } from '../helpers/mock-upstream.ts';
import { leaksInSuiteLogs, printFigures, startSuiteGateway } from './harness.ts';

/**
 * Fuzz: fast-check inputs over every operation in the OpenAPI document (path parameters, declared
 * query parameters, bodies made of the declared properties or of any JSON or none, odd content
 * types, metadata headers), sent as the merchant. No input may produce a 5xx, and every error is
 * the envelope with its own status. FUZZ_INPUTS sets the total (default 100,000, split between
 * the engines under test; 10,000 outside CI); the count is printed.
 */

const TOTAL_INPUTS = Number(process.env.FUZZ_INPUTS ?? (process.env.CI ? 100_000 : 10_000));
/** Operations fuzzed at once: PostgreSQL round trips of one overlap the work of others. */
const CONCURRENT_OPERATIONS = 4;

type Parameter = { in: 'path' | 'query' | 'header'; name: string };
type Operation = { method: string; path: string; parameters: Parameter[]; properties: string[]; hasBody: boolean };

/** Text that tends to break parsers and storage: NUL, escapes, huge numbers, dates, ids, unicode. */
const awkward = fc.constantFrom(
  '', '\u0000', 'a\u0000b', '\\u0000', '0', '-1', '1e999', '9'.repeat(40), '0.00000000001', 'NaN', 'null', 'true', '[]', '{}',
  '[["a","b"]]', '[["a","\\u0000"]]', '{"a":"b"}', '{"a":{"b":1}}', '2026-01-01', '2026-02-30T25:00:00Z', '2026-01-01T00:00:00+14:00',
  'con_00000000000000000000000000', 'sk_live_x', 'spk_live_x', '%00', '../..', '\\', "'; drop table x; --", 'a'.repeat(300), '\ud800', '🙂',
  'https://api.openai.com/v1/chat/completions', 'http://127.0.0.1:1/x', 'openai/gpt-4o-mini', 'gpt-4o-mini', 'claude-sonnet-4-5',
);
const text = fc.oneof(fc.string({ maxLength: 24 }), fc.string({ unit: 'binary', maxLength: 12 }), awkward);
const scalar = fc.oneof(text, fc.integer(), fc.double(), fc.boolean(), fc.constant(null), fc.bigInt().map(String));
const value = fc.oneof(
  { weight: 4, arbitrary: scalar },
  fc.array(scalar, { maxLength: 4 }),
  fc.dictionary(text, scalar, { maxKeys: 4 }),
  fc.array(fc.record({ start: scalar, rate: scalar }, { requiredKeys: [] }), { maxLength: 3 }),
  fc.jsonValue({ maxDepth: 3 }),
);
/** Printable ASCII: what an HTTP header can carry at all. */
const headerText = fc.oneof(fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)), maxLength: 40 }), awkward.filter((s) => /^[\x20-\x7e]*$/.test(s)));

/** Webhook URLs stay unroutable: a fuzzed endpoint must never make the dispatcher call out. */
const PROPERTY_VALUES: Record<string, fc.Arbitrary<unknown>> = {
  url: fc.constantFrom('http://127.0.0.1:1/hook', 'https://10.0.0.1/hook', 'not a url', '', 'ftp://x'),
};

function bodyOf(op: Operation): fc.Arbitrary<{ payload?: string; contentType?: string }> {
  const declared = fc.record(Object.fromEntries(op.properties.map((p) => [p, PROPERTY_VALUES[p] ?? value])), { requiredKeys: [] });
  const json = fc.oneof({ weight: 5, arbitrary: declared.map((b) => JSON.stringify(b)) }, fc.jsonValue({ maxDepth: 4 }).map((v) => JSON.stringify(v)), text);
  const contentType = fc.oneof({ weight: 6, arbitrary: fc.constant('application/json') }, fc.constantFrom('text/plain', 'application/x-www-form-urlencoded', 'application/json; charset=latin1', 'application/vnd.x+json'));
  return fc.oneof(fc.constant({}), fc.record({ payload: json, contentType }));
}

function requestOf(op: Operation, ids: string[]): fc.Arbitrary<{ url: string; payload?: string; headers: Record<string, string> }> {
  const pathValue = fc.oneof(fc.constantFrom(...ids), text);
  const pathParams = op.parameters.filter((p) => p.in === 'path');
  const queryParams = op.parameters.filter((p) => p.in === 'query');
  return fc
    .record({
      path: fc.tuple(...pathParams.map(() => pathValue)),
      query: fc.tuple(...queryParams.map(() => fc.option(fc.oneof(text, fc.integer().map(String)), { nil: undefined }))),
      body: op.hasBody ? bodyOf(op) : fc.constant({} as { payload?: string; contentType?: string }),
      metadataHeader: fc.option(headerText, { nil: undefined, freq: 4 }),
      idempotencyKey: fc.option(headerText, { nil: undefined, freq: 3 }),
    })
    .map(({ path, query, body, metadataHeader, idempotencyKey }) => {
      let url = op.path;
      pathParams.forEach((p, i) => (url = url.replace(`{${p.name}}`, percentEncoded(path[i]!))));
      const search = queryParams.flatMap((p, i) => (query[i] === undefined ? [] : [`${p.name}=${percentEncoded(query[i]!)}`]));
      const headers: Record<string, string> = {};
      if (body.contentType) headers['content-type'] = body.contentType;
      if (metadataHeader !== undefined) headers['x-service-metadata'] = metadataHeader;
      if (idempotencyKey !== undefined && op.method === 'POST') headers['idempotency-key'] = idempotencyKey;
      return { url: search.length > 0 ? `${url}?${search.join('&')}` : url, payload: body.payload, headers };
    });
}

/** Every byte of the UTF-8 text percent-encoded (a lone surrogate becomes U+FFFD, as on the wire). */
function percentEncoded(s: string): string {
  return [...Buffer.from(s, 'utf8')].map((b) => `%${b.toString(16).padStart(2, '0')}`).join('');
}

function operationsOf(document: { paths: Record<string, Record<string, { parameters?: Parameter[]; requestBody?: { content?: Record<string, { schema?: { properties?: Record<string, unknown> } }> } }>> }): Operation[] {
  return Object.entries(document.paths).flatMap(([path, methods]) =>
    Object.entries(methods).map(([method, op]) => ({
      method: method.toUpperCase(),
      path,
      parameters: op.parameters ?? [],
      properties: Object.keys(op.requestBody?.content?.['application/json']?.schema?.properties ?? {}),
      hasBody: op.requestBody !== undefined,
    })),
  );
}

const engines = databasesUnderTest();

describe.each(engines)('fuzz on %s', (dialect) => {
  let gw: MockGateway;
  beforeAll(async () => {
    gw = await startSuiteGateway(dialect, { env: { LOG_LEVEL: 'warn' } });
  });
  afterAll(async () => {
    await gw?.t.close();
    await gw?.upstream.close();
  });

  it('no input to any documented operation is a 5xx, and every error is the envelope', async () => {
    const { app } = gw.t;
    const operations = operationsOf((await app.inject({ method: 'GET', url: '/v1/openapi.json' })).json());
    const auth = gw.t.auth();
    const post = async (url: string, payload: unknown) => (await app.inject({ method: 'POST', url, headers: auth, payload: payload as object })).json();
    const customer = await post('/v1/customers', { name: 'Fuzz' });
    const meter = await post('/v1/meters', { name: 'Fuzz', rate_type: 'fixed', tier_type: 'requests', tiers: [{ start: 0, rate: '0.01' }] });
    const spendKey = await post('/v1/spend_keys', { name: 'Fuzz' });
    const ids = [customer.customer_id, meter.meter_id, spendKey.spend_key_id].filter((id): id is string => typeof id === 'string');
    expect(ids).toHaveLength(3);

    const runsPerOperation = Math.ceil(TOTAL_INPUTS / engines.length / operations.length);
    let inputs = 0;
    const statuses = new Map<number, number>();
    const started = Date.now();
    const fuzz = async (op: Operation) => {
      await fc.assert(
        fc.asyncProperty(requestOf(op, ids), async (req) => {
          inputs++;
          const res = await app.inject({
            method: op.method as 'GET',
            url: req.url,
            headers: { ...auth, ...req.headers },
            ...(req.payload === undefined ? {} : { payload: req.payload }),
          });
          statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
          expect(res.statusCode, `${op.method} ${req.url} -> ${res.body.slice(0, 300)}`).toBeLessThan(500);
          // A provider's own error is relayed as it came (decision 0007); only Tollgate's answers must be the envelope.
          if (res.statusCode >= 400 && res.headers[MOCK_UPSTREAM_HEADER] === undefined) {
            const body = res.json();
            // Google's dialect (the native Gemini drop-in, decision 0021): `code` is the HTTP status, the interface's code the reason.
            if (typeof body.error?.code === 'number') {
              expect(body.error).toMatchObject({ code: res.statusCode, message: expect.any(String), status: expect.any(String) });
              expect(body.error.details[0]).toMatchObject({ reason: expect.any(String), metadata: { status: String(res.statusCode) } });
            } else {
              expect(body.error).toMatchObject({ code: expect.any(String), message: expect.any(String), status: res.statusCode });
            }
          }
        }),
        { numRuns: runsPerOperation },
      );
    };
    for (let i = 0; i < operations.length; i += CONCURRENT_OPERATIONS) {
      await Promise.all(operations.slice(i, i + CONCURRENT_OPERATIONS).map(fuzz));
    }
    const serverErrors = [...statuses].filter(([s]) => s >= 500).reduce((n, [, c]) => n + c, 0);
    printFigures(`fuzz (${dialect})`, {
      operations: operations.length,
      inputs,
      server_errors: serverErrors,
      seconds: Math.round((Date.now() - started) / 1000),
      statuses: [...statuses].sort(([a], [b]) => a - b).map(([s, c]) => `${s}:${c}`).join(','),
    });
    expect(serverErrors).toBe(0);
  });

  it('logged no secret, key or e-mail address', () => {
    expect(leaksInSuiteLogs().leaks).toEqual([]);
  });
});
