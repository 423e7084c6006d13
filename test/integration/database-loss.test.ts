import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databaseBehindProxy, type DatabaseBehindProxy, type TcpProxy } from '../helpers/tcp-proxy.ts';
import { until } from '../helpers/until.ts';

/**
 * Losing PostgreSQL is an outage, not a crash (decision 0019): terminated connections and
 * an unreachable server give 503 `service_unavailable` with Retry-After in the envelope (never a
 * 500, never a hung request, never an exit), /readyz reports it, and service resumes by itself.
 * Real PostgreSQL; the app reaches it through a loopback proxy that the test cuts and restores.
 */

const postgres = process.env.TEST_DATABASE_URL;
const APP_NAME = `tollgate-dbloss-${process.pid}`;
/** A 503 must come within this (the pool's connect timeout is 5 s; a refused port fails at once). */
const ANSWER_BOUND_MS = 8_000;

type Answer = { status: number; retryAfter: string | null; body: { error?: { code: string; status: number; message: string } }; ms: number };

describe.runIf(postgres)('database loss on postgres', () => {
  let behind: DatabaseBehindProxy;
  let proxy: TcpProxy;
  let t: TestApp;
  let base: string;

  beforeAll(async () => {
    behind = await databaseBehindProxy(APP_NAME);
    proxy = behind.proxy;
    t = await startTestApp('postgres', { database: behind.database });
    base = await t.listen();
  });
  afterAll(async () => {
    await t?.close();
    await behind?.close();
  });

  const call = async (method: 'GET' | 'POST', path: string, body?: unknown): Promise<Answer> => {
    const started = Date.now();
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { ...t.auth(), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return { status: res.status, retryAfter: res.headers.get('retry-after'), body: await res.json(), ms: Date.now() - started };
  };
  const terminateAppConnections = () => behind.terminateConnections();

  /** Every answer is a success or a clean 503; the 503s carry the envelope and Retry-After. */
  const expectSuccessOrOutage = (answers: Answer[]) => {
    for (const a of answers) {
      expect([200, 201, 503], JSON.stringify(a.body)).toContain(a.status);
      if (a.status === 503) {
        expect(a.body.error).toMatchObject({ code: 'service_unavailable', status: 503 });
        expect(a.retryAfter).toBe('1');
      }
      expect(a.ms).toBeLessThan(ANSWER_BOUND_MS);
    }
  };

  /** Polls until a call succeeds: service resumes without a restart. */
  const resumes = (path: string) =>
    until(
      async () => {
        const a = await call('GET', path);
        if (a.status === 200) return a;
        expect(a.status).toBe(503);
        return undefined;
      },
      `${path} to recover`,
      { intervalMs: 50, timeoutMs: 10_000 },
    );

  it('survives its idle connections being terminated, and answers the next requests', async () => {
    await Promise.all(Array.from({ length: 8 }, () => call('GET', '/v1/customers')));
    expect(await terminateAppConnections()).toBeGreaterThan(0);
    const after = await Promise.all(Array.from({ length: 8 }, () => call('GET', '/v1/customers')));
    expectSuccessOrOutage(after);
    await resumes('/v1/customers');
  });

  it('answers 200 or 503 while its connections are terminated mid-load', async () => {
    const load = Promise.all(
      Array.from({ length: 60 }, (_, i) => (i % 2 === 0 ? call('GET', '/v1/customers') : call('POST', '/v1/customers', { name: `c${i}` }))),
    );
    await terminateAppConnections();
    await new Promise((r) => setImmediate(r));
    await terminateAppConnections();
    expectSuccessOrOutage(await load);
    await resumes('/v1/customers');
  });

  it('while the server is unreachable: 503 with Retry-After at once, /readyz says so; then resumes by itself', async () => {
    await proxy.cut();
    try {
      const answers = await Promise.all([
        call('GET', '/v1/customers'),
        call('POST', '/v1/customers', { name: 'during the outage' }),
        call('GET', '/v1/usage?start=2026-01-01'),
      ]);
      expectSuccessOrOutage(answers);
      expect(answers.map((a) => a.status)).toEqual([503, 503, 503]);
      const ready = await call('GET', '/readyz');
      expect(ready.status).toBe(503);
      expect(ready.body.error?.code).toBe('service_unavailable');
      expect((await call('GET', '/healthz')).status).toBe(200);
    } finally {
      await proxy.restore();
    }
    await resumes('/readyz');
    await resumes('/v1/customers');
  });
});
