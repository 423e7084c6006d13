import { Writable } from 'node:stream';
import { sql } from 'kysely';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loggerOptions } from '../../src/http/logging.ts';
import { startTestApp, type TestApp } from '../helpers/app.ts';
import { databasesUnderTest } from '../helpers/databases.ts';

/** A stream that keeps every log line a running app writes. */
function logCapture(): { stream: Writable; lines: () => Record<string, unknown>[]; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk, _encoding, done) {
      chunks.push(String(chunk));
      done();
    },
  });
  const text = () => chunks.join('');
  const lines = () =>
    text()
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { stream, lines, text };
}

const PII = {
  first: 'Augusta',
  last: 'Kingsbury',
  email: 'augusta.kingsbury@blocked.example',
  phone: '+15550123987',
};
const QUERY_SECRET = 'AIzaQuerySecretValue789';

describe.each(databasesUnderTest())('log output of a running app on %s', (dialect) => {
  let t: TestApp;
  let logs: ReturnType<typeof logCapture>;
  let base: string;
  beforeAll(async () => {
    logs = logCapture();
    t = await startTestApp(dialect, { env: { LOG_LEVEL: 'info' }, logStream: logs.stream });
    base = await t.listen();
    // A customer with this e-mail domain fails in the database: an unexpected error, answered 500.
    if (dialect === 'postgres') {
      await sql`alter table connections add constraint test_no_blocked_emails check (email not like '%@blocked.example')`.execute(t.storage.db);
    } else {
      await sql`create trigger test_no_blocked_emails before insert on connections when new.email like '%@blocked.example'
        begin select raise(abort, 'blocked e-mail domain'); end`.execute(t.storage.db);
    }
  });
  afterAll(async () => t?.close());

  it('shows no secret key, query key, or customer personal data, even when a request fails with a 500', async () => {
    const auth = { authorization: `Bearer ${t.merchant.secretKey}` };
    expect((await fetch(`${base}/v1/meters`, { headers: auth })).status).toBe(200);
    const withQuery = await fetch(`${base}/v1/meters?key=${QUERY_SECRET}&metadata=${encodeURIComponent(JSON.stringify({ email: PII.email }))}`, {
      headers: auth,
    });
    expect(withQuery.status).toBeLessThan(500);
    const ok = await fetch(`${base}/v1/customers`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ first_name: PII.first, last_name: PII.last, email: 'someone@example.com', phone: PII.phone }),
    });
    expect(ok.status).toBe(201);
    const failed = await fetch(`${base}/v1/customers`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ name: `${PII.first} ${PII.last}`, email: PII.email, phone: PII.phone }),
    });
    expect(failed.status).toBe(500);
    expect((await failed.json()).error.code).toBe('internal_error');

    // The failure is logged, with what an operator needs: its database error code and a stack.
    const failure = logs.lines().find((l) => l.msg === 'request failed');
    expect(failure).toBeDefined();
    expect(failure!.reqId, 'the line names its request').toEqual(expect.any(String));
    const err = failure!.err as Record<string, unknown>;
    expect(err.code).toBe(dialect === 'postgres' ? '23514' : 'SQLITE_CONSTRAINT_TRIGGER');
    expect(String(err.stack)).toContain('\n');
    expect(err).not.toHaveProperty('detail');
    // Every request was logged, by URL, with its masked query.
    expect(logs.text()).toContain('/v1/meters?key=%5BRedacted%5D');

    const text = logs.text();
    for (const secret of [t.merchant.secretKey, QUERY_SECRET, PII.first, PII.last, PII.email, PII.phone, 'blocked.example']) {
      expect(text, `log output contains ${secret}`).not.toContain(secret);
    }
  });
});

describe.runIf(databasesUnderTest().includes('postgres'))('the error serializer on a PostgreSQL error', () => {
  it('keeps the code and constraint but not the detail, which quotes the failing row', async () => {
    const t = await startTestApp('postgres');
    try {
      await sql`create table logged_people (email text check (email not like '%@blocked.example'))`.execute(t.storage.db);
      const err = await sql`insert into logged_people (email) values (${PII.email})`.execute(t.storage.db).then(
        () => null,
        (e: unknown) => e as Error & { detail?: string },
      );
      // The real error quotes the value...
      expect(err?.detail).toContain(PII.email);

      const logs = logCapture();
      const options = loggerOptions('info', logs.stream);
      if (typeof options !== 'object' || options === null) throw new Error('loggerOptions returned no options');
      const log = pino(options as pino.LoggerOptions, logs.stream);
      log.error({ err: new Error('settlement failed', { cause: err }) }, 'wrapped');
      log.error({ err }, 'direct');
      // ...and the log keeps what identifies it, without the value.
      const [wrapped, direct] = logs.lines();
      expect((direct!.err as Record<string, unknown>).code).toBe('23514');
      expect((direct!.err as Record<string, unknown>).constraint).toBe('logged_people_email_check');
      expect(String((wrapped!.err as Record<string, unknown>).message)).toContain('settlement failed');
      expect(logs.text()).not.toContain(PII.email);
    } finally {
      await t.close();
    }
  });
});
